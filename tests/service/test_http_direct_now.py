"""The direct path without a task (DirectCycle.start, dataplane.execution.start, DeviceWorker.submit_repeat):
a repeated binary inference whose job can go to an idle worker at once is sent from data_received and
answered from its reply's callback, with the task path's answers and bookkeeping: the same bytes over a
real device worker, a timeout's 504 with its body, a lost worker's 503, a departed client, pipelining
order, statistics counted once. In-process, as test_http_direct (the protocol on a recording transport)."""
from __future__ import annotations

import asyncio
import json
import os
import signal

import numpy as np
import pytest

from client.codec import HEADER_LENGTH
from service.config import Settings
from service.dataplane.deadlines import Deadlines
from service.errors import Busy as BusyError
from service.errors import WorkerLost
from service.http_direct import DirectCycle
from service.operators import parse_operator
from service.jobs import Result
from service.worker import DeviceWorker
from tests.helpers import assert_matches
from tests.service.helpers import binary_request, request_body
from tests.service.test_http_direct import V1, V2, V2_HEAD, Harness, answers, comparable, http, settle, x
from tests.service.test_hot_routes import EchoWorker


class _StubJob:
    def __init__(self, out: np.ndarray, future: asyncio.Future) -> None:
        self.out, self.future, self.released = out, future, False

    def release(self) -> None:
        self.released = True


class FastEcho(EchoWorker):
    """EchoWorker whose jobs go at once (submit_repeat) and are answered when the test says (``reply``)."""

    def __init__(self) -> None:
        self.jobs: list[_StubJob] = []
        self.runs = 0  # jobs through run (the task path)

    async def run(self, op, buffers, in_place, key=None, waiting=None) -> Result:
        self.runs += 1
        return await super().run(op, buffers, in_place, key, waiting)

    def submit_repeat(self, rep, tensors):
        out = np.zeros(rep.op.output.total_bytes, np.uint8)
        at, n, _, _ = rep.copies[0]
        out[:n] = np.frombuffer(tensors[at : at + n], np.uint8)
        job = _StubJob(out, asyncio.get_running_loop().create_future())
        self.jobs.append(job)
        return job

    def result(self, job: _StubJob, kernel_seconds: float, batch_size: int) -> Result:
        return Result(memoryview(job.out), kernel_seconds, 0.0, job, batch_size)

    def reply(self, outcome: Exception | None = None) -> None:
        for job in self.jobs:
            if not job.future.done():
                job.future.set_exception(outcome) if outcome is not None else job.future.set_result((0.0, 1))


async def until(condition, seconds: float = 30.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(poll(), seconds)


async def second_request(harness: Harness, request: bytes):
    """A connection whose first ``request`` (the route: it caches the header) is answered; the repeat
    sent, nothing awaited."""
    proto, transport = harness.connect()
    proto.data_received(request)
    await settle(proto)
    harness.app.runtime.worker.reply()
    await settle(proto)
    proto.data_received(request)
    return proto, transport


@pytest.mark.parametrize("request_bytes", [V2, V1], ids=["v2", "v1"])
def test_a_job_sent_at_once_is_answered_from_its_reply_without_a_task(request_bytes):
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = await second_request(harness, request_bytes)
        sent = (type(proto.cycle) is DirectCycle, len(proto.tasks), len(worker.jobs), worker.runs)
        worker.reply()
        await until(lambda: len(answers(transport.written)) == 2)
        return harness, sent, worker, answers(transport.written)

    harness, sent, worker, got = asyncio.run(run())
    assert sent == (True, 0, 1, 1)  # the repeat: no task, its job sent from data_received
    assert comparable(got[1]) == comparable(got[0]) and got[1][2].endswith(x.tobytes())
    assert all(job.released for job in worker.jobs)
    assert harness.stats().nv_inference_request_success == 2 and harness.stats().nv_inference_request_failure == 0


def test_a_timeout_without_a_task_is_504_with_its_body_and_counted_once():
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        harness.app.runtime.deadlines = Deadlines(0.05)
        proto, transport = await second_request(harness, V2)
        await until(lambda: len(answers(transport.written)) == 2)
        late = worker.jobs[-1].future
        return harness, late.cancelled(), answers(transport.written)[1]

    harness, cancelled, (status, headers, body) = asyncio.run(run())
    assert cancelled  # the worker drops its answer (and frees the slot) when it comes
    assert status == 504 and "within 0.05 s" in json.loads(body)["error"] and len(headers["x-request-id"]) == 32
    assert harness.stats().nv_inference_request_failure == 1 and harness.stats().nv_inference_request_success == 1


def test_a_worker_lost_under_a_job_sent_at_once_is_503_with_retry_after():
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = await second_request(harness, V1)
        worker.reply(WorkerLost("the device worker exited (code -9) while running this request; it is restarting, retry"))
        await until(lambda: len(answers(transport.written)) == 2)
        return harness, answers(transport.written)[1]

    harness, (status, headers, body) = asyncio.run(run())
    assert status == 503 and headers["retry-after"] == "1" and "exited" in json.loads(body)["error"]
    assert harness.stats().nv_inference_request_failure == 1


def test_a_client_gone_before_the_reply_gets_nothing_and_its_job_is_released():
    """As the task path treats a job on an idle device: not watched, run to the end, nothing written."""
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = await second_request(harness, V2)
        before = len(transport.written)
        proto.connection_lost(None)
        worker.reply()
        for _ in range(5):
            await asyncio.sleep(0)
        return len(transport.written) - before, worker.jobs[-1].released, proto.tasks

    written, released, tasks = asyncio.run(run())
    assert written == 0 and released and not tasks


def test_requests_pipelined_behind_a_job_sent_at_once_are_answered_in_order():
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = await second_request(harness, V2)
        tensors = [np.full(12, i, np.float32) for i in range(3)]
        proto.data_received(b"".join(http("/v2/models/identity/infer", V2_HEAD + t.tobytes(), {HEADER_LENGTH: len(V2_HEAD)}) for t in tensors))
        queued = transport.paused and len(proto.pipeline) == 3
        while len(answers(transport.written)) < 5:
            worker.reply()
            await asyncio.sleep(0.001)
        return queued, answers(transport.written), transport.paused, tensors

    queued, got, paused, tensors = asyncio.run(run())
    assert queued and not paused
    assert [status for status, _, _ in got] == [200] * 5
    assert [body[-48:] for _, _, body in got[2:]] == [t.tobytes() for t in tensors]


def test_a_busy_worker_leaves_the_request_to_its_task():
    """Not idle: submit_repeat declines, and the request takes its task as before (queued, watched)."""
    class Busy(FastEcho):
        idle = False

        def submit_repeat(self, rep, tensors):
            return None

    async def run():
        harness = Harness(Busy())
        proto, transport = await second_request(harness, V2)
        tasks = len(proto.tasks)
        await settle(proto)
        return tasks, answers(transport.written)

    tasks, got = asyncio.run(run())
    assert tasks == 1 and [status for status, _, _ in got] == [200, 200]


@pytest.mark.parametrize("slot_freed", [False, True], ids=["still-full", "freed"])
def test_no_slot_for_a_job_sent_at_once_is_left_to_the_task_and_counted_once(slot_freed):
    """submit_repeat's Busy (no slot) comes before anything is sent: the request runs on its task, which
    meets the queue as it is then: one 503 with its body, or the answer, each counted once."""
    class NoSlot(FastEcho):
        def submit_repeat(self, rep, tensors):
            raise BusyError("the device queue is full")

        async def run(self, op, buffers, in_place, key=None, waiting=None):
            if self.runs and not slot_freed:
                self.runs += 1
                raise BusyError("the device queue is full")
            return await super().run(op, buffers, in_place, key, waiting)

    async def run():
        worker = NoSlot()
        harness = Harness(worker)
        proto, transport = await second_request(harness, V2)
        await settle(proto)
        worker.reply()
        await until(lambda: len(answers(transport.written)) == 2)
        return harness, worker, answers(transport.written)

    harness, worker, got = asyncio.run(run())
    assert worker.runs == 2 and not worker.jobs  # the repeat ran once more, on its task; nothing went at once
    stats = harness.stats()
    status, headers, body = got[1]
    if slot_freed:
        assert status == 200 and comparable(got[1]) == comparable(got[0])
        assert (stats.nv_inference_request_success, stats.nv_inference_request_failure) == (2, 0)
    else:
        assert status == 503 and headers["retry-after"] == "1" and "queue is full" in json.loads(body)["error"]
        assert (stats.nv_inference_request_success, stats.nv_inference_request_failure) == (1, 1)


@pytest.mark.timeout(180)
def test_over_a_real_worker_the_answers_are_the_task_paths_and_a_killed_worker_is_503():
    """The bytes of the direct path without a task, with it (the worker kept busy) and of the route,
    over the real device worker; then the worker killed under a job sent at once."""
    rng = np.random.default_rng(11)
    tensors = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]

    async def run():
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            harness = Harness(worker)
            got: dict[str, list] = {}
            kinds: dict[str, list] = {}
            for how in ("now", "task", "route"):
                proto, transport = harness.connect(direct=how != "route")
                kinds[how] = []
                for t in tensors:
                    body, headers = binary_request(request_body("SOFTSIGN", t), t.view(np.uint8))
                    if how == "task":  # the worker seen busy: submit_repeat declines
                        worker._queue.append(None)  # type: ignore[arg-type]
                    try:
                        proto.data_received(http("/v1/execute", body, headers))
                    finally:
                        if how == "task":
                            worker._queue.clear()
                    kinds[how].append((type(proto.cycle) is DirectCycle, len(proto.tasks)))
                    n = len(kinds[how])
                    await settle(proto)
                    await until(lambda: len(answers(transport.written)) == n)
                got[how] = answers(transport.written)
            stats = harness.stats("softsign")
            counted = stats.nv_inference_request_success

            proto, transport = harness.connect()
            body, headers = binary_request(request_body("SOFTSIGN", tensors[0]), tensors[0].view(np.uint8))
            os.kill(worker._proc.pid, signal.SIGSTOP)  # the job is sent and never answered
            proto.data_received(http("/v1/execute", body, headers))
            sent_at_once = not proto.tasks
            os.kill(worker._proc.pid, signal.SIGKILL)
            await until(lambda: len(answers(transport.written)) == 1)
            await settle(proto)
            return got, kinds, counted, sent_at_once, answers(transport.written)
        finally:
            await worker.close()

    got, kinds, counted, sent_at_once, after_kill = asyncio.run(run())
    assert kinds["now"][1:] == [(True, 0), (True, 0)] and kinds["task"][1:] == [(True, 1), (True, 1)]
    assert got["now"] == got["task"] == got["route"]
    for (status, _, frame), t in zip(got["now"], tensors):
        n = len(frame) - t.nbytes
        assert status == 200
        assert_matches(np.frombuffer(frame[n:], np.float32), parse_operator(request_body("SOFTSIGN", t)).reference(t), 2)
    assert counted == 9  # each answer once
    assert len(after_kill) == 1  # answered once, its task run once
    status, headers, body = after_kill[0]
    assert sent_at_once and status == 503 and headers["retry-after"] == "1"
    assert "(code -9)" in json.loads(body)["error"]  # the signal that ended it: the worker is reaped before it is named


def test_connection_close_and_a_shutdown_under_a_job_sent_at_once_close_after_the_answer():
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        closed = {}
        for how in ("Connection: close", "shutdown"):
            proto, transport = harness.connect()
            proto.data_received(V1)
            await settle(proto)
            worker.reply()
            await settle(proto)
            extra = {"Connection": "close"} if how == "Connection: close" else {}
            body, headers = binary_request(request_body("IDENTITY", x), x.view(np.uint8))
            proto.data_received(http("/v1/execute", body, {**headers, **extra}))
            if how == "shutdown":
                proto.shutdown()  # uvicorn's graceful shutdown: the answer in progress goes out, then the connection closes
            open_before = not transport.closed and not proto.tasks
            worker.reply()
            await until(lambda: len(answers(transport.written)) == 2)
            closed[how] = (open_before, transport.closed, answers(transport.written)[1])
        return closed

    for how, (open_before, closed, (status, headers, body)) in asyncio.run(run()).items():
        assert open_before and closed, how
        assert status == 200 and headers["connection"] == "close" and body.endswith(x.tobytes()), how


def test_an_answer_whose_transport_has_no_room_waits_for_it_in_a_task():
    async def run():
        worker = FastEcho()
        harness = Harness(worker)
        proto, transport = await second_request(harness, V2)
        proto.pause_writing()  # the transport's buffer filled meanwhile
        worker.reply()
        for _ in range(5):
            await asyncio.sleep(0)
        waiting = (len(answers(transport.written)), len(proto.tasks), worker.jobs[-1].released)
        proto.resume_writing()
        await settle(proto)
        return harness, waiting, answers(transport.written)

    harness, waiting, got = asyncio.run(run())
    assert waiting == (1, 1, True)  # the answer copied out of the slot, its task waiting for room
    assert [status for status, _, _ in got] == [200, 200] and got[1][2].endswith(x.tobytes())
    assert harness.stats().nv_inference_request_success == 2
