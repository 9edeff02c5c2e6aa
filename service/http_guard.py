"""uvicorn's httptools protocol with the guards it lacks: a deadline for a request's headers, an idle
limit while its body is read, and a bound on open connections.

Without them a client holds a connection for ever by sending half a request (slowloris), and enough
such clients exhaust the process's file descriptors; uvicorn's own limit_concurrency answers in plain
text and counts the tasks of requests too. Each connection is one protocol object, so the guards are
timers on it (one per connection, re-armed only when it fires: a body chunk costs no timer call).

- headers: from a connection's opening, and from the first byte of each later request on it, the
  headers must be complete within ``header_timeout_s``; else 408 and the connection is closed; a head
  larger than ``MAX_HTTP_HEAD`` gets 431 and the connection is closed;
- body: while the service waits for a request's body, ``body_timeout_s`` without a byte closes the
  connection (the route sees the client gone); a body the route has not asked for yet (reading
  paused) is not the client's delay and is not timed;
- connections: a request on a connection beyond ``max_connections`` open ones gets 503 with
  Retry-After and the connection is closed, except liveness probes, which must stay answerable.

Selected by ``python -m service`` (uvicorn's ``http=`` option); the settings are read once per process.
"""
from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .api.execution import CYCLE_KEY, DEPARTURE_KEY
from .api.json_text import dumps
from .config import Settings
from .limits import MAX_HTTP_HEAD

PROBES = (b"/health/live", b"/v2/health/live")
# Body bytes the route has not taken yet past which reading pauses. uvicorn pauses past 64 KiB and
# appends each chunk to those pending (a copy of both); loopback's chunks are about 64 KiB, so a large
# body was copied once more that way. Small bodies, which come whole, never pause.
PENDING_BODY_BYTES = 1 << 14


@functools.cache
def _settings() -> Settings:
    return Settings()


def _answer(status: bytes, message: str) -> bytes:
    """A whole response, written to the transport directly (no request cycle exists for it)."""
    body = dumps({"error": message, "field": None})
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


HEAD_TOO_LARGE = f"the request's line and headers passed {MAX_HTTP_HEAD} bytes"


async def _refusal(send, status: int, message: str, *headers: tuple[bytes, bytes]) -> None:
    """``_answer``'s response sent through an ASGI ``send`` (uvicorn's request cycle), ``headers`` added."""
    body = dumps({"error": message, "field": None})
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), *headers, (b"connection", b"close"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _head_too_large(scope, receive, send) -> None:  # an ASGI app: the answer to a head past MAX_HTTP_HEAD
    await _refusal(send, 431, HEAD_TOO_LARGE)


async def _busy(scope, receive, send) -> None:  # an ASGI app: the answer past the connection bound
    message = f"this server holds {_settings().max_connections} connections (VKACT_MAX_CONNECTIONS); retry later"
    await _refusal(send, 503, message, (b"retry-after", b"1"))


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        settings = _settings()
        self.header_timeout = settings.header_timeout_s
        self.body_timeout = settings.body_timeout_s
        self.max_connections = settings.max_connections
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_for = ""          # "headers", "body" or "" (nothing is timed)
        self._since = 0.0               # when the awaited part began, or the last body byte came
        self._head_bytes = 0            # read while the headers are awaited (MAX_HTTP_HEAD)
        self._head_parsed = 0           # of the request line and headers httptools has parsed
        self._departures: set[asyncio.Future[None]] = set()  # of the requests running on the device: done when it is lost
        self._lost = False
        # the cycle whose request is being answered: uvicorn's connection_lost marks only its newest (self.cycle)
        # gone, which is a pipelined one where requests queue behind that answer
        self._running: Any = None

    # -- the timer ---------------------------------------------------------------------------------

    def _expect(self, what: str, timeout: float) -> None:
        self._waiting_for, self._since = what, self.loop.time()
        if what == "headers":
            self._head_bytes = 0
        if self._timer is not None and self._timer.when() > self._since + timeout:  # due too late for this part
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = self.loop.call_at(self._since + timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.transport is None or self.transport.is_closing() or not self._waiting_for:
            return
        timeout = self.header_timeout if self._waiting_for == "headers" else self.body_timeout
        if self._waiting_for == "body" and self.flow.read_paused:
            self._since = self.loop.time()  # the route is not reading: not the client's delay
        due = self._since + timeout
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check)
            return
        if self._waiting_for == "headers":
            self.logger.info("closing a connection whose request headers took more than %s s", timeout)
            self._close(b"408 Request Timeout", f"the request's headers did not arrive within {timeout} s")
        else:
            self.logger.info("closing a connection whose request body paused for more than %s s", timeout)
            self._close()

    def _close(self, status: bytes | None = None, message: str = "") -> None:
        """Stop timing and close the connection, answering ``status`` first where no answer is being sent."""
        if status is not None and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_answer(status, message))
        self._waiting_for = ""
        self.transport.close()

    # -- uvicorn's callbacks -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        """httptools' reading (h1http reads its own, its heads bounded): a head past MAX_HTTP_HEAD is refused,
        here while it is still coming (the bytes read meanwhile), in on_headers_complete once whole."""
        if self._waiting_for == "headers":
            self._head_bytes += len(data)
        super().data_received(data)
        if self._waiting_for == "headers" and self._head_bytes > MAX_HTTP_HEAD and not self.transport.is_closing():
            # a head still coming (httptools keeps a header's value until it ends)
            self.logger.info("closing a connection whose request head passed %d bytes", MAX_HTTP_HEAD)
            self._close(b"431 Request Header Fields Too Large", HEAD_TOO_LARGE)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._expect("headers", self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        running = self._running
        if running is not None and running is not self.cycle and not running.response_complete:
            # else its answer is written to the closed transport: a RuntimeError and an ERROR traceback in the
            # log for every client that pipelines two requests and hangs up (the pipelined ones never start)
            running.disconnected = True
            running.message_event.set()
        for gone in tuple(self._departures):
            if not gone.done():
                gone.set_result(None)
        self._waiting_for = ""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def on_url(self, url: bytes) -> None:
        room = MAX_HTTP_HEAD - self._head_parsed
        self._head_parsed += len(url)
        if room > 0:  # past the bound its start is kept (a URL to parse), for the 431's cycle
            super().on_url(url[:room])

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_parsed += len(name) + len(value) + 4  # ": " and CRLF: the bytes of the line
        if self._head_parsed <= MAX_HTTP_HEAD:  # past it nothing more is kept: the request is refused
            super().on_header(name, value)

    def on_message_begin(self) -> None:
        self._head_parsed = 0
        super().on_message_begin()
        if self._waiting_for != "headers":  # a later request on a kept-alive connection: its first byte
            self._expect("headers", self.header_timeout)

    def on_headers_complete(self) -> None:
        self._expect("body", self.body_timeout)
        refusal = None
        if self._head_parsed > MAX_HTTP_HEAD:
            self.logger.info("answering 431 to a request whose head passed %d bytes", MAX_HTTP_HEAD)
            refusal = _head_too_large
        elif self.url.split(b"?")[0] not in PROBES and self._over_bound():
            refusal = _busy
        if refusal is not None:
            app, self.app = self.app, refusal
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        else:
            super().on_headers_complete()

    def _over_bound(self) -> bool:
        """Whether this process has more connections open than VKACT_MAX_CONNECTIONS (logged): the request is answered 503."""
        if len(self.connections) <= self.max_connections:
            return False
        self.logger.warning("%d connections open: answering 503 (VKACT_MAX_CONNECTIONS)", len(self.connections))
        return True

    def _start_asgi_task(self, cycle: RequestResponseCycle, app) -> None:  # type: ignore[override]
        self._mark(cycle)
        super()._start_asgi_task(cycle, app)

    def _mark(self, cycle: RequestResponseCycle) -> None:
        """Put what vkact's routes use of this protocol in ``cycle``'s scope, before it runs (the running one)."""
        self._running = cycle
        if not cycle.access_log:  # FrameResponse writes its answer whole on this cycle (api.execution.send_whole)
            cycle.scope[CYCLE_KEY] = cycle  # type: ignore[literal-required]
        cycle.scope[DEPARTURE_KEY] = self._departure  # type: ignore[literal-required]

    def _departure(self) -> asyncio.Future[None]:
        """A request's client departure (api.execution.departure): a future this connection's loss
        completes and the data plane cancels once the job is answered. It replaces a task per request
        awaiting uvicorn's disconnect message; like uvicorn's receive() there, it resumes reading, for
        only a read sees the client's hang-up."""
        gone: asyncio.Future[None] = self.loop.create_future()
        if self._lost:
            gone.set_result(None)
            return gone
        self.flow.resume_reading()
        self._departures.add(gone)
        gone.add_done_callback(self._departures.discard)
        return gone

    def on_body(self, body: bytes) -> None:
        self._since = self.loop.time()
        super().on_body(body)
        cycle = self.cycle  # answered already: uvicorn drops the rest of the body, reading on
        if not cycle.response_complete and len(cycle.body) >= PENDING_BODY_BYTES:  # read on once the route takes it
            self.flow.pause_reading()

    def on_message_complete(self) -> None:
        self._waiting_for = ""
        super().on_message_complete()
