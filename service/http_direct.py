"""The direct HTTP/1.1 path: a repeated binary inference that h1http parsed (service/http_native.py),
answered without ASGI, as gRPC's transport answers a ModelInfer (service/api/grpc/infer.py).

Served "as uvicorn would have", each such request cost a scope dict, uvicorn's RequestResponseCycle and
its asyncio.Event, Starlette's Request and Response, and the ASGI messages their send() turns back into
bytes. Here one object (DirectCycle) stands where uvicorn's cycle stands in the protocol (its ``cycle``,
its pipeline, so keep-alive, Connection: close, pipelining order and write flow control stay the
protocol's). It looks the request's header up in the routes' caches (v2.routes.repeated,
v1.routes.repeated), runs the job through the data plane and writes the answer's status line, headers
and body, their headers built once per header, in one write (api.execution.send_whole).

Where nothing has to wait (DirectCycle.start: no answer in progress on the connection, writing not
paused, the device worker idle, a slot free, small inputs) that happens without a task or a coroutine:
the job is copied into its slot and sent from data_received (dataplane.execution.start), and the answer
is written from the reply's callback; a task per request, its coroutine layers and their wake-up were
about 15 us of a sequential /v1 request's p50 (bench/RESULTS.md). Otherwise one task does it
(dataplane.execution.execute: the request timeout, the client's departure), as it did before.

Only what the cache already decided comes this way: a /v2 or /v1 binary frame whose JSON header was
parsed and validated before, answered in binary from its header's cached JSON, or a /v2 request sent as
JSON whose structure (all but its tensors' values) was decided before (v2.json_repeat: its values
decoded and checked, its answer's values written, as the route does); no X-Request-ID given, no
Content-Encoding, no compressed answer asked (/v2), output at most LARGE bytes. Anything else, and any
request the route must decide (its first, a limit it breaks), goes to the route on uvicorn's request
cycle as before; an error raised on the way (busy, timeout, a lost worker) is answered by the same error
handlers (hot_routes.answer), counted against the operator as the route counts it.
"""
from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Union

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .api import hot_routes
from .api.execution import count_against, end_response, send_whole, write_whole
from .api.v1 import routes as v1
from .api.v2 import json_repeat, routes as v2
from .api.v2.encoding import choose_encoding
from .dataplane.execution import execute, record_success, start, startable
from .limits import UNCHARGED_BYTES
from .jobs import Repeatable, Result
from .worker import DeviceWorker

if TYPE_CHECKING:
    from .api.runtime import Runtime
    from .http_native import NativeHttpProtocol
    from .operators import OperatorDesc

_V2 = (v2.infer, v2.infer_version)
Parsed = Union[v1.Parsed, v2._Parsed, json_repeat.JsonParsed]  # a direct request's cached parse


class _NoEvent:
    """The protocol sets its cycle's message_event when the connection is lost; nothing waits on a direct request's."""

    @staticmethod
    def set() -> None:
        pass


def direct_route(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None, str | None] | None:
    """(model, version, Inference-Header-Content-Length) of a request the direct path may take: a /v2
    (model set) or /v1 (model None) inference with a binary frame, or a /v2 one without the header (JSON:
    its length None), nothing in its headers that the route (or uvicorn's proxy headers middleware,
    X-Forwarded-*) would answer differently; None for any other."""
    found = hot_routes.route("POST", path)
    if found is None:
        return None
    handler, params = found
    header_length = None
    for name, value in headers:
        if name == b"inference-header-content-length":
            if header_length is None:  # the first, as the route reads it (Starlette's Headers.get)
                header_length = value
        elif name == b"content-encoding" or name == b"x-request-id" or name.startswith(b"x-forwarded-"):  # the last: for the proxy middleware
            return None
        elif name == b"accept-encoding" and handler in _V2 and choose_encoding(value.decode("latin-1")) is not None:
            return None
    if handler in _V2:  # a JSON request without the header (v2.json_repeat)
        return params["model"], params.get("version"), None if header_length is None else header_length.decode("latin-1")
    if header_length is None:
        return None
    return None, None, header_length.decode("latin-1")


_UNPLANNED = object()


class Repeat:
    """A connection's previous request, kept for the next one: a client sends one request over and over
    (the same headers, a body of one length with the same JSON header), and its route and /v1 look-up
    come out the same each time. ``route`` is ``direct_route``'s answer, ``v1_look_up``
    ``v1.repeated``'s, each given without working it out again where the request matches the previous
    one: a comparison of bytes instead of a scan of the headers, a cut of the frame, a copy of its JSON
    header and a hash and look-up in the header cache (about 10 us a sequential request on the 2-core
    machine: bench/RESULTS.md). /v2's look-up is not kept: its answer also depends on the models loaded."""

    __slots__ = ("path", "headers", "direct", "v1", "rep")

    def __init__(self) -> None:
        self.path: str | None = None
        self.headers: list[tuple[bytes, bytes]] | None = None
        self.direct: tuple[str | None, str | None, str | None] | None = None
        # (Inference-Header-Content-Length, body length, the JSON header, max_tensor_bytes, its parse)
        self.v1: tuple[str, int, bytes, int, v1.Parsed] | None = None
        self.rep: tuple[object, DeviceWorker, Repeatable | None] | None = None  # (parse, worker, its Repeatable)

    def route(self, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None, str | None] | None:
        """``direct_route(path, headers)``, which depends on nothing else."""
        if path != self.path or headers != self.headers:
            self.path, self.headers, self.direct = path, list(headers), direct_route(path, headers)  # a copy: the cycle's may change
        return self.direct

    def v1_look_up(self, state: Runtime, header_length: str, body: bytes) -> tuple[v1.Parsed, memoryview] | None:
        """``v1.repeated(state, header_length, body)``. Kept: a parse that the header cache held for the same
        JSON header bytes, the same tail length and the same device limit (what its key holds), the device
        worker ready (ready_device) as then. The cache's own entry may go meanwhile: the parse is no less
        true for these bytes."""
        kept, worker = self.v1, state.worker
        if (kept is not None and worker is not None and worker.ready and worker.info is not None and kept[0] == header_length
                and kept[1] == len(body) and kept[3] == worker.info["max_tensor_bytes"] and body.startswith(kept[2])):
            return kept[4], memoryview(body)[len(kept[2]) :]
        plan = v1.repeated(state, header_length, memoryview(body))
        if plan is not None and worker is not None and worker.info is not None:
            raw = body[: len(body) - len(plan[1])]
            self.v1 = (header_length, len(body), raw, worker.info["max_tensor_bytes"], plan[0])
        return plan

    def repeatable(self, worker: DeviceWorker, parsed: Parsed) -> Repeatable | None:
        """``worker.repeatable`` of ``parsed``'s job (its layout, and the slot and template number of its
        last job), kept while the connection repeats the request."""
        kept = self.rep
        if kept is not None and kept[0] is parsed and kept[1] is worker:
            return kept[2]
        rep = worker.repeatable(parsed.op, parsed.key, parsed.in_place, parsed.spans())
        self.rep = (parsed, worker, rep)
        return rep


class DirectCycle:
    """A request on the direct path, where uvicorn's RequestResponseCycle stands in the protocol: the
    attributes the protocol (connection_lost, shutdown, the pipeline), http_guard and send_whole read
    and set; ``start(app)``, which answers it without a task where its job can go to the device at once;
    and ``run_asgi(app)``, which uvicorn's _start_asgi_task runs as the request's task otherwise."""

    __slots__ = ("proto", "path", "raw_path", "headers", "body", "transport", "flow", "default_headers", "keep_alive", "on_response",
                 "disconnected", "response_started", "response_complete", "waiting_for_100_continue", "route",
                 "app", "parsed", "started", "input_bytes", "later", "planned", "answer_id")
    message_event = _NoEvent

    def __init__(self, proto: NativeHttpProtocol, path: str, raw_path: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
                 keep_alive: bool, route: tuple[str | None, str | None, str | None]) -> None:
        self.proto, self.path, self.raw_path, self.headers, self.body = proto, path, raw_path, headers, body
        self.transport, self.flow = proto.transport, proto.flow
        self.default_headers = proto.server_state.default_headers
        self.keep_alive, self.on_response, self.route = keep_alive, proto.on_response_complete, route
        self.disconnected = self.response_started = self.response_complete = self.waiting_for_100_continue = False
        self.later: Coroutine[Any, Any, None] | None = None  # what the task runs instead of _serve (see _in_task)
        self.planned: object = _UNPLANNED  # _plan's answer
        self.answer_id: str | None = None  # a JSON request's id, which its answer's JSON carries (v2.json_repeat)

    def run_asgi(self, app: hot_routes.VkactApp) -> Coroutine[Any, Any, None]:
        later, self.later = self.later, None
        return later if later is not None else self._serve(app)

    def _plan(self, state: Runtime) -> tuple[Parsed, memoryview] | None:
        """The cached parse and the tensor bytes of a request the direct path answers; None: the route decides.
        Looked up once: ``start`` leaves it to the task where the job cannot go at once."""
        if self.planned is not _UNPLANNED:
            return self.planned  # type: ignore[return-value]
        self.planned = self._look_up(state)
        return self.planned

    def _look_up(self, state: Runtime) -> tuple[Parsed, memoryview] | None:
        model, version, header_length = self.route
        body = self.body
        # h1http's bodies are never charged to the budget of bytes in flight (read_body's rule); one over
        # a limit is the route's to refuse
        if len(body) > min(UNCHARGED_BYTES, state.settings.max_body_bytes, state.inflight.limit):
            return None
        if header_length is None:
            found = json_repeat.repeated_json(state, model, version, memoryview(body))  # type: ignore[arg-type]
            if found is None:
                return None
            parsed, tensors, self.answer_id = found
            return parsed, tensors
        if model is not None:
            return v2.repeated(state, model, version, header_length, memoryview(body))
        return self.proto.repeat.v1_look_up(state, header_length, body)

    # -- without a task: the job sent from data_received, the answer written from its reply's callback --

    def start(self, app: hot_routes.VkactApp) -> bool:
        """Send the request's job to the device now and answer it from the reply's callback (``_answered``),
        where it can go at once (dataplane.execution.start: the worker idle, a slot free); the protocol
        calls it only where the answer could be written at once too (no answer in progress, writing not
        paused). False, nothing done nor sent: the caller starts the task, which meets the same request
        (an error included) as before."""
        self.started = time.perf_counter()
        state = app.runtime
        if not startable(state):  # the task queues it
            return False
        plan = self._plan(state)
        if plan is None:
            return False
        parsed, tail = plan
        self.app, self.parsed = app, parsed
        try:
            rep = self.proto.repeat.repeatable(state.worker, parsed)  # type: ignore[arg-type]
            if rep is None:
                return False
            self.input_bytes = rep.input_bytes
            return start(state, rep, tail, self._answered, self.proto.loop)
        except Exception:  # noqa: BLE001 - nothing sent: the task path raises it again and answers it
            return False

    def _answered(self, result: Result | None, exc: BaseException | None) -> None:
        """The reply to ``start``'s job: the answer written at once, or an error answered in a task as
        ``_serve`` answers it."""
        parsed = self.parsed
        request_id = v2.fresh_request_id() if self.route[0] is not None else None
        if result is not None:
            try:
                try:
                    content, headers = _answer(parsed, result, self.answer_id)
                finally:
                    result.release()
            except Exception as error:  # noqa: BLE001
                exc = error
        if exc is not None:
            self._in_task(self.proto.run_cycle(self, _Failed(self.app, exc, parsed.op.type_name(), request_id)))  # type: ignore[arg-type]
            return
        assert result is not None
        headers = _with_id(headers, request_id)
        if self.flow.write_paused and not self.disconnected:  # the transport has no room: send_whole waits for it
            self._in_task(self._send(self.app.runtime, parsed.op, headers, content, self.started, result, self.input_bytes))
            return
        try:
            if write_whole(self, headers, content):
                end_response(self)
        except Exception as error:  # noqa: BLE001 - as uvicorn's run_asgi: logged, the connection closed
            self._lost(error)
            return
        record_success(self.app.runtime, parsed.op, self.started, result, self.input_bytes, parsed.op.output.total_bytes)

    def _in_task(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Finish the request in a task after all, as uvicorn runs one (the protocol's tasks)."""
        self.later = coroutine
        HttpToolsProtocol._start_asgi_task(self.proto, self, self.app)  # type: ignore[arg-type]

    # -- the task path -------------------------------------------------------------------------------

    async def _serve(self, app: hot_routes.VkactApp) -> None:
        started = time.perf_counter()
        state = app.runtime
        plan = self._plan(state)
        if plan is None:
            await self.proto.run_cycle(self, app)
            return
        parsed, tail = plan
        op = parsed.op
        request_id = v2.fresh_request_id() if self.route[0] is not None else None
        try:
            buffers = parsed.buffers(tail)
            result = await execute(state, op, buffers, parsed.in_place, parsed.key, self.proto._departure)
            if result is None:  # the client left: its connection is gone, nobody to answer
                return
            try:
                content, headers = _answer(parsed, result, self.answer_id)
            finally:
                result.release()
        except Exception as exc:  # noqa: BLE001 - answered by the route's error handlers
            await self.proto.run_cycle(self, _Failed(app, exc, op.type_name(), request_id))
            return
        await self._send(state, op, _with_id(headers, request_id), content, started, result, sum(b.nbytes for b in buffers))

    async def _send(self, state: Runtime, op: OperatorDesc, headers: list[tuple[bytes, bytes]], content: bytes, started: float,
                    result: Result, input_bytes: int) -> None:
        try:
            await send_whole(self, headers, content)
        except Exception as exc:  # noqa: BLE001 - as uvicorn's run_asgi: logged, the connection closed
            self._lost(exc)
            return
        record_success(state, op, started, result, input_bytes, op.output.total_bytes)

    def _lost(self, exc: Exception) -> None:
        self.proto.logger.error("Exception in the direct HTTP path", exc_info=exc)
        self.transport.close()


def _with_id(headers: list[tuple[bytes, bytes]], request_id: bytes | None) -> list[tuple[bytes, bytes]]:
    return headers if request_id is None else [*headers, (b"x-request-id", request_id)]


def _answer(parsed: Parsed, result: Result, answer_id: str | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The answer's body and HTTP headers (but X-Request-ID), the output copied from the slot (no view of it
    kept): a binary frame's cached JSON header and the output; a JSON request's (v2.json_repeat)."""
    if isinstance(parsed, json_repeat.JsonParsed):
        return parsed.answer(result, answer_id)
    data = parsed.output_view(result)  # first: /v1's head is built with its first answer
    return b"".join((parsed.head, data)), parsed.frame_headers  # type: ignore[arg-type, return-value]


class _Failed:
    """An ASGI app answering ``exc`` as the route would have: the same error handlers, the failure
    counted against ``operator``, /v2's X-Request-ID."""

    def __init__(self, app: hot_routes.VkactApp, exc: Exception, operator: str, request_id: bytes | None) -> None:
        self.app, self.exc, self.operator, self.request_id = app, exc, operator, request_id

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        scope["app"] = self.app
        await hot_routes.answer(self._raise, {}, scope, receive, send, self.request_id)

    async def _raise(self, request: Any) -> Any:
        count_against(request, self.operator)
        raise self.exc

