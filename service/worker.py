"""The HTTP process's side of the process boundary: a handle on one device worker process.

kp holds the GIL for a whole ``eval`` and has no locks, so device work never runs in the HTTP process.
The worker process (``service.worker_process``) owns the Engine; the HTTP side (``DeviceWorker``, used
on the event loop) keeps a bounded queue, copies each request's tensors into a shared-memory slot
(``service.slots``), sends a small job (``service.jobs``) through a pipe (``service.framing``) and awaits the reply. A
queued job whose client left or timed out is dropped before it reaches the device; when every slot is
taken the service is busy (503). What the worker's replies do to the jobs is ``service.worker_replies``.
If the worker dies, its in-flight jobs fail and it is started again (``service.worker_lifecycle``: the
worker process's start, watchdog, close and restart).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import time
from collections.abc import Callable, Sequence

import numpy as np

from . import framing
from .config import Settings
from .graph_program import GraphPlan
from .jobs import LARGE, Facts, GraphResult, Job, Repeatable, Result, Source, copy_into, descriptor_key, lay_out
from .limits import BATCH_BYTES, OPS_CACHED
from .operators import OperatorDesc
from .worker_replies import WorkerReplies

log = logging.getLogger("vkact.worker")


class DeviceWorker(WorkerReplies):
    """The HTTP process's handle on one device worker process. Use from the event loop only."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.dispatched = 0                          # jobs handed to the worker process
        self.batches = 0                             # messages that carried them
        self._ids = itertools.count()
        #: a model's own batch limit (load_model with a config, the server's: dataplane.batching), None
        #: where it has none; never above max_batch
        self.model_batch_limit: Callable[[type[OperatorDesc]], int | None] = lambda op: None
        self._facts: dict[bytes, Facts] = {}       # by canonical key, OPS_CACHED at most

    # -- batching -----------------------------------------------------------------------------------

    @property
    def max_batch(self) -> int:
        """Jobs per dispatch: the setting, or the device's default (the worker's ready report)."""
        return self.settings.max_batch or (self.info["max_batch"] if self.info else 1)

    def batch_limit(self, op: type[OperatorDesc]) -> int:
        """Jobs of ``op`` per dispatch: its model's limit where one was set, never above max_batch."""
        own = self.model_batch_limit(op)
        return self.max_batch if own is None else min(own, self.max_batch)

    @property
    def idle(self) -> bool:
        """A job submitted now goes straight to the device, without queueing."""
        return not self._queue and self._window.free > 0 and self._ready.is_set()

    @property
    def queue_depth(self) -> int:
        return self._pool.in_use

    # -- requests -----------------------------------------------------------------------------------

    async def run(
        self, op: OperatorDesc, inputs: Sequence[np.ndarray | Source], in_place: bool, key: bytes | None = None,
        waiting: Callable[[int], None] | None = None,
    ) -> Result:
        """Queue ``op`` on the device; raises Busy when the queue is full. An input is its bytes, or a
        Source that writes them into the job's slot (and may raise a request's error meanwhile). ``key`` is ``op`` pickled
        (``descriptor_key(op)``), for callers that keep it: the worker caches descriptors and their
        recorded command buffers by it. ``waiting`` is told +1 when the job has to wait in the queue
        and -1 when it leaves the queue (to the device, or dropped)."""
        job = self._new_job(op, inputs, in_place, key)  # filled and run_filled inline: two coroutine frames fewer a request
        await self._fill(job, inputs)
        kernel_seconds, batch_size = await self._submit(job, sum(a.nbytes for a in inputs), waiting)
        return self.result(job, kernel_seconds, batch_size)

    async def filled(self, op: OperatorDesc, inputs: Sequence[np.ndarray | Source], in_place: bool, key: bytes | None = None,
                     admit: Callable[[int], bool] | None = None) -> Job | None:
        """``run``'s first half: ``op``'s job, its slot taken (Busy when none is left) and ``inputs`` written
        into it (the slot given back if that fails), not sent. Hand it to ``run_filled``; a caller that
        does not must ``release()`` it. For inputs read from a client's socket at its pace
        (service/http_body.py), which the request timeout does not cover. ``admit`` is asked with the size
        of the slot taken (the smallest free one that fits, which may be far larger than the job) before
        anything is written: False gives the slot back and returns None."""
        job = self._new_job(op, inputs, in_place, key)
        if admit is not None and not admit(job.slot.mapping.size):
            job.release()
            return None
        await self._fill(job, inputs)
        return job

    async def run_filled(self, job: Job, input_bytes: int, waiting: Callable[[int], None] | None = None) -> Result:
        """``run``'s second half: a ``filled`` job sent (or queued) and its Result awaited; cancelled, the
        slot is freed once the device is done with it, as for ``run``."""
        kernel_seconds, batch_size = await self._submit(job, input_bytes, waiting)
        return self.result(job, kernel_seconds, batch_size)

    def _new_job(self, op: OperatorDesc, inputs: Sequence[np.ndarray | Source], in_place: bool, key: bytes | None) -> Job:
        """``op``'s job on ``inputs``, its slot taken (Busy when none is left), nothing written yet."""
        key = key or descriptor_key(op)
        facts = self._facts_of(op, key)
        offsets, cursor = lay_out([a.nbytes for a in inputs], 0)
        output = offsets[0] if in_place else (cursor, facts.output_bytes)
        slot = self._pool.acquire(max(1, output[0] + output[1], cursor))
        return Job(next(self._ids), op, slot, offsets, output, in_place, self._future(), key, concatenable=facts.concatenable)

    def _facts_of(self, op: OperatorDesc, key: bytes) -> Facts:
        facts = self._facts.get(key)
        if facts is None:
            facts = self._facts[key] = Facts(op)
            if len(self._facts) > OPS_CACHED:
                del self._facts[next(iter(self._facts))]
        return facts

    def result(self, job: Job, kernel_seconds: float, batch_size: int) -> Result:
        """The Result of ``job``, answered with what its future holds (kernel seconds, batch size)."""
        offset, n = job.output
        return Result(memoryview(job.slot.mapping.mm)[offset : offset + n], kernel_seconds, job.started_at - job.queued_at, job, batch_size)

    # -- the direct HTTP path's entry (dataplane.execution.start): no coroutine where nothing waits --

    def repeatable(self, op: OperatorDesc, key: bytes, in_place: bool, spans: Sequence[tuple[int, int, int]]) -> Repeatable | None:
        """The Repeatable of ``op`` on inputs laid out as ``spans`` (see Repeatable); None where an input is
        larger than LARGE (its copy belongs in a thread: ``run``)."""
        if any(total > LARGE for _, _, total in spans):
            return None
        return Repeatable(op, key, in_place, spans, self._facts_of(op, key))

    def submit_repeat(self, rep: Repeatable, tensors: memoryview) -> Job | None:
        """``run``'s job handed to the worker process at once, where ``run`` would not wait on anything (the
        worker idle: the job is not queued), its inputs copied from ``tensors`` (a request's tensor bytes,
        laid out as ``rep`` says) here. Its future gets what ``run`` awaits, (kernel seconds, batch size):
        pass them to ``result``; cancelling the future drops the answer (the slot is freed when the worker
        is done with it, as for a cancelled ``run``). None, and nothing done, where ``run`` must decide;
        Busy when no slot is left. It raises only before the job is sent (its callers take an exception
        for "nothing sent" and run the request again on ``run``): ``_send_lone`` answers its own failures.
        The direct HTTP path's entry (dataplane.execution.start): a sequential request's every step here
        is on its latency, so ``rep`` keeps what is the same from request to request."""
        if not self.idle:
            return None
        slot = rep.slot
        if slot is None or not self._pool.take(slot):
            slot = rep.slot = self._pool.acquire(rep.slot_bytes)
            rep.numbered = None
        view = slot.mapping.view
        try:
            for at, n, total, offset in rep.copies:
                view[offset : offset + n] = tensors[at : at + n]
                if n < total:
                    view[offset + n : offset + total] = bytes(total - n)
        except BaseException:
            slot.busy = False
            raise
        job = Job(next(self._ids), rep.op, slot, rep.inputs, rep.output, rep.in_place, self._future(), rep.key, concatenable=rep.concatenable)
        self._window.take()
        numbered, templates = rep.numbered, self._templates
        if numbered is not None and numbered[0] is templates and numbered[1] == templates.version:
            tid, definition = numbered[2], b""
        else:
            tid, definition = self._number(job)
            rep.numbered = (templates, templates.version, tid)  # the version after numbering (it may evict)
        self._send_lone(job, tid, definition)
        return job

    async def run_graph(self, plan: GraphPlan, inputs: Sequence[np.ndarray | Source], key: bytes | None = None) -> GraphResult:
        """Queue a compiled graph (``GraphCompiler.compile``; compile it off the event loop, e.g. in
        a thread: glslang runs there) on its inputs, one per graph input in index order; raises Busy
        when the queue is full, the plan's errors as ``run`` does. ``key`` is ``pickle.dumps(plan)``
        for callers that keep it (the plan crosses to the worker as these bytes)."""
        sizes = [a.nbytes for a in inputs]
        offsets, cursor = lay_out(sizes, 0)
        outputs, end = lay_out([plan.graph.output_desc(j).total_bytes for j in range(plan.graph.OutputCount)], cursor)
        slot = self._pool.acquire(max(1, end))
        job = Job(next(self._ids), None, slot, offsets, (0, 0), False, self._future(),
                   graph=key or pickle.dumps(plan, framing.PROTOCOL), outputs=tuple(outputs))
        await self._fill(job, inputs)
        kernel_seconds, _ = await self._submit(job, sum(sizes), None)
        mm = memoryview(slot.mapping.mm)
        return GraphResult([mm[o : o + n] for o, n in outputs], kernel_seconds, job.started_at - job.queued_at, job)

    async def _fill(self, job: Job, inputs: Sequence[np.ndarray | Source]) -> None:
        array = job.slot.mapping.array
        try:
            for (offset, n), data in zip(job.inputs, inputs):
                if not isinstance(data, np.ndarray):  # read by the source itself (a shared memory region)
                    await data.fill(array[offset : offset + n])
                elif n > LARGE:
                    await copy_into(array[offset : offset + n], data)
                else:  # in place: no coroutine for a small copy
                    array[offset : offset + n] = data
        except BaseException:
            job.release()
            raise

    async def _submit(self, job: Job, input_bytes: int, waiting: Callable[[int], None] | None) -> tuple[float, int]:
        """Send ``job`` now (the device is idle) or queue it; its (kernel seconds, batch size)."""
        if self.idle:
            self._window.take()
            self._send([job])
        else:  # queued: it may run in one dispatch with others of its descriptor
            job.batch_limit = self.batch_limit(type(job.op)) if job.op is not None else 1
            job.batchable = job.op is not None and job.batch_limit > 1 and input_bytes <= BATCH_BYTES and job.concatenable
            job.waiting = waiting
            if waiting is not None:
                waiting(1)
            self._queue.append(job)
            self._pump()
        try:
            return await job.future
        except BaseException:
            if job.id not in self._inflight:  # not on the device: the slot is free again
                job.release()
            raise

    def _future(self) -> asyncio.Future:
        loop = self._loop
        return loop.create_future() if loop is not None else asyncio.get_running_loop().create_future()

    def _pump(self) -> None:
        """Hand queued jobs to the worker while the window has room and the worker is ready: called
        where either may have changed (a job queued, answers read, the worker ready), so the next batch
        leaves in the same callback, without a dispatcher task to wake (a task step and a future per
        batch). A job whose client left or timed out while queued never reaches the device."""
        queue = self._queue
        while queue and self._window.free > 0 and self._ready.is_set():
            job = queue.popleft()
            if self._resent_ahead:
                self._resent_ahead -= 1
            batch = []
            if not job.future.done():
                batch = [job, *self._companions(job)]
                self._window.take()
                self._send(batch)
            for j in batch or [job]:  # out of the queue only now: to the device, or dropped
                if j.waiting is not None:
                    j.waiting(-1)

    def _companions(self, job: Job) -> list[Job]:
        """The jobs right behind ``job`` in the queue that run in its dispatch: the same descriptor,
        small, up to max_batch in all (dynamic batching: one submission and one message for many
        requests when they arrive faster than the device answers them one by one)."""
        batch: list[Job] = []
        while job.batchable and self._queue and len(batch) + 1 < job.batch_limit:
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

    def _send(self, batch: list[Job]) -> None:
        """Hand ``batch`` (jobs of one descriptor, or a single job) to the worker process in one
        message; the caller holds a place in the in-flight window for it."""
        if len(batch) == 1 and batch[0].graph is None:
            self._send_lone(batch[0], *self._number(batch[0]))
            return
        started = time.perf_counter()
        for job in batch:
            job.started_at = started
            self._inflight[job.id] = job
        self.dispatched += len(batch)
        self.batches += 1
        self._inflight_batches += 1
        try:
            writer = self._writer
            assert writer is not None
            if batch[0].graph is not None:
                job = batch[0]
                mapping = job.slot.mapping
                writer.send("graph", (job.id, job.graph, mapping.path, mapping.size, tuple(job.inputs), job.outputs))
            else:  # numbers too: a batch's jobs repeat the templates of the jobs before them
                numbered = [self._number(j) for j in batch]
                jobs = framing.encode_batch([(j.id, tid) for j, (tid, _) in zip(batch, numbered)])
                writer.write(b"".join([definition for _, definition in numbered if definition]) + jobs)
        except OSError as exc:  # the worker is gone; _on_exit fails the jobs
            log.warning("sending %d job(s) failed: %s", len(batch), exc)

    def _send_lone(self, job: Job, tid: int, definition: bytes) -> None:
        """``_send([job])`` for a lone job of template number ``tid``, its ``definition`` first where the
        worker does not know it yet (``_number``)."""
        job.started_at = time.perf_counter()
        self._inflight[job.id] = job
        self.dispatched += 1
        self.batches += 1
        self._inflight_batches += 1
        try:
            go = framing.encode_compact("go", job.id, tid)
            self._writer.write(definition + go if definition else go)  # type: ignore[union-attr]
        except OSError as exc:  # the worker is gone; _on_exit fails the job
            log.warning("sending a job failed: %s", exc)

    def _number(self, job: Job) -> tuple[int, bytes]:
        """``job``'s template number, and the message that defines it for the worker when it is new."""
        template = job.template
        tid, new = self._templates.number(template)
        return tid, framing.encode("template", tid, template) if new else b""
