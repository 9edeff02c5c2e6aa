"""A compressed body or gRPC message whose request is cancelled while a thread inflates it gives its
claim on the budget of bytes in flight back whole.

The inflater charges each step's output to the request's claim from its thread. gRPC cancels a call's
task when the client resets the stream, its deadline passes or the connection drops, and the call's
claim is released when the task ends. If the cancellation came back while the thread still inflated,
the steps after the release were charged to a claim nobody releases any more: those bytes were lost to
the budget for the life of the process, and once cancelled calls had lost all of it every request was
refused (503 / RESOURCE_EXHAUSTED). The thread is slowed here so that the cancellation always comes in
the middle of the inflation.
"""
from __future__ import annotations

import asyncio
import gzip
import threading
import time

import pytest

from service.api.v2 import encoding
from service.api.v2.encoding import Inflater, inflated
from service.inflight import InflightBudget

# Driver-independent (test-portability.sh leaves them to make test): the budget of a body inflating while it is
# cancelled, before any kernel
pytestmark = pytest.mark.driver_independent

INFLATED = 8 << 20  # eight steps of the inflater


class _SlowSteps:
    """Inflater.step, its first call in a thread slowed down; records when the thread has started and ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.3) -> None:
        self.step, self.delay_s = Inflater.step, delay_s
        self.started, self.ended = threading.Event(), threading.Event()
        this = self

        def step(inflater: Inflater) -> bool:
            if threading.current_thread() is threading.main_thread():
                return this.step(inflater)
            if not this.started.is_set():
                this.started.set()
                time.sleep(this.delay_s)
            return this.step(inflater)

        def rest(inflater: Inflater, _rest=Inflater.rest) -> None:
            try:
                _rest(inflater)
            finally:
                this.ended.set()

        monkeypatch.setattr(Inflater, "step", step)
        monkeypatch.setattr(Inflater, "rest", rest)


@pytest.mark.parametrize("first_on_loop", [True, False], ids=["http-body", "grpc-message"])
def test_a_request_cancelled_while_its_body_inflates_gives_its_claim_back_whole(monkeypatch, first_on_loop):
    steps = _SlowSteps(monkeypatch)
    data = gzip.compress(bytes(INFLATED))
    budget = InflightBudget(64 << 20)

    async def scenario() -> None:
        claim = budget.claim()
        claim.grow(len(data))  # the compressed bytes, as the transport hands them over
        task = asyncio.ensure_future(inflated(Inflater(data, "gzip", 32 << 20, claim), first_on_loop=first_on_loop))
        while not steps.started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        claim.release()  # as the call's end does (transport._ended, within_budget)
        assert steps.ended.is_set(), "the cancellation came back while a thread still inflated into the claim"

    asyncio.run(scenario())
    assert steps.ended.wait(60)
    assert budget.held == 0, f"{budget.held} bytes of the budget lost to a cancelled inflation"


def test_a_cancelled_inflation_stops_at_its_next_step(monkeypatch):
    """The thread does not inflate the rest of a body nobody waits for: it stops within a step."""
    steps = _SlowSteps(monkeypatch)
    data = gzip.compress(bytes(INFLATED))
    budget = InflightBudget(64 << 20)
    made: list[Inflater] = []

    async def scenario() -> None:
        inflater = Inflater(data, "gzip", 32 << 20, budget.claim())
        made.append(inflater)
        task = asyncio.ensure_future(inflated(inflater, first_on_loop=False))
        while not steps.started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert steps.ended.wait(60)
    assert made[0].filled <= 2 * Inflater.STEP < INFLATED
