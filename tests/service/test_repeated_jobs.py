"""Repeated requests through a real device worker process: a job of a known template goes as a few
bytes ("go") and is replayed by the worker. Every answer must be computed from its own request's
bytes, across slots replaced by bigger requests and across a restarted worker."""
from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from service.config import Settings
from service.operators import parse_operator
from service.jobs import TemplateIds
from service.worker import DeviceWorker
from tests.helpers import assert_matches
from tests.service.helpers import request_body


async def _run(worker: DeviceWorker, op, x: np.ndarray, in_place: bool = False) -> np.ndarray:
    result = await worker.run(op, [x.view(np.uint8)], in_place)
    try:
        return np.frombuffer(result.output, x.dtype).copy()
    finally:
        result.release()


@pytest.mark.timeout(120)
def test_repeated_shapes_across_replaced_slots_and_a_restart(monkeypatch):
    rng = np.random.default_rng(5)
    sizes = [256, 256, 70_000, 256, 300_000, 256, 1_200_000, 256, 256, 70_000, 256]  # 3 slots: replaced
    ops = {n: parse_operator(request_body("SOFTSIGN", np.zeros(n, np.float32))) for n in set(sizes)}
    shrink = parse_operator(request_body("SHRINK", np.zeros(256, np.float32), Bias=0.25))
    seen = {"new": 0, "known": 0, "slots dropped": 0}
    number, drop_slot = TemplateIds.number, TemplateIds.drop_slot

    def counted_number(self, template):
        tid, new = number(self, template)
        seen["new" if new else "known"] += 1
        return tid, new

    def counted_drop(self, path):
        seen["slots dropped"] += 1
        drop_slot(self, path)

    monkeypatch.setattr(TemplateIds, "number", counted_number)
    monkeypatch.setattr(TemplateIds, "drop_slot", counted_drop)

    async def scenario() -> None:
        worker = DeviceWorker(Settings(pin_cpu="off", queue_size=1))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        try:
            for round_ in range(2):
                for n in sizes:
                    x = rng.standard_normal(n).astype(np.float32)
                    assert_matches(await _run(worker, ops[n], x), ops[n].reference(x), 2)
                    y = rng.standard_normal(256).astype(np.float32)  # another descriptor, the same slot
                    assert_matches(await _run(worker, shrink, y), shrink.reference(y), 0)
                    z = rng.standard_normal(256).astype(np.float32)
                    assert_matches(await _run(worker, shrink, z.copy(), in_place=True), shrink.reference(z), 0)
                if round_ == 0:  # a new worker knows no template: the next jobs define theirs again
                    os.kill(worker.info["pid"], signal.SIGKILL)
                    while worker.ready:
                        await asyncio.sleep(0.01)
                    await worker.wait_ready(60)
            assert worker.restarts == 1
        finally:
            await worker.close()

    asyncio.run(scenario())
    # templates went over and were replayed; they went with their slots (one replaced by a bigger one, three closed)
    assert seen["new"] >= 10 and seen["known"] > seen["new"] and seen["slots dropped"] >= 4, seen
