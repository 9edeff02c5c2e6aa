"""The HTTP process's writes to its device worker never block the event loop: a job message larger than
what the worker's job pipe holds (graph plans are tens to hundreds of KiB, more with VKACT_MAX_GRAPH_NODES
raised) waits in order while the worker is busy, and the loop goes on serving meanwhile."""
from __future__ import annotations

import asyncio
import fcntl
import os
import pickle
import signal
import threading

import numpy as np
import pytest

from service.config import Settings
from service.graph_compiler import GraphCompiler
from service.worker import DeviceWorker
from tests.graph_helpers import activation, chain, sample

# Driver-independent (test-portability.sh leaves it to make test): the event loop and the worker's job pipe; the
# answers are compared with the same worker's (SwiftShader took 41 s of its service run over the 64-node plan)
pytestmark = pytest.mark.driver_independent

PIPE_BYTES = 1 << 15  # the job pipe's capacity, set small: the test does not depend on the system's default


def _small_pipe(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _pipe_capacity() -> int:
    """Bytes such a pipe takes before a write would block (the most of writes of a few sizes)."""
    most = 0
    for size in (1 << 12, 1 << 16, 1 << 20):
        r, w = os.pipe()
        try:
            _small_pipe(w)
            os.set_blocking(w, False)
            taken = 0
            try:
                while True:
                    taken += os.write(w, bytes(size))
            except BlockingIOError:
                most = max(most, taken)
        finally:
            os.close(r)
            os.close(w)
    return most


NODES = 64  # VKACT_MAX_GRAPH_NODES' default: a plan of ~100 KB


def _long_chain_plan():
    from service.descriptors.graph import parse_graph

    kinds = ["SIGMOID", "TANH", "SOFTSIGN", "ELU"]
    graph = parse_graph(chain([activation(kinds[i % 4], np.float32, (64,)) for i in range(NODES)]))
    return graph, GraphCompiler(Settings()).compile(graph)


@pytest.mark.timeout(180)
def test_job_messages_larger_than_the_pipe_wait_without_blocking_the_loop():
    """The worker is stopped (SIGSTOP: it reads nothing, as while it runs a long job), and two graph
    jobs, each plan larger than what its pipe takes, are handed to it. The event loop must go on running
    (here: a callback of its own, which then lets the worker go on); both jobs, and a job sent after
    them, are answered correctly once it reads again, in the order they were sent."""
    graph, plan = _long_chain_plan()
    key = pickle.dumps(plan)
    assert len(key) > _pipe_capacity()  # else the scenario would not fill the pipe
    x = sample(np.float32, sizes=(64,))

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        _small_pipe(worker._jobs.fileno())
        pid = worker.info["pid"]
        loop_ran = threading.Event()
        resumed_by_timer = threading.Event()

        def fallback() -> None:  # a loop blocked in a write never gets here: let the worker go on anyway
            if not loop_ran.wait(20):
                resumed_by_timer.set()
                os.kill(pid, signal.SIGCONT)

        try:
            expected = (await worker.run_graph(plan, [x.view(np.uint8)], key=key))
            expected_bytes = [bytes(v) for v in expected.outputs]
            expected.release()
            os.kill(pid, signal.SIGSTOP)
            timer = threading.Thread(target=fallback, daemon=True)
            timer.start()
            jobs = [asyncio.ensure_future(worker.run_graph(plan, [x.view(np.uint8)], key=key)) for _ in range(2)]
            await asyncio.sleep(0)   # both jobs are handed over (or one of them blocks the loop in its write)
            await asyncio.sleep(0.05)
            loop_ran.set()
            os.kill(pid, signal.SIGCONT)
            timer.join()
            assert not resumed_by_timer.is_set(), "the event loop was blocked writing to a stopped worker"
            for job in jobs:
                result = await asyncio.wait_for(job, 60)
                assert [bytes(v) for v in result.outputs] == expected_bytes
                result.release()
            after = await worker.run_graph(plan, [x.view(np.uint8)], key=key)
            assert [bytes(v) for v in after.outputs] == expected_bytes
            after.release()
            assert worker.restarts == 0
        finally:
            loop_ran.set()
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            await worker.close()

    asyncio.run(scenario())
