"""Dynamic batching when some of its jobs are cancelled (timeout, client gone): a job cancelled while
queued never reaches the device and its slot is free at once; one cancelled while the device holds it
keeps its slot until the device has answered, so a new request never gets a slot the device still
writes into; the jobs around them each get their own answer. The device worker is stopped (SIGSTOP)
so that every job is where the test says when it is cancelled."""
from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from service.config import Settings
from service.operators import parse_operator
from service.worker import DeviceWorker
from tests.helpers import assert_matches
from tests.service.helpers import request_body

N = 300


@pytest.mark.timeout(120)
def test_jobs_cancelled_in_the_queue_and_on_the_device_around_a_batch():
    op = parse_operator(request_body("SHRINK", np.zeros(N, np.float32), Bias=0.25, Threshold=0.5))
    rng = np.random.default_rng(5)
    xs = {name: rng.standard_normal(N).astype(np.float32) for name in "ABCDEFG"}

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off", max_batch=8, queue_size=8))
        worker.start()
        await worker.wait_ready(60)
        pid = worker._proc.pid
        jobs: dict[str, asyncio.Future] = {}

        def submit(name: str) -> None:
            jobs[name] = asyncio.ensure_future(worker.run(op, [xs[name].view(np.uint8)], False))

        os.kill(pid, signal.SIGSTOP)
        try:
            for name in "AB":  # both handed to the (stopped) worker: the window holds two
                submit(name)
            while worker.dispatched < 2:
                await asyncio.sleep(0.001)
            for name in "CDE":  # queued behind them, one descriptor: one batch once the device is back
                submit(name)
            await asyncio.sleep(0.05)
            assert worker.dispatched == 2
            for name in "BD":  # B on the device, D in the queue
                jobs[name].cancel()
                with pytest.raises(asyncio.CancelledError):
                    await jobs[name]
            # D's slot is free again; B's is not: the device will still write B's answer into it
            assert worker.queue_depth == 4  # A, B, C, E
            submit("F")
            await asyncio.sleep(0.05)
            assert worker.queue_depth == 5
        finally:
            os.kill(pid, signal.SIGCONT)
        results = {name: await jobs[name] for name in "ACEF"}
        try:
            for name, result in results.items():
                assert_matches(np.frombuffer(result.output, np.float32).copy(), op.reference(xs[name]), 4)
        finally:
            for result in results.values():
                result.release()
        assert worker.dispatched == 5  # A, B, C, E, F: the job cancelled in the queue never ran
        assert worker.queue_depth == 0  # B's slot came back with the device's answer
        # and a request after them, on a slot the device wrote B's answer into, gets its own
        g = await worker.run(op, [xs["G"].view(np.uint8)], False)
        try:
            assert_matches(np.frombuffer(g.output, np.float32).copy(), op.reference(xs["G"]), 4)
        finally:
            g.release()
        await worker.close()

    asyncio.run(scenario())
