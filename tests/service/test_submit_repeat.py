"""DeviceWorker.submit_repeat, the direct HTTP path's entry (dataplane.execution.start), against a device
worker process that the test plays on the worker's two pipes: every job's template number names, in the
worker, the template of that job's own slot and layout (however the numbers were evicted, slots replaced
or trimmed, the worker restarted, slots shared by connections, jobs timed out while on the device); its
input bytes (zero-padded as /v2 pads a tensor shorter than its buffer) and its answer are the request's,
each request answered once, every slot free again at the end; and an answered request leaves no
reference cycle behind (its connection and body would live until a GC pass)."""
from __future__ import annotations

import asyncio
import gc
import os
import random
import weakref
from types import SimpleNamespace

import numpy as np

from service import framing
from service.config import Settings
from service.dataplane.deadlines import Deadlines
from service.dataplane.execution import start
from service.errors import Busy, Timeout
from service.slots import Mapping
from service.jobs import descriptor_key, TemplateIds
from service.worker import DeviceWorker
from tests.helpers import make_op

SCRIBBLE = 0xAB  # what the played worker leaves in a job's input bytes once it has answered


class _Fd:
    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


class Played:
    """The device worker process on ``worker``'s pipes: the templates it is told, by number (a replaced
    slot's forgotten), as worker_process keeps them; each "go" checked against the job the HTTP side
    sent under that id; ``answer`` runs what was sent (the first input echoed into the output, then the
    inputs scribbled over, as stale bytes for the slot's next request) and replies "ok"."""

    def __init__(self, worker: DeviceWorker, loop: asyncio.AbstractEventLoop, templates: int) -> None:
        self.worker = worker
        jobs_r, jobs_w = os.pipe()
        replies_r, self.replies_w = os.pipe()
        os.set_blocking(jobs_r, False)
        self.fds = (jobs_r, jobs_w, replies_r, self.replies_w)
        self.reader = framing.Reader(jobs_r)
        worker._loop = loop
        worker._writer = framing.Writer(jobs_w, loop)
        worker._reader = framing.Reader(replies_r)
        worker._replies = _Fd(replies_r)  # type: ignore[assignment]
        loop.add_reader(replies_r, worker._on_message)
        worker.info = {"max_tensor_bytes": 1 << 30, "max_batch": 1}
        worker._templates = TemplateIds(templates)
        worker._ready.set()
        self.templates: dict[int, tuple] = {}
        self.mappings: dict[str, Mapping] = {}
        self.wrong: list[tuple] = []
        self.running: list[tuple[int, tuple]] = []

    def take(self) -> None:
        while messages := self.reader.ready():
            for msg in messages:
                if msg[0] == "template":
                    self.templates[msg[1]] = msg[2]
                elif msg[0] == "forget":
                    for tid in [t for t, template in self.templates.items() if template[1] == msg[1]]:
                        del self.templates[tid]
                    if (mapping := self.mappings.pop(msg[1], None)) is not None:
                        mapping.close()
                elif msg[0] == "go":
                    job_id, tid = msg[1], msg[2]
                    named, sent = self.templates.get(tid), self.worker._inflight[job_id].template
                    if named != sent:
                        self.wrong.append((job_id, tid, named, sent))
                    self.running.append((job_id, named or sent))
                else:
                    assert msg[0] == "trim", msg  # one job at a time: no batch (max_batch 1)

    def answer(self, count: int | None = None) -> int:
        self.take()
        done, self.running = self.running[:count], self.running[len(self.running) if count is None else count :]
        for job_id, (_, path, size, inputs, output, in_place) in done:
            mapping = self.mappings.get(path) or self.mappings.setdefault(path, Mapping(path, size, False))
            (at, _), (to, n) = inputs[0], output
            mapping.array[to : to + n] = mapping.array[at : at + n].copy()
            if not in_place:
                for o, k in inputs:
                    mapping.array[o : o + k] = SCRIBBLE
            os.write(self.replies_w, framing.encode_compact("ok", job_id, 0.0))
        return len(done)

    def restart(self) -> None:
        """A new worker process (nothing in flight): it knows no template, and DeviceWorker.start numbers anew."""
        assert not self.running and not self.worker._inflight
        self.templates.clear()
        for mapping in self.mappings.values():
            mapping.close()
        self.mappings.clear()
        self.worker._templates = TemplateIds(self.worker._templates._limit)

    def close(self) -> None:
        self.worker._loop.remove_reader(self.fds[2])  # type: ignore[union-attr]
        for mapping in self.mappings.values():
            mapping.close()
        for fd in self.fds:
            os.close(fd)


async def until(condition, seconds: float = 10.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(poll(), seconds)


def _layouts():
    """(descriptor, spans) of requests a connection repeats: /v2's FLOAT16 tensor of 5 elements is 10
    bytes in a 12-byte buffer (the rest zero), /v1's are their buffers; sizes in two slot buckets."""
    small16 = make_op("IDENTITY", np.float16, (5,))
    shrink = make_op("SHRINK", np.float32, (100,))
    large = make_op("IDENTITY", np.float32, (3000,))
    return [(small16, [(0, 10, 12)]), (shrink, [(0, 400, 400)]), (large, [(0, 12000, 12000)])]


def test_every_repeated_job_names_its_own_template_and_gets_its_own_bytes():
    """A random mix of repeats on five connections (two sharing a layout), other templates through
    ``run`` (evicting numbers: at most 3), slots trimmed, restarts and timeouts; checked as it goes."""
    rng = random.Random(25)

    async def run():
        loop = asyncio.get_running_loop()
        worker = DeviceWorker(Settings(queue_size=4))
        played = Played(worker, loop, templates=3)
        state = SimpleNamespace(worker=worker, deadlines=Deadlines(60.0))
        layouts = _layouts()
        reps = [worker.repeatable(op, descriptor_key(op), False, spans) for op, spans in layouts]
        reps += [worker.repeatable(op, descriptor_key(op), False, spans) for op, spans in layouts[:2]]  # other connections'
        others = [make_op("SHRINK", np.float32, (k,)) for k in range(1, 7)]

        async def through_run(op, x) -> bytes:  # through run, as the task path and the other front-ends
            result = await worker.run(op, [x], False)
            try:
                return bytes(result.output)
            finally:
                result.release()

        submit, number = worker.submit_repeat, worker._number
        counts = {"kept number": 0, "restart": 0, "trimmed": 0}
        numbered = [0]

        def counted_number(job):
            numbered[0] += 1
            return number(job)

        def submit_repeat(rep, tensors):  # a repeat sent under its kept template number: not numbered again
            before = numbered[0]
            job = submit(rep, tensors)
            if job is not None and numbered[0] == before:
                counts["kept number"] += 1
            return job

        worker._number = counted_number  # type: ignore[method-assign]
        worker.submit_repeat = submit_repeat  # type: ignore[method-assign]
        answers: dict[int, list] = {}
        expected: dict[int, bytes] = {}
        tasks = []
        try:
            for step in range(1000):
                action = rng.random()
                if action < 0.45:
                    rep = rng.choice(reps)
                    _, n, total, _ = rep.copies[0]
                    tensors = bytes(rng.getrandbits(8) for _ in range(n))
                    request = step
                    answers[request] = []

                    def answered(result, exc, request=request):
                        answers[request].append(bytes(result.output) if result is not None else exc)
                        if result is not None:
                            result.release()

                    try:
                        sent = start(state, rep, memoryview(tensors), answered, loop)  # type: ignore[arg-type]
                    except Busy:  # every slot taken: the caller's task path answers it (503)
                        sent = False
                    if sent:
                        expected[request] = tensors + bytes(total - n)
                    else:
                        del answers[request]
                elif action < 0.53:
                    op = rng.choice(others)
                    x = np.frombuffer(bytes(rng.getrandbits(8) for _ in range(op.output.total_bytes)), np.uint8)
                    tasks.append((asyncio.ensure_future(through_run(op, x)), x.tobytes()))
                elif action < 0.88:
                    played.answer(rng.choice([1, None, None]))
                elif action < 0.93:
                    before = len(worker._pool.slots)
                    worker._trim()
                    counts["trimmed"] += before - len(worker._pool.slots)
                elif action < 0.97 and (direct := [j for j in worker._inflight.values() if j.on_done is not None]):
                    rng.choice(direct).future.cancel()  # its deadline: the answer is a Timeout, the job still on the device
                elif not played.running and not worker._inflight and not worker._queue:
                    played.restart()
                    counts["restart"] += 1
                await asyncio.sleep(0)
                played.take()
            while played.running or worker._inflight or worker._queue:
                played.answer()
                await asyncio.sleep(0.001)
            await until(lambda: all(answers[r] for r in expected) and all(t.done() for t, _ in tasks))
            ran = [(t.result(), x) for t, x in tasks if not isinstance(t.exception(), Busy)]  # Busy: no slot left for it
            outcomes = {r: answers[r] for r in expected}
            busy = [s for s in worker._pool.slots if s.busy]
            return played.wrong, outcomes, expected, ran, busy, counts
        finally:
            played.close()
            worker._pool.close()

    wrong, outcomes, expected, ran, busy, counts = asyncio.run(run())
    assert wrong == []  # no "go" named another template than its job's
    # the mix did what it is for: repeats under kept numbers among evictions, trims and restarts
    assert len(outcomes) > 150 and counts["kept number"] > 20 and counts["trimmed"] and counts["restart"], counts
    timeouts = 0
    for request, got in outcomes.items():
        assert len(got) == 1, request  # answered once
        if isinstance(got[0], Timeout):
            timeouts += 1
        else:
            assert got[0] == expected[request], request  # its bytes, the padding zero
    assert timeouts > 0
    assert all(got == x for got, x in ran) and len(ran) > 30
    assert busy == []  # every slot free again


def test_an_answered_job_leaves_no_reference_cycle():
    """Without the cyclic GC, everything of an answered request is freed at once (the job, its future,
    and through the answer's callback its connection and body), whichever way it was answered."""
    async def run():
        loop = asyncio.get_running_loop()
        worker = DeviceWorker(Settings(queue_size=4))
        played = Played(worker, loop, templates=8)
        state = SimpleNamespace(worker=worker, deadlines=Deadlines(60.0))
        op, spans = _layouts()[1]
        rep = worker.repeatable(op, descriptor_key(op), False, spans)
        freed = {}
        try:
            for how in ("answered", "timed out"):
                got = []

                def answered(result, exc):
                    got.append(exc)
                    if result is not None:
                        result.release()

                assert start(state, rep, memoryview(bytes(400)), answered, loop)  # type: ignore[arg-type]
                job = next(iter(worker._inflight.values()))
                future = weakref.ref(job.future)
                if how == "timed out":
                    job.future.cancel()
                    await until(lambda: bool(got))
                played.answer()
                await until(lambda: bool(got) and not worker._inflight)
                del job
                await asyncio.sleep(0)
                freed[how] = (future() is None, got)
            return freed
        finally:
            played.close()
            worker._pool.close()

    gc.disable()
    try:
        freed = asyncio.run(run())
    finally:
        gc.enable()
    assert freed["answered"] == (True, [None])
    assert freed["timed out"][0] and isinstance(freed["timed out"][1][0], Timeout)
