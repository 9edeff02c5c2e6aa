"""The request timeout of every execution on one timer.

A timer per request (``loop.call_later`` and its ``cancel``: a libuv timer started, stopped and closed
for each request) was a quarter of ``execute``'s own time on uvloop (the device stubbed: 5.5-6.3 us a
call with it, 4.1-4.7 with this, measured in alternated rounds on the 2-core machine). Every
execution of one HTTP process waits at most the same request_timeout_s, so their deadlines come in
the order the executions start: one timer, armed for the earliest deadline still waited on, serves
them all, and a request adds to a queue and marks its entry done.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

# Entries of finished executions kept behind one still waited on, at most this many times the live
# ones (and this many at least), before the queue is rebuilt without them.
_SLACK = 4


class Deadline:
    __slots__ = ("at", "expire")

    def __init__(self, at: float, expire: Callable[[], None]) -> None:
        self.at = at
        self.expire: Callable[[], None] | None = expire  # None once done or expired


class Deadlines:
    """Calls each execution's ``expire`` once ``seconds`` have passed since it was added, unless it was
    marked done first. Use from the event loop only."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._queue: deque[Deadline] = deque()
        self._live = 0  # entries neither done nor expired
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's (tests run apps on several loops)

    def add(self, expire: Callable[[], None], loop: asyncio.AbstractEventLoop | None = None) -> Deadline:
        """Call ``expire`` once ``seconds`` have passed, unless ``done`` comes first; ``loop``: the
        running loop, where the caller has it."""
        if loop is None:
            loop = asyncio.get_running_loop()
        entry = Deadline(loop.time() + self.seconds, expire)
        queue = self._queue
        while queue and queue[0].expire is None:  # finished ahead of this one: gone for good
            queue.popleft()
        queue.append(entry)
        self._live += 1
        if len(queue) > _SLACK * max(16, self._live):  # a long execution holds finished ones behind it
            self._queue = deque(e for e in queue if e.expire is not None)
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_at(self._queue[0].at, self._fire)
        return entry

    def done(self, entry: Deadline) -> None:
        """``entry``'s execution ended in time: its expiry will not be called."""
        if entry.expire is not None:
            entry.expire = None
            self._live -= 1

    def _fire(self) -> None:
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        queue = self._queue
        while queue and (queue[0].expire is None or queue[0].at <= now):
            entry = queue.popleft()
            expire = entry.expire
            if expire is not None:
                entry.expire = None
                self._live -= 1
                expire()
        if queue:
            self._timer = loop.call_at(queue[0].at, self._fire)
