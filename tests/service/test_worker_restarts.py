"""The device worker's restart delay (service/worker.py): deaths in a row, each before the worker has served
STABLE_S, double it; a death after that long starts it again at the first delay, as the supervisor does for
the HTTP process. Read from the line the HTTP side logs for each restart, never timed."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import signal

import pytest

import service.worker as worker_module
from service.config import Settings
from service.worker import DeviceWorker

# Process supervision, no kernel: make test runs it, test-portability.sh leaves it out
pytestmark = pytest.mark.driver_independent


async def _killed_and_back(worker: DeviceWorker) -> None:
    os.kill(worker.info["pid"], signal.SIGKILL)
    while worker.ready:
        await asyncio.sleep(0.01)
    await worker.wait_ready(60)


@pytest.mark.timeout(120)
def test_quick_deaths_double_the_delay_and_one_after_serving_starts_it_again(monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="vkact.worker")

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            monkeypatch.setattr(worker_module, "STABLE_S", float("inf"))  # none serves long enough
            for _ in range(3):
                await _killed_and_back(worker)
            monkeypatch.setattr(worker_module, "STABLE_S", 0.0)  # the one now running has
            await _killed_and_back(worker)
            assert worker.restarts == 4
        finally:
            await worker.close()

    asyncio.run(scenario())
    delays = [float(d) for d in re.findall(r"restarting in ([\d.]+) s", caplog.text)]
    assert delays == [0.2, 0.4, 0.8, 0.2], caplog.text
