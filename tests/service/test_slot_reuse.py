"""A tensor slot goes back to the pool only once nothing writes into it any more.

Large inputs are copied into a job's slot in a thread. A request cancelled during that copy (its
timeout, its client gone) frees its slot on the way out, and the next request takes it: if the
thread were still copying, the old request's bytes would land on the new one's. Seen once in CI on
a loaded machine (SwiftShader, host memory): CELU after a timed-out 64 MiB GELU answered 1.0 for its
first 32 elements, the GELU input's ones, which glibc's memcpy stores last. These tests slow the
copy down so that the cancellation always comes in the middle of it.
"""
from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time

import numpy as np
import pytest

from service import shared_memory
from service.config import Settings
from service.operators import parse_operator
from service.jobs import LARGE
from service.worker import DeviceWorker
from tests.helpers import assert_matches
from tests.service.helpers import request_body


class _SlowWrites:
    """Wraps a writing call so that it starts, waits, then writes; records whether it finished."""

    def __init__(self, call, delay_s: float = 0.3) -> None:
        self.call, self.delay_s = call, delay_s
        self.started, self.finished = threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.started.set()
        time.sleep(self.delay_s)
        try:
            return self.call(*args, **kwargs)
        finally:
            self.finished.set()


async def _cancel_once_started(task: asyncio.Task, writes: _SlowWrites) -> None:
    while not writes.started.is_set():
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.timeout(120)
def test_a_request_cancelled_while_its_input_is_copied_frees_its_slot_only_after_the_copy(monkeypatch):
    writes = _SlowWrites(np.copyto)
    monkeypatch.setattr(np, "copyto", writes)  # the HTTP process's copies only: the worker is another process
    big = parse_operator(request_body("GELU", np.zeros(LARGE, np.float32)))  # 4 MiB: copied in a thread
    small = parse_operator(request_body("CELU", np.zeros(64, np.float32)))

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off", queue_size=1))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            ones = np.ones(LARGE, np.float32)
            task = asyncio.ensure_future(worker.run(big, [ones.view(np.uint8)], False))
            await _cancel_once_started(task, writes)
            assert writes.finished.is_set(), "the cancellation came back while the copy still wrote into the slot"
            assert worker.queue_depth == 0  # and then the slot is free
            # the next request takes that slot (the only one there is) and gets its own answer
            x = np.linspace(-3, 3, 64, dtype=np.float32)
            result = await worker.run(small, [x.view(np.uint8)], False)
            try:
                assert_matches(np.frombuffer(result.output, np.float32).copy(), small.reference(x), 4)
            finally:
                result.release()
            assert len(worker._pool.slots) == 1
        finally:
            await worker.close()

    asyncio.run(scenario())


def test_a_shared_memory_read_cancelled_midway_returns_only_once_the_read_has_ended(monkeypatch):
    """The same for an input read from a client's shared-memory region straight into the slot."""
    data = np.arange(2 * shared_memory.LARGE_IO // 4, dtype=np.float32)  # above LARGE_IO: read in a thread
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, data.tobytes())
        writes = _SlowWrites(os.preadv)
        dst = np.zeros(data.nbytes, np.uint8)

        async def scenario() -> None:
            task = asyncio.ensure_future(shared_memory._io(writes, fd, dst, 0))
            await _cancel_once_started(task, writes)
            assert writes.finished.is_set(), "the cancellation came back while preadv still wrote into the slot"

        asyncio.run(scenario())
        np.testing.assert_array_equal(dst.view(np.float32), data)  # the read that was waited for, whole
    finally:
        os.close(fd)
        os.unlink(path)
