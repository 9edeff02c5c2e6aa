"""The device worker's restart delay (service/worker_lifecycle.py): deaths in a row, each of a worker that had not yet
served STABLE_S since it reported (or never reported), double it; a death after that long starts it again at
the first delay, as the supervisor does for the HTTP process. Read from the line the HTTP side logs for each
restart, never timed. A worker closed while a restart waits starts none."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import signal

import pytest

import service.worker_lifecycle as lifecycle_module
from service.config import Settings
from service.worker import DeviceWorker
from tests.service.conftest import ended, spawned_children

# Process supervision, no kernel: make test runs it, test-portability.sh leaves it out
pytestmark = pytest.mark.driver_independent


async def _killed(worker: DeviceWorker) -> int:
    """Kill the ready worker; returns its pid once the HTTP side has seen it go."""
    pid = worker.info["pid"]
    os.kill(pid, signal.SIGKILL)
    while worker.ready:
        await asyncio.sleep(0.01)
    return pid


async def _started_after(worker: DeviceWorker, dead: int) -> int:
    """The pid of the worker started after ``dead``, while it is still starting (it has not reported)."""
    while (proc := worker._proc) is None or proc.pid == dead:  # the restart waits its delay first
        await asyncio.sleep(0.005)
    assert not worker.ready  # a worker takes about a second to start; it is seen within milliseconds
    return proc.pid


@pytest.mark.timeout(120)
def test_quick_deaths_double_the_delay_and_one_after_serving_starts_it_again(monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="vkact.worker")

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            monkeypatch.setattr(lifecycle_module, "STABLE_S", float("inf"))  # none serves long enough
            for _ in range(3):
                await _killed(worker)
                await worker.wait_ready(60)
            monkeypatch.setattr(lifecycle_module, "STABLE_S", 0.0)  # from here, any that reported has
            dead = await _killed(worker)
            os.kill(await _started_after(worker, dead), signal.SIGKILL)  # this one never reports
            await worker.wait_ready(60)
            assert worker.restarts == 5
        finally:
            await worker.close()

    asyncio.run(scenario())
    delays = [float(d) for d in re.findall(r"restarting in ([\d.]+) s", caplog.text)]
    assert delays == [0.2, 0.4, 0.8, 0.2, 0.4], caplog.text


@pytest.mark.timeout(60)
def test_a_worker_closed_while_a_restart_waits_starts_none():
    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off"))
        worker.start()
        await worker.wait_ready(60)
        await _killed(worker)
        await worker.close()  # within the restart's delay (0.2 s)
        await asyncio.sleep(1.0)  # the restart would have started a worker by now

    asyncio.run(scenario())
    assert [pid for pid in spawned_children(os.getpid()) if not ended(pid)] == []


def test_the_watchdog_times_a_graph_build_from_the_last_builds_end_not_a_job_parked_behind_it():
    """longest_wait, which the watchdog weighs against device_timeout_s: a job on the device from when it
    was sent; parked graph jobs (their programs built one at a time, in order) from the last build's end
    or the oldest one's parking, whichever is later, so jobs queued behind several builds are not taken
    for a hung driver, and a build that itself runs long is."""
    from types import SimpleNamespace as Job

    def wait(jobs, built_at=0.0, now=100.0):
        return lifecycle_module.longest_wait(jobs, built_at, now)

    assert wait([Job(started_at=70.0, parked_at=None)]) == (30.0, "a job has been on the device")
    parked = [Job(started_at=1.0, parked_at=10.0), Job(started_at=2.0, parked_at=20.0)]
    assert wait(parked) == (90.0, "a graph's pipelines have been building")  # no build has ended: since the first parked
    assert wait(parked, built_at=95.0) == (5.0, "a graph's pipelines have been building")  # the build under way since 95
    assert wait([*parked, Job(started_at=50.0, parked_at=None)], built_at=95.0) == (50.0, "a job has been on the device")
    assert wait([Job(started_at=1.0, parked_at=99.0)], built_at=40.0) == (1.0, "a graph's pipelines have been building")
