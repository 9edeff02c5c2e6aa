"""The delay before starting again a process of the service that died: the supervisor's HTTP server
(service/supervisor.py) and the HTTP process's device worker (service/worker_lifecycle.py) share it.

A death of a process that had run ``stable_s`` waits ``first_s``; each death after it in a row of
processes that had not waits twice the one before, up to ``most_s``. A process failing at every start
is not restarted in a tight loop; one that fails once a day is back at once.
"""
from __future__ import annotations

STABLE_S = 60.0  # a process that ran this long before it died starts the delay again


class RestartBackoff:
    def __init__(self, first_s: float, most_s: float) -> None:
        self.first_s, self.most_s = first_s, most_s
        self.quick_exits = 0  # deaths in a row, each of a process that had not run STABLE_S
        self._next = first_s

    def after_death(self, ran_s: float | None, stable_s: float) -> float:
        """The delay before the next start, after the death of a process that had run ``ran_s`` (None:
        it never got as far as the point its owner measures from, a quick death). ``stable_s``: STABLE_S
        as the caller's module reads it when the death comes, so that its tests can shorten it."""
        if ran_s is not None and ran_s >= stable_s:
            self.quick_exits, self._next = 0, self.first_s
        else:
            self.quick_exits += 1
        delay, self._next = self._next, min(2 * self._next, self.most_s)
        return delay
