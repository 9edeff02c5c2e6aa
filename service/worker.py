"""The process boundary: one device worker process per engine, fed through shared memory.

kp holds the GIL for a whole ``eval`` and has no locks, so device work never runs in the HTTP process.
The worker process owns the Engine; the HTTP side (``DeviceWorker``, used on the event loop) keeps a
bounded queue, copies each request's tensors into a shared-memory slot (a file in /dev/shm mapped by
both processes), sends a small pickled job through a pipe and awaits the reply. A queued job whose
client left or timed out is dropped before it reaches the device; when every slot is taken the
service is busy (503). If the worker dies, its in-flight jobs fail and it is started again.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import mmap
import multiprocessing as mp
import os
import pickle
import re
import tempfile
import threading
from collections import OrderedDict, deque
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from . import framing
from .buckets import bucket
from .config import Settings
from .cpu_placement import PROCESS_CPUS, choose_cpu, set_thread_cpus, unpinned_executor
from .errors import Busy, DeviceFailure, VkactError
from .operators import OperatorDesc

log = logging.getLogger("vkact.worker")
ALIGN = 64
OPS_CACHED = 1024      # descriptors the worker keeps unpickled, by their bytes
BATCH_BYTES = 1 << 20  # inputs up to this size may be batched (larger ones gain nothing from it)
WATCH_INTERVAL_S = 1.0  # how often the HTTP side looks for a job stuck on the device
IN_FLIGHT = 2          # jobs handed to the worker at once: one running, one ready to start
TEMPLATES = 256        # job templates (see _TemplateIds) each side keeps
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Mapping:
    """A file-backed shared mapping; the creator unlinks the file, mappings stay valid until closed."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        self.path, self.size = path, size
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                # Reserve the pages now: a sparse file in a full /dev/shm (Docker's default is 64 MB)
                # would SIGBUS the first process to touch them instead of failing here, cleanly.
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    os.unlink(path)
                    raise Busy(
                        f"no room for a {size}-byte tensor slot in {SHM_DIR} ({exc.strerror}); "
                        "give the service more shared memory (docker run --shm-size=2g)"
                    ) from None
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.mm, np.uint8)

    def close(self) -> None:
        del self.array
        try:
            self.mm.close()
        except BufferError:  # a view still lives (a logged traceback's frame): unmapped when it dies
            pass


@dataclass
class _Slot:
    mapping: _Mapping
    busy: bool = False


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22), or None if there
    is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_tag(pid: int) -> str:
    """PID-START: a process and when it started, which together name it across pid reuse."""
    return f"{pid}-{_started(pid) or 0}"


# vkact-PID-START-N (a tensor slot) and vkact-regions-PID-START.json (a server's shared-memory
# registrations): the process that made the file, and when it started
_OWNED_NAME = re.compile(r"vkact-(?:regions-)?(\d+)-(\d+)(?:-\d+|\.json)")


def sweep_stale_files(directory: str = SHM_DIR) -> list[str]:
    """Remove the files of processes that are gone: one killed (SIGKILL, OOM) cannot remove its own,
    and a Kubernetes memory-backed /dev/shm outlives container restarts, so slots would pile up until
    none fits, and a registry would hand a restarted server its predecessor's registrations. A file
    belongs to a live process only if one with its pid started when its name says (a restarted
    container's process often has the same pid). Returns the removed paths."""
    removed = []
    for name in os.listdir(directory):
        match = _OWNED_NAME.fullmatch(name)
        if match is None or _started(int(match[1])) == int(match[2]):
            continue
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # gone already, or not ours to remove
            pass
    return removed


class SlotPool:
    """At most ``count`` slots; a slot grows (is replaced by a bigger file) when a request needs it."""

    def __init__(self, count: int, on_forget) -> None:
        self.count = count
        self.slots: list[_Slot] = []
        self._names = itertools.count()
        self._prefix = f"vkact-{owner_tag(os.getpid())}-"
        self._on_forget = on_forget
        for path in sweep_stale_files():
            log.warning("removed %s, left in shared memory by a process that is gone", path)

    def acquire(self, nbytes: int) -> _Slot:
        free = [s for s in self.slots if not s.busy]
        fitting = [s for s in free if s.mapping.size >= nbytes]
        if fitting:
            slot = min(fitting, key=lambda s: s.mapping.size)
        elif len(self.slots) < self.count or free:
            if free:  # replace the smallest free slot by a bigger one
                old = min(free, key=lambda s: s.mapping.size)
                self.slots.remove(old)
                self._destroy(old)
            slot = _Slot(_Mapping(os.path.join(SHM_DIR, f"{self._prefix}{next(self._names)}"), bucket(nbytes), True))
            self.slots.append(slot)
        else:
            raise Busy("the device queue is full; retry shortly")
        slot.busy = True
        return slot

    @property
    def in_use(self) -> int:
        return sum(s.busy for s in self.slots)

    def _destroy(self, slot: _Slot) -> None:
        os.unlink(slot.mapping.path)
        slot.mapping.close()
        self._on_forget(slot.mapping.path)

    def close(self) -> None:
        for slot in self.slots:
            self._destroy(slot)
        self.slots.clear()


LARGE = 1 << 20  # copies above this size run in a thread (numpy releases the GIL) to keep the loop free


async def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    if src.nbytes > LARGE:
        await asyncio.to_thread(np.copyto, dst, src)
    else:
        dst[...] = src


Template = tuple[bytes, str, int, tuple[tuple[int, int], ...], tuple[int, int], bool]  # key, slot path and size, inputs, output, in place


class _TemplateIds:
    """Numbers for job templates: what a lone job says to the worker besides its tensors' bytes (its
    pickled descriptor, its slot, where its tensors lie in it). A serving client repeats requests of
    one shape, and a slot goes back to the next request, so one template serves request after
    request: the first job of a template sends it, numbered, and later ones send only the number
    (a "go": see framing), which the worker answers by replaying what it did for the first one.
    At most ``limit`` numbers; a new template takes a number given back (its slot was replaced) or
    the least recently used one, and its definition replaces the old one in the worker."""

    def __init__(self, limit: int = TEMPLATES) -> None:
        self._ids: OrderedDict[Template, int] = OrderedDict()
        self._free: list[int] = []
        self._limit = limit

    def number(self, template: Template) -> tuple[int, bool]:
        """The template's number, and whether it is new (the worker must be told the template first)."""
        tid = self._ids.get(template)
        if tid is not None:
            self._ids.move_to_end(template)
            return tid, False
        if self._free:
            tid = self._free.pop()
        elif len(self._ids) < self._limit:
            tid = len(self._ids)
        else:
            tid = self._ids.popitem(last=False)[1]
        self._ids[template] = tid
        return tid, True

    def drop_slot(self, path: str) -> None:
        """Forget the templates of a slot that is gone (the worker forgets them with its mapping)."""
        for template in [t for t in self._ids if t[1] == path]:
            self._free.append(self._ids.pop(template))


class _Window:
    """Room for the messages handed to the worker and not answered yet (IN_FLIGHT at most): taken
    without a coroutine by a job that finds room (asyncio.Semaphore would cost a coroutine and an
    any() over its waiters), waited for by the dispatcher, its only waiter."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._opened: asyncio.Future[None] | None = None

    def take(self) -> None:
        assert self.free > 0
        self.free -= 1

    async def acquire(self) -> None:
        while self.free == 0:
            self._opened = asyncio.get_running_loop().create_future()
            await self._opened
        self.free -= 1

    def release(self) -> None:
        self.free += 1
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)


@dataclass
class Result:
    output: memoryview          # the output buffer inside the slot; valid until release()
    kernel_seconds: float       # of the dispatch, shared by the jobs of a batch
    queue_seconds: float
    _job: Any = field(repr=False)
    batch_size: int = 1         # jobs that ran in the same dispatch

    def release(self) -> None:
        """Hand the slot back once the output has been read."""
        self.output.release()
        self._job.release()


@dataclass
class _Job:
    id: int
    op: OperatorDesc
    slot: _Slot
    inputs: list[tuple[int, int]]
    output: tuple[int, int]
    in_place: bool
    future: asyncio.Future = field(repr=False)
    key: bytes = b""  # the pickled descriptor: what crosses to the worker, and its plan cache key
    batchable: bool = False  # may run in one dispatch with the jobs of the same key queued beside it
    waiting: Callable[[int], None] | None = field(default=None, repr=False)  # told +1 queued, -1 out of the queue
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float = 0.0
    released: bool = False

    @property
    def template(self) -> Template:
        """What the worker needs besides the job's id (see _TemplateIds)."""
        return (self.key, self.slot.mapping.path, self.slot.mapping.size, tuple(self.inputs), self.output, self.in_place)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.slot.busy = False


class DeviceWorker:
    """The HTTP process's handle on one device worker process. Use from the event loop only."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.info: dict[str, Any] | None = None      # the worker's ready report (device, limits)
        self.restarts = 0
        self.dispatched = 0                          # jobs handed to the worker process
        self.batches = 0                             # messages that carried them
        self._ids = itertools.count()
        self._queue: deque[_Job] = deque()
        self._queued = asyncio.Event()               # set while the queue holds a job
        self._inflight: dict[int, _Job] = {}
        self._inflight_batches = 0
        self._window = _Window(IN_FLIGHT)
        self._pool = SlotPool(settings.queue_size + IN_FLIGHT, self._forget)
        self._templates = _TemplateIds()
        self._proc: mp.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._reader: framing.Reader | None = None
        self._ready = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._closing = False
        self.pinned_cpu: int | None = None           # the event loop's CPU, when pinned

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def idle(self) -> bool:
        """A job submitted now goes straight to the device, without queueing."""
        return not self._queue and self._window.free > 0 and self._ready.is_set()

    @property
    def queue_depth(self) -> int:
        return self._pool.in_use

    def start(self) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that may hold Vulkan state or threads
        parent, child = ctx.Pipe()
        self._conn = parent
        self._reader = framing.Reader(parent.fileno())
        self._templates = _TemplateIds()  # a new worker knows none
        cpu = choose_cpu(self.settings.pin_cpu, self.settings.workers)
        self._proc = ctx.Process(target=_worker_main, args=(child, self.settings.model_dump(), cpu, PROCESS_CPUS), name="vkact-device", daemon=True)
        self._proc.start()
        child.close()
        loop = asyncio.get_running_loop()
        loop.add_reader(parent.fileno(), self._on_message)
        loop.add_reader(self._proc.sentinel, self._on_exit)
        if self._dispatcher is None:
            self._dispatcher = asyncio.create_task(self._dispatch(), name="vkact-dispatch")
        if self._watchdog is None:
            self._watchdog = loop.call_later(WATCH_INTERVAL_S, self._watch)

    def _watch(self) -> None:
        """Kill a worker whose oldest job has been on the device for longer than device_timeout_s: a
        hung device or driver must not hold the service. Its jobs fail, readiness drops until the
        restarted worker reports, and the queue moves again (Kubernetes stops routing here meanwhile)."""
        if self._closing:
            return
        self._watchdog = asyncio.get_running_loop().call_later(WATCH_INTERVAL_S, self._watch)
        if not self._inflight or self._proc is None or not self._proc.is_alive():
            return
        running = time.perf_counter() - min(job.started_at for job in self._inflight.values())
        if running > self.settings.device_timeout_s:
            log.error("a job has been on the device for %.0f s (device_timeout_s %g): killing the device worker", running, self.settings.device_timeout_s)
            self._proc.kill()  # _on_exit fails its jobs and starts another

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def close(self) -> None:
        self._closing = True
        if self._dispatcher:
            self._dispatcher.cancel()
        if self._watchdog:
            self._watchdog.cancel()
        loop = asyncio.get_running_loop()
        if self._proc is not None:
            loop.remove_reader(self._proc.sentinel)
            if self._conn is not None:
                loop.remove_reader(self._conn.fileno())
                try:
                    framing.send(self._conn.fileno(), "stop")
                except OSError:
                    pass
            await asyncio.get_running_loop().run_in_executor(None, self._proc.join, 5)
            if self._proc.is_alive():
                self._proc.kill()
        self._pool.close()

    # -- requests -----------------------------------------------------------------------------------

    async def run(
        self, op: OperatorDesc, inputs: list[np.ndarray], in_place: bool, key: bytes | None = None, waiting: Callable[[int], None] | None = None
    ) -> Result:
        """Queue ``op`` on the device; raises Busy when the queue is full. ``key`` is ``op`` pickled
        (``pickled(op)``), for callers that keep it: the worker caches descriptors and their
        recorded command buffers by it. ``waiting`` is told +1 when the job has to wait in the queue
        and -1 when it leaves the queue (to the device, or dropped)."""
        sizes = [a.nbytes for a in inputs]
        offsets, cursor = [], 0
        for n in sizes:
            offsets.append((cursor, n))
            cursor = _align(cursor + n)
        out_bytes = op.output.total_bytes
        output = offsets[0] if in_place else (cursor, out_bytes)
        slot = self._pool.acquire(max(1, output[0] + output[1], cursor))
        job = _Job(next(self._ids), op, slot, offsets, output, in_place, asyncio.get_running_loop().create_future(), key or pickled(op))
        try:
            for (offset, n), data in zip(offsets, inputs):
                if n > LARGE:
                    await copy_into(slot.mapping.array[offset : offset + n], data)
                else:  # in place: no coroutine for a small copy
                    slot.mapping.array[offset : offset + n] = data
        except BaseException:
            job.release()
            raise
        if self.idle:
            self._window.take()
            self._send([job])
        else:  # queued: it may run in one dispatch with others of its descriptor
            job.batchable = self.settings.max_batch > 1 and sum(sizes) <= BATCH_BYTES and op.concatenable
            job.waiting = waiting
            if waiting is not None:
                waiting(1)
            self._queue.append(job)
            self._queued.set()
        try:
            kernel_seconds, batch_size = await job.future
        except BaseException:
            if job.id not in self._inflight:  # not on the device: the slot is free again
                job.release()
            raise
        offset, n = job.output
        return Result(
            memoryview(slot.mapping.mm)[offset : offset + n],
            kernel_seconds,
            job.started_at - job.queued_at,
            job,
            batch_size,
        )

    async def _dispatch(self) -> None:
        while True:
            if not self._queue:
                self._queued.clear()
                await self._queued.wait()
                continue
            job = self._queue.popleft()
            batch = []
            if not job.future.done():  # else cancelled while queued: it never reaches the device
                await self._window.acquire()
                await self._ready.wait()
                if job.future.done():
                    self._window.release()
                else:
                    batch = [job, *self._companions(job)]
                    self._send(batch)
            for j in batch or [job]:  # out of the queue only now: to the device, or dropped
                if j.waiting is not None:
                    j.waiting(-1)

    def _companions(self, job: _Job) -> list[_Job]:
        """The jobs right behind ``job`` in the queue that run in its dispatch: the same descriptor,
        small, up to max_batch in all (dynamic batching: one submission and one message for many
        requests when they arrive faster than the device answers them one by one)."""
        batch: list[_Job] = []
        while job.batchable and self._queue and len(batch) + 1 < self.settings.max_batch:
            nxt = self._queue[0]
            if nxt.future.done():  # dropped, here as in _dispatch
                self._queue.popleft()
                if nxt.waiting is not None:
                    nxt.waiting(-1)
                continue
            if not nxt.batchable or nxt.key != job.key:
                break
            batch.append(self._queue.popleft())
        return batch

    def _send(self, batch: list[_Job]) -> None:
        """Hand ``batch`` (jobs of one descriptor, or a single job) to the worker process in one
        message; the caller holds a place in the in-flight window for it."""
        started = time.perf_counter()
        for job in batch:
            job.started_at = started
            self._inflight[job.id] = job
        self.dispatched += len(batch)
        self.batches += 1
        self._inflight_batches += 1
        try:
            assert self._conn is not None
            if len(batch) == 1:
                job = batch[0]
                template = job.template
                tid, new = self._templates.number(template)
                go = framing.encode_compact("go", job.id, tid)
                framing.write(self._conn.fileno(), framing.encode("template", tid, template) + go if new else go)
            else:
                framing.send(self._conn.fileno(), "run", [(j.id, *j.template) for j in batch])
        except OSError as exc:  # the worker is gone; _on_exit fails the jobs
            log.warning("sending %d job(s) failed: %s", len(batch), exc)

    def _forget(self, path: str) -> None:
        self._templates.drop_slot(path)
        if self._conn is not None and self._proc is not None and self._proc.is_alive():
            try:
                framing.send(self._conn.fileno(), "forget", path)
            except OSError:
                pass

    def _on_message(self) -> None:
        """The worker's messages that one read brings (the descriptor is readable: it does not block)."""
        assert self._conn is not None and self._reader is not None
        try:
            messages = self._reader.ready()
        except (EOFError, OSError):
            asyncio.get_running_loop().remove_reader(self._conn.fileno())
            return
        for msg in messages:
            self._handle(msg)

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "ready":
            self.info = msg[1]
            self._pin_loop(self.info["pinned_cpu"])
            self._ready.set()
            log.info("device worker ready: %s", self.info["device"]["name"])
            return
        self._inflight_batches -= 1
        self._window.release()
        # "ok": a replayed job's (id, kernel seconds); "done": a reply per job, each (id, "done", kernel
        # seconds, batch size) or (id, "error", ...)
        replies = [(msg[1], "done", msg[2], 1)] if kind == "ok" else msg[1]
        for reply in replies:
            job = self._inflight.pop(reply[0], None)
            if job is None:
                continue
            if job.future.done():  # the client left while the device worked
                job.release()
            elif reply[1] == "done":
                job.future.set_result((reply[2], reply[3]))
            else:
                _, _, cls, message, fieldname = reply
                job.release()
                job.future.set_exception(_error(cls, message, fieldname))

    def _pin_loop(self, cpu: int | None) -> None:
        """Put the event loop on the CPU of the worker's job thread (see cpu_placement), once."""
        if cpu is None or self.pinned_cpu == cpu:
            return
        loop = asyncio.get_running_loop()
        if self.pinned_cpu is None:
            loop.set_default_executor(unpinned_executor())
        if set_thread_cpus({cpu}):
            self.pinned_cpu = cpu
            log.info("event loop and device job thread on CPU %d", cpu)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._proc is not None and self._conn is not None
        loop.remove_reader(self._proc.sentinel)
        loop.remove_reader(self._conn.fileno())
        code = self._proc.exitcode
        self._ready.clear()
        for job in self._inflight.values():
            job.release()
            if not job.future.done():
                job.future.set_exception(DeviceFailure(f"the device worker exited (code {code}) while running this request"))
        for _ in range(self._inflight_batches):
            self._window.release()
        self._inflight.clear()
        self._inflight_batches = 0
        if self._closing:
            return
        self.restarts += 1
        log.error("device worker exited with code %s; restarting (restart %d)", code, self.restarts)
        loop.call_later(min(0.1 * 2 ** min(self.restarts, 6), 5.0), self.start)


def pickled(op: OperatorDesc) -> bytes:
    """The bytes that name ``op`` to the worker (equal descriptors pickle equal within one process)."""
    return pickle.dumps(op, framing.PROTOCOL)


def _error(cls: str, message: str, fieldname: str | None) -> VkactError:
    from . import errors

    kind = getattr(errors, cls, None)
    if isinstance(kind, type) and issubclass(kind, VkactError):
        err = kind.__new__(kind)
        VkactError.__init__(err, message, fieldname)
        return err
    return DeviceFailure(message, fieldname)


# -- the worker process -----------------------------------------------------------------------------


class _Engines:
    """The worker's engines and what it keeps of its jobs: descriptors unpickled by their bytes, and
    the engine each runs on. On llvmpipe a second engine, made with LP_NUM_THREADS=0, takes the
    one-workgroup dispatches: its submit thread runs the workgroup itself, where the first engine's
    hands it to its compute pool (one broadcast wake-up for all of the pool's threads) and waits
    for it (measured: 23 us a 1,024-element dispatch against 56). Larger dispatches keep the pool."""

    def __init__(self, main, small=None) -> None:
        self.main, self.small = main, small
        self._ops: OrderedDict[bytes, tuple[OperatorDesc, Any]] = OrderedDict()
        self._templates: dict[int, Template] = {}                  # by number (see _TemplateIds)
        self._replays: dict[int, Callable[[], float | None]] = {}  # what a template's first job did, to redo

    def load_shaders(self) -> int:
        if self.small is not None:
            self.small.load_shaders()
        return self.main.load_shaders()

    def close(self) -> None:
        for engine in (self.small, self.main):
            if engine is not None:
                engine.close()

    def op(self, key: bytes) -> tuple[OperatorDesc, Any]:
        """The descriptor pickled as ``key`` and the engine that runs it alone."""
        found = self._ops.get(key)
        if found is None:
            op = pickle.loads(key)
            found = self._ops[key] = (op, self._engine_for(op))
            if len(self._ops) > OPS_CACHED:
                self._ops.popitem(last=False)
        return found

    def _engine_for(self, op: OperatorDesc) -> Any:
        if self.small is None:
            return self.main
        try:
            return self.small if self.main.dispatch_workgroups(op) == 1 else self.main
        except VkactError:  # not runnable: the main engine says why when it is run
            return self.main

    def define(self, tid: int, template: Template) -> None:
        self._templates[tid] = template
        self._replays.pop(tid, None)

    def go(self, mappings: dict[str, _Mapping], job_id: int, tid: int) -> bytes:
        """Run a job of template ``tid`` with the bytes now in its slot; the reply, encoded. The first
        job of a template runs as any job does, and leaves a replayer: its checks, look-ups and views
        done once (perf sched in the service: the job thread's CPU per 1,024-element request, mostly
        cache misses after the HTTP side ran on the same CPU, 95 -> 68 us)."""
        replay = self._replays.get(tid)
        if replay is not None:
            try:
                seconds = replay()
            except Exception:  # noqa: BLE001 - run again below, which reports the error
                seconds = None
                del self._replays[tid]
            if seconds is not None:
                return framing.encode_compact("ok", job_id, seconds)
        template = self._templates.get(tid)
        if template is None:  # never sent, or sent to a worker before this one: a bug, not the request's
            log.error("job %d names template %d, which this worker was never given", job_id, tid)
            return framing.encode("done", [(job_id, "error", "DeviceFailure", "device failure: the job's template is unknown", None)])
        reply = self._run_one(mappings, (job_id, *template))
        if reply[1] == "done":
            key, path, size, inputs, output, in_place = template
            op, engine = self.op(key)
            try:
                self._replays[tid] = engine.replayer(op, *_buffers(mappings, path, size, inputs, output), key, in_place)
            except VkactError:  # nothing to replay (an empty tensor dispatches nothing): it runs whole each time
                pass
        return framing.encode("done", [reply])

    def forget(self, mappings: dict[str, _Mapping], path: str) -> None:
        """Unmap a slot that the HTTP side replaced, with the templates on it and their views."""
        for tid in [t for t, template in self._templates.items() if template[1] == path]:
            del self._templates[tid]
            self._replays.pop(tid, None)
        mapping = mappings.pop(path, None)
        if mapping is not None:
            mapping.close()

    def run_jobs(self, mappings: dict[str, _Mapping], jobs: list) -> list[tuple]:
        """Run one message's jobs, one reply each. Several jobs (one descriptor) run as one dispatch;
        if that fails, each runs alone, so that every job gets its own answer."""
        if len(jobs) > 1:
            try:
                return self._run_batch(mappings, jobs)
            except Exception:  # noqa: BLE001 - each job is tried alone below and answers for itself
                log.exception("a batch of %d jobs failed; running them one by one", len(jobs))
        return [self._run_one(mappings, job) for job in jobs]

    def _run_one(self, mappings: dict[str, _Mapping], job: tuple) -> tuple:
        job_id, key, path, size, inputs, output, in_place = job
        try:
            ins, out = _buffers(mappings, path, size, inputs, output)
            op, engine = self.op(key)
            before = engine.stats.kernel_seconds
            engine.execute(op, ins, in_place=in_place, out=out, key=key)
            return (job_id, "done", engine.stats.kernel_seconds - before, 1)
        except VkactError as exc:
            return (job_id, "error", type(exc).__name__, exc.message, exc.field)
        except Exception as exc:  # noqa: BLE001 - reported to the request, the worker stays up
            log.exception("job %d failed", job_id)
            return (job_id, "error", "DeviceFailure", f"device failure: {exc}", None)

    def _run_batch(self, mappings: dict[str, _Mapping], jobs: list) -> list[tuple]:
        """Jobs of one descriptor (the HTTP side batches only equal keys) in one dispatch, on the main
        engine (a batch is larger than its jobs). Their views of the mappings die with this frame, so
        a later 'forget' can unmap them."""
        key = jobs[0][1]
        pairs = [_buffers(mappings, path, size, inputs, output) for _, _, path, size, inputs, output, _ in jobs]
        before = self.main.stats.kernel_seconds
        self.main.execute_batch(self.op(key)[0], pairs, key)
        seconds = self.main.stats.kernel_seconds - before
        return [(job[0], "done", seconds, len(jobs)) for job in jobs]


def _buffers(mappings: dict[str, _Mapping], path: str, size: int, inputs, output: tuple[int, int]) -> tuple[list[np.ndarray], np.ndarray]:
    """A job's input and output bytes: views of its slot, mapped on first use."""
    mapping = mappings.get(path)
    if mapping is None:
        mapping = mappings[path] = _Mapping(path, size, False)
    array = mapping.array
    return [array[o : o + n] for o, n in inputs], array[output[0] : output[0] + output[1]]


def _make_engine(make: Callable[[Settings], Any], config: Settings, cpus: frozenset[int], inline: bool = False) -> Any:
    """An Engine, made in a short-lived thread at ``worker_nice`` on ``cpus``: niceness and affinity
    are per thread on Linux and the threads a driver starts inherit both, so a CPU driver's threads
    (lavapipe's) yield to the HTTP process while this process's own thread, which takes jobs and
    submits them, keeps the default priority (measured, 8 clients of 1,024-element requests on 2
    cores: 1.5x the requests/s of a wholly niced worker). ``inline``: llvmpipe without a compute pool
    (LP_NUM_THREADS=0, read when its device is made), for one-workgroup dispatches."""
    made: list[Any] = []

    def build() -> None:
        os.nice(config.worker_nice)
        set_thread_cpus(cpus)
        saved = os.environ.get("LP_NUM_THREADS")
        if inline:
            os.environ["LP_NUM_THREADS"] = "0"
        try:
            made.append(make(config))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the worker's thread
            made.append(exc)
        finally:
            if inline and saved is None:
                del os.environ["LP_NUM_THREADS"]
            elif inline:
                os.environ["LP_NUM_THREADS"] = saved

    thread = threading.Thread(target=build, name="vkact-engine-init")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    made[0].adopt()  # the worker's thread uses it from now on
    return made[0]


def _worker_main(conn: Connection, settings: dict, cpu: int | None = None, cpus: frozenset[int] = frozenset()) -> None:
    """The device worker: ``cpu`` is the HTTP side's choice for the small-request path (see
    cpu_placement: taken on a CPU device under 'auto'), ``cpus`` all of the service's CPUs."""
    from .engine import Engine  # kp is imported here, in the worker process only

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = Settings(**settings)
    cpus = cpus or PROCESS_CPUS
    set_thread_cpus(cpus)  # a worker restarted by a pinned event loop starts on that loop's CPU only
    engine = _make_engine(Engine, config, cpus)
    device = engine.device
    if cpu is not None and config.pin_cpu == "auto" and not device.is_cpu:
        cpu = None  # 'auto' pins on a CPU device only (measured there; a GPU's driver threads are its own)
    if cpu is not None and not set_thread_cpus({cpu}):
        cpu = None
    small = None
    if device.is_cpu and device.driver_name == "llvmpipe":
        small = _make_engine(Engine, config, frozenset({cpu}) if cpu is not None else cpus, inline=True)
    engines = _Engines(engine, small)
    variants = engines.load_shaders()
    fd = conn.fileno()
    framing.send(fd, "ready", {
        "device": device.as_dict(),
        "memory": engine.memory,
        "max_tensor_bytes": engine.max_tensor_bytes,
        "max_workgroup_count": engine.max_workgroup_count,
        "local_size": engine.settings.local_size,
        "shader_variants": variants,
        "pid": os.getpid(),
        "pinned_cpu": cpu,
        "small_dispatch_engine": small is not None,
    })
    mappings: dict[str, _Mapping] = {}
    reader = framing.Reader(fd)
    while True:
        try:
            msg = reader.next()
        except EOFError:  # the HTTP process is gone
            break
        if msg[0] == "stop":
            break
        if msg[0] == "go":
            framing.write(fd, engines.go(mappings, msg[1], msg[2]))
        elif msg[0] == "template":
            engines.define(msg[1], msg[2])
        elif msg[0] == "forget":
            engines.forget(mappings, msg[1])
        else:  # "run": a batch
            framing.send(fd, "done", engines.run_jobs(mappings, msg[1]))
    engines.close()
