"""The HTTP/1.1 hot path: the inference requests of a connection parsed in C (service/native/h1http.c),
one event per complete request, everything else left to uvicorn's httptools parser unchanged.

httptools calls Python for each piece of a request (its start, URL, every header, body, end) and
uvicorn parses the URL again; for a small inference that was a sizeable part of the HTTP process's
time a request. h1http takes the requests it fully understands (POST to an inference route, one
Content-Length of at most ``NATIVE_HTTP_BODY`` bytes, plain headers; see h1http.c) and this protocol runs
each one as uvicorn would have, on uvicorn's own request cycle: the same ASGI app (VkactApp's hot
routes, FastAPI behind them), the same answer written whole (api.execution.send_whole), the same
keep-alive, Connection: close, pipelining and write flow control, the same guards (http_guard: header
deadline, body idle limit, connection bound). A larger body, up to the server's body limit, is handed
over at the request's head and read by service/http_body.py (straight into the job's slot where the
request is a repeated /v2 binary one), on uvicorn's cycle too. At the first request it does not take
(another route, a chunked body or one over the limit, Expect, an upgrade, HTTP/1.0, anything odd) the
connection's bytes from that request on go to the httptools parser, which has the connection from then on.

A repeated binary inference (its JSON header parsed before) skips the ASGI machinery altogether: it is
answered on the direct path (service/http_direct.py), whose DirectCycle stands in this protocol where
uvicorn's cycle stands, and goes to the route on uvicorn's cycle whenever the route must decide.

Selected by ``python -m service`` unless VKACT_HTTP_NATIVE=0 (http_guard's protocol alone then).
"""
from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .api.hot_routes import VkactApp
from .http_body import BodyReader, LargeRequest
from .http_direct import DirectCycle, Repeat
from .http_guard import GuardedHttpToolsProtocol, _busy, _settings
from .limits import NATIVE_HTTP_BODY, NATIVE_HTTP_HEAD
from .native import h1http


class NativeHttpProtocol(GuardedHttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # a root path or a concurrency limit changes what uvicorn does with each request: its parser has them
        plain = not self.root_path and self.limit_concurrency is None
        self.asgi = {"version": self.asgi_version, "spec_version": "2.3"}
        self._idle_since: float | None = None  # when its last answer went out with nothing read since
        # uvicorn's ProxyHeadersMiddleware changes nothing in a request without X-Forwarded-* headers: such
        # a request goes straight to the app inside it (one coroutine and a scan of the headers fewer)
        self.inner = self.app.app if isinstance(self.app, ProxyHeadersMiddleware) else self.app
        # the direct path answers for vkact's app only, and only without an access log (uvicorn's cycle writes it)
        self.direct_app = self.inner if isinstance(self.inner, VkactApp) and not self.access_log else None
        # a larger body, up to the server's limit, is read by http_body.py (vkact's app only, as the direct path)
        large = _settings().max_body_bytes if self.direct_app is not None else 0
        self.native: h1http.Session | None = h1http.Session(NATIVE_HTTP_HEAD, NATIVE_HTTP_BODY, large) if plain else None
        # a client repeats one request: its previous request's route and /v1 look-up, kept (http_direct.Repeat)
        self.repeat = Repeat()

    def data_received(self, data: bytes) -> None:
        session = self.native
        if session is None:
            super().data_received(data)
            return
        self._idle_since = None  # busy: the keep-alive timer leaves the connection open (_keep_alive_check)
        events = session.receive(data)
        left = session.body_left  # the last event's body continues on the socket: http_body reads it
        large = events.pop() if left else None
        for event in events:
            self._request(*event)
        if large is not None:
            self._large(large, left)
            return
        if session.fallback:  # a request it does not take: httptools parses from its first byte on
            self.native = None
            rest = session.rest()
            self._waiting_for = ""  # its own callbacks time it from here (on_message_begin)
            if rest:
                super().data_received(rest)
            return
        state = session.state
        if state == 0:
            if events:
                self._waiting_for = ""
        elif state == 1:
            if events or self._waiting_for != "headers":  # a new request's first bytes
                self._expect("headers", self.header_timeout)
        elif self._waiting_for != "body":
            self._expect("body", self.body_timeout)
        else:
            self._since = self.loop.time()  # a body's bytes came: its idle time starts again

    def _request(self, path: str, raw_path: bytes, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool) -> None:
        """One complete request, run as HttpToolsProtocol.on_headers_complete and on_message_complete run it,
        or on the direct path (service/http_direct.py)."""
        cycle: RequestResponseCycle | DirectCycle
        if self._over_bound():  # POST: never a liveness probe
            app, direct = _busy, None
        else:
            direct = self.repeat.route(path, headers) if self.direct_app is not None else None  # None with X-Forwarded-*
            app = self.direct_app if direct is not None else self._app_for(headers)
        existing = self.cycle
        if direct is not None:
            self.cycle = cycle = DirectCycle(self, path, raw_path, headers, body, keep_alive, direct)
        else:
            self.cycle = cycle = self._cycle(path, raw_path, headers, body, keep_alive)
        if existing is None or existing.response_complete:
            self._running = cycle
            # a direct request whose answer can be written at once: no task, where its job can go at once
            if direct is None or self.flow.write_paused or not cycle.start(app):  # type: ignore[union-attr]
                self._start_asgi_task(cycle, app)
        else:  # pipelined behind an answer in progress: queued, and no more reading meanwhile
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def _large(self, event: tuple, left: int) -> None:
        """A request whose body's ``left`` last bytes are still on the socket, served by http_body.LargeRequest
        on uvicorn's request cycle, as ``_request`` serves a whole one (pipelined likewise)."""
        path, raw_path, headers, start, keep_alive = event
        reader = BodyReader(self, start, left)  # the connection's protocol until the body is in
        self._expect("body", self.body_timeout)
        route = None
        if self._over_bound():
            app = _busy
        else:
            route = self.repeat.route(path, headers)  # None with X-Forwarded-*: the proxy middleware's app then
            app = self._app_for(headers)
        cycle = self._cycle(path, raw_path, headers, b"", keep_alive)
        cycle.more_body = True
        cycle.message_event.clear()  # set once LargeRequest has the body
        existing, self.cycle = self.cycle, cycle
        large = LargeRequest(reader, len(start) + left, self.direct_app, app, route)  # type: ignore[arg-type]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, large)
        else:  # pipelined behind an answer in progress (reading paused: the reader reads only when asked)
            self.pipeline.appendleft((cycle, large))

    def _app_for(self, headers: list[tuple[bytes, bytes]]) -> Any:
        """The app behind uvicorn's cycle for a request with ``headers``: uvicorn's proxy headers middleware
        only where X-Forwarded-* headers are (it changes nothing in any other request)."""
        return self.app if any(name.startswith(b"x-forwarded-") for name, _ in headers) else self.inner

    def _cycle(self, path: str, raw_path: bytes, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool) -> RequestResponseCycle:
        """uvicorn's request cycle of a complete request, its whole body there (HttpToolsProtocol.on_message_complete)."""
        scope = {
            "type": "http", "asgi": self.asgi, "http_version": "1.1", "server": self.server, "client": self.client,
            "scheme": self.scheme, "root_path": "", "headers": headers, "state": self.app_state.copy(),
            "method": "POST", "path": path, "raw_path": raw_path, "query_string": b"",
        }
        cycle = RequestResponseCycle(
            scope=scope, transport=self.transport, flow=self.flow, logger=self.logger, access_logger=self.access_logger,
            access_log=self.access_log, default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
            on_response=self.on_response_complete)
        cycle.body = body  # bytes: receive() hands it on without a copy
        cycle.more_body = False
        cycle.message_event.set()
        return cycle

    def _start_asgi_task(self, cycle: RequestResponseCycle | DirectCycle, app) -> None:  # type: ignore[override]
        if isinstance(cycle, DirectCycle):  # no scope to mark
            self._running = cycle
            HttpToolsProtocol._start_asgi_task(self, cycle, app)  # type: ignore[arg-type]
        else:
            super()._start_asgi_task(cycle, app)

    async def run_cycle(self, direct: DirectCycle, app) -> None:
        """Run ``direct``'s request on uvicorn's request cycle with ``app`` after all (its route, or an error's
        answer), from ``direct``'s task; the cycle takes its place in the protocol."""
        cycle = self._cycle(direct.path, direct.raw_path, direct.headers, direct.body, direct.keep_alive)
        cycle.disconnected = direct.disconnected
        if self.cycle is direct:
            self.cycle = cycle
        self._mark(cycle)
        await cycle.run_asgi(app)

    # -- keep-alive: uvicorn cancels a timer on every read and makes a new one after every answer; here
    #    one timer lives on, re-armed only when it fires (http_guard's way), the idle time read from the clock

    def on_response_complete(self) -> None:
        if self.native is None:
            super().on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(self._idle_since + self.timeout_keep_alive, self._keep_alive_check)

    def _keep_alive_check(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None or self.native is None:  # busy now (the next answer re-arms it), or httptools' connection
            return
        due = self._idle_since + self.timeout_keep_alive
        if self.loop.time() < due:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_check)
        elif not self.transport.is_closing():
            self.transport.close()
