"""The request timeouts on one timer (service/dataplane/deadlines.py): each execution's expiry is called
once its time has passed, never for one marked done, on whichever event loop the execution runs."""
from __future__ import annotations

import asyncio

from service.dataplane import deadlines as module
from service.dataplane.deadlines import Deadlines


def test_expiries_come_once_after_the_deadline_and_never_for_a_finished_execution():
    async def scenario() -> dict[str, list[float]]:
        loop = asyncio.get_running_loop()
        d = Deadlines(0.02)
        called: dict[str, list[float]] = {}
        added: dict[str, float] = {}

        def add(name: str):
            added[name] = loop.time()
            return d.add(lambda: called.setdefault(name, []).append(loop.time() - added[name]))

        d.done(add("first"))              # answered at once: the timer armed for it fires and moves on
        add("second")
        await asyncio.sleep(0.005)
        add("third")
        d.done(add("fourth"))
        while len(called) < 2:            # as long as it takes (no wall-clock bound)
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        return called

    called = asyncio.run(scenario())
    assert sorted(called) == ["second", "third"]
    assert all(len(times) == 1 and times[0] >= 0.02 - 1e-3 for times in called.values())


def test_a_new_event_loop_gets_a_timer_of_its_own():
    d = Deadlines(0.01)

    async def one() -> list[int]:
        hits: list[int] = []
        d.add(lambda: hits.append(1))
        await asyncio.sleep(0.05)
        return hits

    assert asyncio.run(one()) == [1]

    async def pending_then_closed() -> None:
        d.add(lambda: None)  # armed on this loop, which closes before it fires

    asyncio.run(pending_then_closed())
    assert asyncio.run(one()) == [1]  # armed again on the running loop, not left with the closed one


def test_finished_entries_behind_a_long_execution_are_dropped(monkeypatch):
    """One execution still waited on keeps the queue from being popped at its head; the finished ones
    behind it go once they outnumber the live ones by the slack."""
    async def scenario() -> tuple[int, bool]:
        d = Deadlines(60.0)
        fired: list[int] = []
        d.add(lambda: fired.append(0))  # the long one, never done here
        for i in range(1000):
            d.done(d.add(lambda: fired.append(1)))
        return len(d._queue), bool(fired)

    length, fired = asyncio.run(scenario())
    assert length <= module._SLACK * 16 + 1 and not fired
