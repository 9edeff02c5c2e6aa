"""One budget of request bytes in flight per HTTP process (VKACT_INFLIGHT_BYTES): the bodies received,
the bytes they inflate to, gRPC's messages, and gRPC's answers until the client's flow control takes them
(service/api/grpc/transport.py). Per-request limits (VKACT_MAX_BODY_BYTES) bound what one
client may send; without this, what many send at once (a few gzip bombs) was bounded by nothing but the
machine's memory.

A request holds a ``Claim``, which grows as its bytes arrive or inflate and gives everything back when
it ends (a context manager, or ``release()``). Growth that can never fit (more than the whole budget)
is a 413, growth that does not fit beside the other requests' a 503 with Retry-After, as the tensor
slots answer (service/slots.py). ``try_grow`` asks without raising, for a caller with another way out
(the inflater, which then counts the bytes it would make instead of keeping them).

A transport that reserves a message's bytes as they arrive (``InflightBudget.try_reserve`` /
``release``) hands them to the call's claim with ``Claim.adopt``. Thread-safe: inflation runs in
threads while the event loop receives."""
from __future__ import annotations

import threading

from .errors import Busy, PayloadTooLarge

SETTING = "VKACT_INFLIGHT_BYTES"


class InflightBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def try_reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit beside what is held; False (nothing taken) if not."""
        with self._lock:
            if self.held + nbytes > self.limit:
                return False
            self.held += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes

    def claim(self) -> Claim:
        return Claim(self)


class Claim:
    """The bytes one request holds of a budget. One request uses it at a time (the loop or its thread)."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: InflightBudget) -> None:
        self.budget = budget
        self.held = 0

    def try_grow(self, nbytes: int) -> bool:
        if not self.budget.try_reserve(nbytes):
            return False
        self.held += nbytes
        return True

    def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` more: PayloadTooLarge (413) if this request would then need more than the
        whole budget, Busy (503) if it would fit alone but requests in flight hold the rest."""
        if self.try_grow(nbytes):
            return
        if self.held + nbytes > self.budget.limit:
            raise PayloadTooLarge(f"the request needs more than the {self.budget.limit} bytes that all requests in flight "
                                  f"may hold ({SETTING})")
        raise Busy(f"the memory for requests in flight ({SETTING}) is taken by other requests; retry shortly")

    def fits_alone(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more would fit were this request the only one in flight."""
        return self.held + nbytes <= self.budget.limit

    def adopt(self, nbytes: int) -> None:
        """Take over ``nbytes`` already reserved from the budget (``try_reserve``) by whoever received them."""
        self.held += nbytes

    def move_to(self, other: Claim) -> None:
        """Hand what this claim holds to ``other`` (the same budget): a body read within the budget by the
        HTTP protocol (service/http_body.py) charged to the route's claim, not twice."""
        other.held += self.held
        self.held = 0

    def shrink(self, nbytes: int) -> None:
        """Give back ``nbytes`` of what this claim holds (bytes dropped before the request ends)."""
        nbytes = min(nbytes, self.held)
        if nbytes <= 0:
            return
        self.held -= nbytes
        self.budget.release(nbytes)

    def release(self) -> None:
        self.shrink(self.held)

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
