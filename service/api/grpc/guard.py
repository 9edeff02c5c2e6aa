"""The deadlines of one gRPC connection, as service/http_guard.py gives HTTP/1.1 its own: without them a
client holds a connection, and whatever it claimed, for ever by opening it and sending nothing, by
stopping inside a message, or by never reading its answers.

- idle: a connection with no stream open for ``idle_timeout`` seconds (VKACT_GRPC_IDLE_TIMEOUT_S) is
  told GOAWAY and closed; PINGs, SETTINGS and WINDOW_UPDATEs do not make it busy (h2grpc's
  ``Session.idle`` counts from the last stream's close);
- a request that stalls: a stream whose request is not whole (headers, message, end of stream), or a
  streaming call inside a message, that receives no byte for ``body_timeout`` seconds
  (VKACT_BODY_TIMEOUT_S) is answered CANCELLED and reset; its partial message leaves the budget and a
  streaming call's task is cancelled. A streaming call between messages may rest: it is the client's
  open call, bounded by the calls bound;
- a client that does not read: a connection whose answers wait for it (queued behind its flow-control
  window, or its socket's buffer full) and that takes none of them for ``body_timeout`` seconds is
  cut (aborted): its answers, partial messages and calls are given back as for any lost connection;
  one closed (idle, or its session done) whose last bytes its client has not taken ``body_timeout``
  seconds later is aborted too (asyncio's close() waits for them for ever).

One timer per connection, re-armed only when it fires, at the earliest moment any of these could fall
due, and at most the shorter timeout ahead, so a condition that begins between two checks is seen by the
next one in time. Reading, writing and a call cost it nothing but ``Connection.read_at``'s stamp when
answers move.
"""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...native import h2grpc
from .status import CANCELLED  # a request the server gave up waiting for

if TYPE_CHECKING:
    from .transport import _Connection

log = logging.getLogger("vkact.grpc")
#: A deadline met this close is met: the loop's clock and h2grpc's may differ by a rounding.
SLACK_S = 1e-3


class ConnectionGuard:
    def __init__(self, conn: _Connection, idle_timeout: float, body_timeout: float) -> None:
        self.conn = conn
        self.idle_timeout, self.body_timeout = idle_timeout, body_timeout
        self.period = min(idle_timeout, body_timeout)
        self.message = f"the request paused for more than {body_timeout:g} s (VKACT_BODY_TIMEOUT_S)".encode()
        self._closing_since: float | None = None  # when the connection was first seen closing
        self._timer: asyncio.TimerHandle | None = conn.loop.call_later(self.period, self._check)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        conn = self.conn
        session, transport = conn.session, conn.transport
        if session is None or transport is None:
            return
        now = conn.loop.time()
        if transport.is_closing():  # closed, its last bytes not yet taken: they get one body timeout
            if self._closing_since is None:
                self._closing_since = now
            elif now - self._closing_since >= self.body_timeout - SLACK_S:
                log.info("aborting a closed gRPC connection whose client took none of its last bytes for %.1f s",
                         now - self._closing_since)
                transport.abort()
                return
            self._timer = conn.loop.call_at(self._closing_since + self.body_timeout, self._check)
            return
        due = now + self.period
        if conn.unread or not conn.writing:  # answers wait for the client
            waited = now - conn.read_at
            if waited >= self.body_timeout - SLACK_S:
                log.info("closing a gRPC connection whose client took none of its answers for %.1f s", waited)
                transport.abort()  # its write buffer would never drain: close() would wait on it
                return
            due = min(due, conn.read_at + self.body_timeout)
        else:
            idle = session.idle
            if idle >= self.idle_timeout - SLACK_S:
                log.info("closing a gRPC connection idle for %.1f s", idle)
                conn.shutdown()  # GOAWAY; with no stream open the session is done, and flush() closes it
                conn.close()
                self._closing_since = now
                self._timer = conn.loop.call_at(now + self.body_timeout, self._check)
                return
            if idle:
                due = min(due, now + self.idle_timeout - idle)
        if conn.writing:  # while it is not, the connection is not read: its streams' pauses are not their own
            try:
                stalled, next_due = session.reset_stalled(self.body_timeout, CANCELLED, self.message)
            except h2grpc.H2Error as exc:  # nghttp2 failed (out of memory): the connection cannot go on
                log.info("closing a gRPC connection: %r", exc)
                transport.abort()
                return
            if stalled:
                log.info("reset %d gRPC streams whose requests paused for %s s", len(stalled), self.body_timeout)
                conn.streams_reset(stalled)
            if next_due >= 0:
                due = min(due, now + next_due)
        self._timer = conn.loop.call_at(due, self._check)
