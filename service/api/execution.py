"""What /v1 and /v2 share over HTTP around the data plane's execution (service/dataplane/execution.py):
the request body within the budget of bytes in flight, the client's departure, binary frames, and the
recording of an answer once it has been sent."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import numpy as np
from fastapi import Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH

from ..errors import InvalidRequest, PayloadTooLarge
from ..inflight import Claim
from ..operators import OperatorDesc
from ..jobs import copy_into, LARGE, Result, Source
from ..dataplane.execution import execute, record_success
from .chunked_body import Chunks
from .runtime import runtime
from .v2.encoding import decode_body

Handler = Callable[..., Awaitable[Response]]


CLAIM_KEY = "vkact.claim"  # scope key: the request's claim on the budget of bytes in flight (within_budget)
PREPAID_KEY = "vkact.prepaid"  # scope key: the claim a body read whole by the HTTP protocol holds (http_body.py)
from ..limits import UNCHARGED_BYTES
OPERATOR_KEY = "vkact.operator"  # scope key: the operator (model) a failure from then on counts against


def count_against(request: Request, operator: str) -> None:
    request.scope[OPERATOR_KEY] = operator


def within_budget(handler: Handler) -> Handler:
    """An inference handler whose request's bytes (its body as received and as inflated) are charged to
    one claim on the process's budget of bytes in flight (service/inflight.py), given back when the
    handler returns or raises: by then the body is dropped (tensors live on in the slot, bounded apart)."""

    @functools.wraps(handler)
    async def within(request: Request, *args: Any, **kwargs: Any) -> Response:
        claim = request.scope[CLAIM_KEY] = runtime(request).inflight.claim()
        try:
            return await handler(request, *args, **kwargs)
        finally:
            claim.release()

    return within


async def request_body(request: Request, limit: int, chunks: bool = False) -> memoryview | Chunks:
    """An inference's body, read and its Content-Encoding undone, within its handler's claim (within_budget).
    ``chunks``: a large body that is not compressed may come as its chunks (see read_body)."""
    claim: Claim = request.scope[CLAIM_KEY]
    coding = request.headers.get("content-encoding")
    body = await read_body(request, limit, claim, chunks and coding is None)
    if coding is None:
        return body
    received = claim.held  # what the body as received holds
    decoded = await decode_body(body, coding, limit, claim)  # type: ignore[arg-type]
    if decoded is not body:
        claim.shrink(received)  # the compressed body goes with this call
    return decoded


async def read_body(request: Request, limit: int, claim: Claim | None = None, chunks: bool = False) -> memoryview | Chunks:
    """The body as received, at most ``limit`` bytes, charged to ``claim`` as its chunks arrive.
    ``chunks``: a body that arrives in several chunks is returned as them (api/chunked_body.py), not joined."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest(f"Content-Length must be an integer, got {declared!r}", "Content-Length")
        if int(declared) > limit:
            raise PayloadTooLarge(f"the body is {declared} bytes; this service accepts at most {limit}", "Content-Length")
        if claim is not None and not claim.fits_alone(int(declared)):
            claim.grow(int(declared))  # 413: more than all requests in flight may hold
    message = await request.receive()
    if message["type"] == "http.request" and not message.get("more_body", False):  # a small body comes whole
        chunk = message.get("body", b"")
        if len(chunk) > limit:
            raise PayloadTooLarge(f"the body exceeds {limit} bytes", "Content-Length")
        if claim is not None and len(chunk) > UNCHARGED_BYTES:
            prepaid: Claim | None = request.scope.pop(PREPAID_KEY, None)
            if prepaid is not None:  # read within the budget already (service/http_body.py)
                prepaid.move_to(claim)
            else:
                claim.grow(len(chunk))
        return memoryview(chunk)
    if chunks:
        return await _read_chunks(request, message, limit, claim)
    # Filled in place: np.empty maps its pages lazily as chunks arrive, where a zeroed bytearray, or
    # one grown chunk by chunk, would spend tens of milliseconds on the event loop for a large body.
    body = np.empty(int(declared) if declared is not None else 1 << 16, np.uint8)
    filled = 0
    async for chunk in _body_chunks(request, message, limit, claim):
        end = filled + len(chunk)
        if end > body.nbytes:  # chunked transfer: grow geometrically
            body = np.concatenate((body[:filled], np.empty(max(end, 2 * body.nbytes) - filled, np.uint8)))
        body[filled:end] = np.frombuffer(chunk, np.uint8)
        filled = end
    return memoryview(body[:filled])


async def _read_chunks(request: Request, message: Message, limit: int, claim: Claim | None) -> Chunks:
    """read_body's chunks from ``message`` (the first) on, kept as they came: no copy on the event loop."""
    return Chunks([chunk async for chunk in _body_chunks(request, message, limit, claim) if chunk])


async def _body_chunks(request: Request, message: Message, limit: int, claim: Claim | None) -> AsyncIterator[bytes]:
    """The chunks of a body that arrives in several, from ``message`` (the first) on, each checked against
    ``limit`` (the body in all) and charged to ``claim`` before it is handed on; ClientDisconnect when the
    client goes before the last."""
    total = 0
    while message["type"] == "http.request":
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            raise PayloadTooLarge(f"the body exceeds {limit} bytes", "Content-Length")
        if claim is not None:
            claim.grow(len(chunk))  # 503 once the requests in flight hold the budget: the rest is not read
        yield chunk
        if not message.get("more_body", False):
            return
        message = await request.receive()
    raise ClientDisconnect()


async def _until_disconnected(request: Request) -> None:
    # Only called once the body has been read: what remains on the channel is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def departure(request: Request) -> Callable[[], Awaitable[object]]:
    """What returns when the client of ``request`` (its body read) has gone: a data plane call's ``departure``.
    Served by vkact's uvicorn protocol, a future its connection's loss completes (http_guard puts the
    factory in the scope): no task of its own awaiting the disconnect message, which cost a small request
    about a tenth of the HTTP process's time under load."""
    watch = request.scope.get(DEPARTURE_KEY)
    if watch is not None:
        return watch
    return lambda: _until_disconnected(request)


async def run_on_device(
    request: Request, op: OperatorDesc, buffers: Sequence[np.ndarray | Source], in_place: bool = False, key: bytes | None = None
) -> Result | None:
    """Run ``op`` on the device worker for an HTTP request; None means the client left (see execute)."""
    return await execute(runtime(request), op, buffers, in_place, key, departure(request))


async def binary_frame(head: bytes, buffers: Sequence[np.ndarray]) -> bytes | memoryview:
    """A JSON header followed by tensor bytes (Triton's binary frame), built in one allocation; large
    copies run in a thread, so the event loop stays free."""
    if sum(b.nbytes for b in buffers) <= LARGE:
        return b"".join((head, *buffers))
    frame = np.empty(len(head) + sum(b.nbytes for b in buffers), np.uint8)
    frame[: len(head)] = np.frombuffer(head, np.uint8)
    cursor = len(head)
    for b in buffers:
        await copy_into(frame[cursor : cursor + b.nbytes], b)
        cursor += b.nbytes
    return memoryview(frame)


class FrameResponse(Response):
    """A binary frame whose headers were built before (``frame_headers``), as a repeated request header
    allows: Starlette's Response builds them again for every answer. Served by vkact's uvicorn protocol
    (service/http_guard.py, which puts its request cycle in the scope), the status line, headers and
    body go out in one write (send_whole), not as two ASGI messages each written on its own.

    ``body`` may be parts (the JSON header, then views of a job's slot) with ``hold``, the job's result:
    the parts go to the socket as they are, no frame copied from them, and ``hold`` is released once
    the socket has taken every byte (or the connection is gone), never before (the slot's next request
    would overwrite bytes still to be sent). Released however the response ends."""

    def __init__(self, body: bytes | memoryview | tuple[bytes | memoryview, ...], raw_headers: list[tuple[bytes, bytes]],
                 hold: Releasable | None = None, stall_s: float = 30.0) -> None:
        self.status_code = 200
        self.body = body  # type: ignore[assignment]
        self.raw_headers = list(raw_headers)  # a copy: middleware may add to an answer's headers
        self.background = None
        self.hold, self.stall_s = hold, stall_s  # stall_s: how long the client may take no byte of a held answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            cycle = scope.get(CYCLE_KEY)
            if cycle is None or send != cycle.send:  # another server, or send wrapped by middleware
                if isinstance(self.body, tuple):
                    self.body = b"".join(self.body)
                await super().__call__(scope, receive, send)
                return
            await send_whole(cycle, self.raw_headers, self.body, self.stall_s if self.hold is not None else None)
        finally:
            if self.hold is not None:
                self.hold.release()
                self.hold = None
        if self.background is not None:
            await self.background()


class Releasable(Protocol):
    def release(self) -> None: ...


CYCLE_KEY = "vkact.cycle"  # scope key: uvicorn's request cycle (RequestResponseCycle), set by http_guard
DEPARTURE_KEY = "vkact.departure"  # scope key: a future done when the connection is lost (http_guard)
JOIN_BYTES = 1 << 16  # a body up to this size is copied behind the head into one buffer; a larger one goes by writev


async def send_whole(cycle: Any, headers: list[tuple[bytes, bytes]], body: bytes | memoryview | tuple[bytes | memoryview, ...],
                     until_written: float | None = None) -> None:
    """A 200 response with ``headers`` (valid ones: built by vkact, a request id checked printable) and
    ``body`` (its bytes, or parts) sent on uvicorn 0.54's httptools request cycle as its send() sends the
    two ASGI messages (flow control, a response already started, keep-alive, the pipelined request after
    it), in one write. ``until_written``: return only once the transport holds none of it, a client that
    takes no byte for that many seconds cut off (see _until_written)."""
    if cycle.flow.write_paused and not cycle.disconnected:
        await cycle.flow.drain()
    if not write_whole(cycle, headers, body, until_written is not None):
        return
    if until_written is not None:
        try:
            await _until_written(cycle.transport, cycle.flow, until_written)
        except BaseException:  # cancelled (a shutdown): the held bytes must not be sent once the slot is given back
            cycle.transport.abort()
            raise
    end_response(cycle)


def write_whole(cycle: Any, headers: list[tuple[bytes, bytes]], body: bytes | memoryview | tuple[bytes | memoryview, ...],
                held: bool = False) -> bool:
    """send_whole's write, without waiting for the transport's room (the caller has it: flow control not
    paused); False, nothing written, where the client has gone (its transport closing: the loss may not
    have reached the protocol yet). ``held``: the transport pauses writing while it holds any byte
    (send_whole's ``until_written``). ``end_response`` follows it."""
    if cycle.disconnected:
        return False
    if cycle.transport.is_closing():  # gone, or being closed: what it writes is lost either way
        cycle.disconnected = True  # uvicorn's cycle then writes no 500 of its own after the app returns
        return False
    if cycle.response_started:
        raise RuntimeError("a response was already started")
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    head = [_head_bytes(cycle.default_headers, headers, cycle.keep_alive)]
    parts = body if isinstance(body, tuple) else (body,)
    transport = cycle.transport
    if held:  # flow paused while the transport holds any byte, resumed once it holds none
        transport.set_write_buffer_limits(high=0, low=0)
    if sum(len(p) for p in parts) <= JOIN_BYTES:
        head += parts
        transport.write(b"".join(head))
    else:
        transport.writelines((b"".join(head), *parts))
    cycle.response_complete = True
    cycle.message_event.set()
    return True


_last_head: tuple[object, object, bool, bytes] = (None, None, True, b"")


def _head_bytes(default_headers: list[tuple[bytes, bytes]], headers: list[tuple[bytes, bytes]], keep_alive: bool) -> bytes:
    """An answer's status line and headers. The last one is kept: a client repeating one request gets
    the same header list (the route's cached frame headers) under the same server headers (uvicorn
    makes a new list when its Date changes, once a second)."""
    global _last_head
    last = _last_head
    if last[0] is default_headers and last[1] is headers and last[2] == keep_alive:
        return last[3]
    head = [b"HTTP/1.1 200 OK\r\n"]
    for name, value in (*default_headers, *headers):
        head += (name, b": ", value, b"\r\n")
    if not keep_alive:
        head.append(b"connection: close\r\n")
    head.append(b"\r\n")
    joined = b"".join(head)
    _last_head = (default_headers, headers, keep_alive, joined)
    return joined


def end_response(cycle: Any) -> None:
    """After an answer written whole: the connection closed where it is not kept alive, the next request's turn."""
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


async def _until_written(transport: Any, flow: Any, stall_s: float) -> None:
    """Wait until ``transport`` holds no byte handed to it, or its connection is gone. A client that
    takes no byte for ``stall_s`` has its connection aborted (the bytes dropped, not flushed): what it
    holds is a job's slot, which other requests need."""
    left = transport.get_write_buffer_size()
    while left and not transport.is_closing():  # closing: the connection is gone, nothing more is sent
        if not flow.write_paused:  # not expected (paused while any byte is held): poll, never spin
            await asyncio.sleep(0.001)
        else:
            try:
                await asyncio.wait_for(flow.drain(), stall_s)
            except asyncio.TimeoutError:
                if transport.get_write_buffer_size() >= left:
                    transport.abort()
                    return
        left = transport.get_write_buffer_size()


def frame_headers(head_bytes: int, body_bytes: int) -> list[tuple[bytes, bytes]]:
    """A binary frame's headers, as Starlette's Response writes them."""
    return [(HEADER_LENGTH.lower().encode(), str(head_bytes).encode()), (b"content-length", str(body_bytes).encode()),
            (b"content-type", BINARY_CONTENT_TYPE.encode())]


def answered(response: Response, request: Request, op: OperatorDesc, started: float, result: Result, bytes_in: int, bytes_out: int) -> Response:
    """``response``, recording the execution's success once it has been sent (off the latency path)."""
    response.background = _Record(request, op, started, result, bytes_in, bytes_out)  # type: ignore[assignment]
    return response


class _Record:
    """A response's background work: Starlette awaits ``background()`` after the body is sent. A plain
    async callable: a BackgroundTask inspects its function on every construction."""

    __slots__ = ("args",)

    def __init__(self, *args: object) -> None:
        self.args = args

    async def __call__(self) -> None:
        request, *rest = self.args
        record_success(runtime(request), *rest)  # type: ignore[arg-type]
