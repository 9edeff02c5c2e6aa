"""gRPC's transport on the HTTP process's event loop: HTTP/2 in C through libnghttp2 (service/native/
h2grpc.c), calls in Python. grpcio's asyncio server spent ~80% of vkact's gRPC CPU in its own machinery
(its Cython layer, a completion-queue thread, GIL hand-offs: py-spy under h2load); here a request costs
one ``receive``, one task and one ``reply``.

A route is the answer to one ``:path``: ``unary`` maps the request message's bytes to the answer's bytes;
``streaming`` gets the request's bytes and a ``send`` for each answer message (grpc.health.v1 Watch);
``bidi`` gets the request messages as they arrive (an async iterator that ends with the client's half
of the stream) and a ``send`` (ModelStreamInfer, reflection): h2grpc hands over each message as it
completes, and the budget holds it until the call has taken it.
Failures become grpc-status and grpc-message through ``error_status``; the client's deadline
(grpc-timeout) cancels the call with DEADLINE_EXCEEDED, a client's reset cancels it silently.

Bounds: ``max_calls`` calls at once over all connections (RESOURCE_EXHAUSTED beyond, as grpcio's
maximum_concurrent_rpcs), ``max_connections`` connections (closed at once beyond), ``max_streams``
streams per connection (HTTP/2 SETTINGS: the client queues beyond), ``max_message`` bytes a message
(RESOURCE_EXHAUSTED beyond, without buffering it), a message's bytes and what it inflates to within
the process's budget of bytes in flight (``budget``, service/inflight.py, shared with the HTTP side):
partial messages as they arrive (RESOURCE_EXHAUSTED for one that would pass it), a whole message and
its inflation by its call (UNAVAILABLE while other requests hold the budget); and a connection stops
being read while its answers wait for the client to read them. A message's memory follows the bytes
that arrived (h2grpc grows it as DATA comes), never what its prefix announces.

Answers pass through the same budget: a call's answer takes its place there when the call gives its
request back, and holds it until nghttp2 takes its last frame (``Session.answers``: what the client's
flow-control window holds back); one that does not fit beside what others hold is dropped and the call
answered UNAVAILABLE (RESOURCE_EXHAUSTED when it could never fit), so a client that never reads holds at
most the budget. A connection whose unread answers pass ``max_unread`` bytes gets no new call computed
(RESOURCE_EXHAUSTED) until it reads. Answers go to the socket ``WRITE_CHUNK`` bytes at a time and not
while the transport's write buffer is over its high-water mark: a client that opens a huge window but
never reads the socket leaves them queued (and counted), not in the transport's buffer.

Deadlines (guard.py, one timer per connection): a connection with no stream open for ``idle_timeout`` is
told GOAWAY and closed, a request that receives nothing for ``body_timeout`` is answered CANCELLED and
reset, and a connection whose client takes none of its answers for ``body_timeout`` is cut."""
from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from ...errors import InvalidRequest, PayloadTooLarge
from ...inflight import Claim, InflightBudget
from ...limits import GRPC_MAX_STREAMS
from ...native import h2grpc
from ..v2.encoding import Inflater, inflated
from .guard import ConnectionGuard
from .status import (DEADLINE_EXCEEDED, INTERNAL, INVALID_ARGUMENT, OK, RESOURCE_EXHAUSTED, UNAVAILABLE, UNIMPLEMENTED, RpcError,
                     deadline_seconds, percent_encoded, status_text)

log = logging.getLogger("vkact.grpc")

Send = Callable[[bytes], None]


@dataclass(frozen=True)
class Route:
    unary: Callable[[bytes], Awaitable[bytes]] | None = None
    streaming: Callable[[bytes, Send], Awaitable[None]] | None = None
    bidi: Callable[[AsyncIterator[bytes | memoryview], Send], Awaitable[None]] | None = None  # read by h2grpc


#: ``error_status(exc)`` -> (gRPC status code, message) for a call that raised.
ErrorStatus = Callable[[BaseException], tuple[int, str]]

_PROBLEMS = {  # h2grpc's reason for a body that is not one whole message
    "too-large": (RESOURCE_EXHAUSTED, "the request message is larger than the server accepts ({limit} bytes)"),
    "extra": (INVALID_ARGUMENT, "a unary request carries more than one message"),
    "incomplete": (INTERNAL, "the request stream ended inside its message"),
    "over-budget": (RESOURCE_EXHAUSTED, "the server holds as many partially received request bytes as it may; retry later"),
}
#: Bytes handed to the transport per write: with its high-water mark (asyncio's 64 KiB), what one
#: connection's socket buffer holds beyond the counted answers (plus one 16 KiB frame).
WRITE_CHUNK = 1 << 16
class GrpcTransport:
    def __init__(self, routes: dict[str, Route], error_status: ErrorStatus, *, max_message: int, max_calls: int,
                 max_connections: int, budget: InflightBudget, max_streams: int = GRPC_MAX_STREAMS, window: int = 4 << 20,
                 idle_timeout: float = 300.0, body_timeout: float = 30.0) -> None:
        self.routes = {path.encode(): route for path, route in routes.items()}
        self.budget = budget  # request bytes in flight, shared with the HTTP side (service/inflight.py)
        self.error_status = error_status
        self.max_message, self.max_calls, self.max_connections = max_message, max_calls, max_connections
        self.max_streams, self.window = max_streams, window
        self.idle_timeout, self.body_timeout = idle_timeout, body_timeout  # guard.py
        self.max_unread = budget.limit // 2  # a connection's unread answers past it: no new call is computed
        self.calls = 0
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int, reuse_port: bool) -> None:
        loop = asyncio.get_running_loop()
        # One process: the port exclusively, so a second server fails instead of sharing clients.
        self._server = await loop.create_server(lambda: _Connection(self), host, port, reuse_port=reuse_port or None,
                                                reuse_address=True, backlog=1024)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float) -> None:
        """No new connections; each open one is told to start no new call (GOAWAY); calls in progress
        get ``grace`` seconds; then every connection closes."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = asyncio.get_running_loop().time() + grace
        while self.calls and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.connections):
            conn.close()


class _Connection(asyncio.Protocol):
    def __init__(self, server: GrpcTransport) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.session: h2grpc.Session | None = None
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, asyncio.Task] = {}
        self.expired: set[int] = set()  # calls their deadline cancelled: answered DEADLINE_EXCEEDED
        self.reserved = 0  # bytes of the budget this connection holds: its partial messages, whole ones until a call takes them
        self.requests: dict[int, tuple[asyncio.Queue, Claim]] = {}  # a bidi call's messages not yet taken (None: the end)
        self.unread = 0  # bytes of the budget this connection's queued answers hold (Session.answers once flushed)
        self.writing = True  # False while the transport's write buffer is over its high-water mark
        self.read_at = 0.0  # when the client last took answer bytes, or answers began to wait for it (guard.py)
        self.guard: ConnectionGuard | None = None

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvloop's is not a subclass
        self.transport = transport
        server = self.server
        if len(server.connections) >= server.max_connections:
            transport.abort()  # as the HTTP port's connection bound: a flood holds nothing
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        server.connections.add(self)
        self.session = h2grpc.Session(server.routes, server.max_message, server.max_streams, server.window)
        self.guard = ConnectionGuard(self, server.idle_timeout, server.body_timeout)
        self.flush()

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None:
            return
        budget = self.server.budget
        session.room = self.reserved + max(0, budget.limit - budget.held)  # partial messages grow into what is left
        try:
            events = session.receive(data)
        except (h2grpc.H2Error, MemoryError) as exc:  # nghttp2 has queued its GOAWAY: send it, then close
            log.debug("gRPC connection closed: %r", exc)
            self._charge(session.buffered)
            self.flush()
            self.close()
            return
        # held now: the partial messages, and the whole ones until their calls take them over
        self._charge(session.buffered + sum(len(message) for _, route, message, _, _ in events if route is not None and message is not None))
        for stream_id, route, message, timeout, encoding in events:
            if route is None:  # the client reset a call in progress
                task = self.calls.pop(stream_id, None)
                if task is not None:
                    task.cancel()
            elif route.bidi is not None and (message is not None or encoding == "end"):
                self._stream_message(stream_id, route, message, timeout, encoding)
            elif message is None:
                task = self.calls.get(stream_id)  # a bidi call under way: its stream ends here
                if task is not None:
                    task.cancel()
                code, text = _PROBLEMS.get(encoding, (INTERNAL, "malformed request stream"))
                self.finish(stream_id, code, text.format(limit=self.server.max_message))
            else:
                claim = self._start(stream_id, route, message, timeout, encoding)
                if claim is None:
                    self._charge(self.reserved - len(message))
                else:
                    self._hand_over(claim, message)
        self.flush()

    def _start(self, stream_id: int, route: Route, message: bytes | None, timeout: bytes | None, encoding: bytes | None) -> Claim | None:
        """The call's task, with its claim on the budget; None (answered RESOURCE_EXHAUSTED) beyond max_calls."""
        if self.server.calls >= self.server.max_calls:
            self.finish(stream_id, RESOURCE_EXHAUSTED, f"more than {self.server.max_calls} calls at once (VKACT_MAX_CONNECTIONS)")
            return None
        if self.unread > self.server.max_unread:  # the client does not read its answers: compute no more
            self.finish(stream_id, RESOURCE_EXHAUSTED, f"this connection holds {self.unread} bytes of answers its client has not "
                        f"read (more than {self.server.max_unread}); read them first")
            return None
        self.server.calls += 1
        claim = self.server.budget.claim()  # the message's bytes, and what they inflate to, while the call runs
        task = self.loop.create_task(self._call(stream_id, route, message, timeout, encoding, claim))
        # the bookkeeping in a done callback: a task cancelled before its first step (a request
        # and its reset in one read) never runs its coroutine's finally
        task.add_done_callback(functools.partial(self._ended, stream_id, claim))
        self.calls[stream_id] = task
        return claim

    def _hand_over(self, claim: Claim, message: bytes) -> None:
        """``message``'s bytes pass from this connection's share of the budget to its call's claim."""
        claim.adopt(len(message))
        self.reserved -= len(message)

    def _stream_message(self, stream_id: int, route: Route, message: bytes | None, timeout: bytes | None, encoding: object) -> None:
        """A bidi call's message (None: the client's end of its requests); the first one starts the call."""
        entry = self.requests.get(stream_id)
        if entry is None:
            claim = self._start(stream_id, route, None, timeout, None)
            if claim is None:
                if message is not None:
                    self._charge(self.reserved - len(message))
                return
            entry = self.requests[stream_id] = (asyncio.Queue(), claim)
        if message is not None:
            self._hand_over(entry[1], message)
        entry[0].put_nowait(None if message is None else (message, encoding))

    async def _messages(self, stream_id: int) -> AsyncIterator[bytes | memoryview]:
        """A bidi call's messages, inflated; each leaves the budget once the call has taken it."""
        requests, claim = self.requests[stream_id]
        while (item := await requests.get()) is not None:
            message, encoding = item
            if encoding is not None:  # inflating up to max_message bytes, in threads
                message = await _inflated(message, encoding, self.server.max_message, claim)
            yield message
            claim.shrink(len(message))

    def pause_writing(self) -> None:  # answers wait for the client: read no more requests meanwhile
        self.writing = False
        self.read_at = self.loop.time()
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing = True
        self.read_at = self.loop.time()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            self.flush()

    def _charge(self, held: int) -> None:
        """This connection's share of the budget becomes ``held`` bytes (what it received and still holds)."""
        budget = self.server.budget
        delta, self.reserved = held - self.reserved, held
        if delta < 0:
            budget.release(-delta)
        elif delta and not budget.try_reserve(delta):
            budget.release(-delta)  # within the room set before the read; a thread took some since: count it anyway

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.guard is not None:
            self.guard.stop()
        self._charge(0)
        self.server.budget.release(self.unread)
        self.unread = 0
        for task in self.calls.values():
            task.cancel()
        self.calls.clear()
        self.session = None

    # -- calls ----------------------------------------------------------------------------------

    async def _call(self, stream_id: int, route: Route, message: bytes | None, timeout: bytes | None, encoding: bytes | None,
                    claim: Claim) -> None:
        deadline = None
        try:
            if encoding is not None:  # inflating up to max_message bytes, in threads
                assert message is not None
                message = await _inflated(message, encoding, self.server.max_message, claim)
            if timeout is not None:
                seconds = deadline_seconds(timeout)
                if seconds is None:
                    raise RpcError(INTERNAL, f"malformed grpc-timeout {timeout!r}")
                deadline = self.loop.call_later(seconds, self._expire, stream_id)
            if route.unary is not None:
                assert message is not None
                answer = await route.unary(message)
                claim.release()  # the request is done with: its bytes give way to the answer's
                if self._hold_answer(stream_id, answer):
                    assert self.session is not None
                    self.session.reply(stream_id, answer)
            elif route.bidi is not None:
                await route.bidi(self._messages(stream_id), lambda m: self._send(stream_id, m))
                self.finish(stream_id, OK, "")
            else:
                assert route.streaming is not None and message is not None
                await route.streaming(message, lambda m: self._send(stream_id, m))
                self.finish(stream_id, OK, "")
        except asyncio.CancelledError:
            if stream_id in self.expired:
                self.finish(stream_id, DEADLINE_EXCEEDED, "deadline exceeded")
        except RpcError as exc:
            self.finish(stream_id, exc.code, exc.message)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its code
            self.finish(stream_id, *self.server.error_status(exc))
        finally:
            if deadline is not None:
                deadline.cancel()

    def _ended(self, stream_id: int, claim: Claim, task: asyncio.Task) -> None:
        claim.release()
        self.server.calls -= 1
        if self.calls.get(stream_id) is task:
            del self.calls[stream_id]
        self.expired.discard(stream_id)
        self.requests.pop(stream_id, None)  # its messages not taken leave the budget with the claim
        self.flush()

    def streams_reset(self, stream_ids: list[int]) -> None:
        """Streams h2grpc answered and reset (their requests stalled: guard.py): their calls end, their
        partial messages leave the budget."""
        for stream_id in stream_ids:
            task = self.calls.pop(stream_id, None)
            if task is not None:
                task.cancel()
        if self.session is not None:
            self._charge(self.session.buffered)
        self.flush()

    def _expire(self, stream_id: int) -> None:
        task = self.calls.get(stream_id)
        if task is not None:
            self.expired.add(stream_id)
            task.cancel()

    def _send(self, stream_id: int, message: bytes) -> None:
        if self._hold_answer(stream_id, message):
            assert self.session is not None
            self.session.send(stream_id, message)
            self.flush()
        else:
            task = self.calls.get(stream_id)  # answered with its error: the stream's call ends
            if task is not None:
                task.cancel()

    def _hold_answer(self, stream_id: int, answer: bytes) -> bool:
        """Whether ``answer`` may be queued: its bytes taken from the budget until nghttp2 takes them. If
        not (the budget held by others, or the stream gone), the call is answered here and False."""
        if self.session is None:
            return False
        budget = self.server.budget
        if budget.try_reserve(len(answer)):
            if not self.unread:
                self.read_at = self.loop.time()  # answers begin to wait for the client now
            self.unread += len(answer)
            return True
        if len(answer) > budget.limit:
            self.finish(stream_id, RESOURCE_EXHAUSTED, f"the answer ({len(answer)} bytes) is larger than all answers and "
                        f"requests in flight may hold (VKACT_INFLIGHT_BYTES)")
        else:
            self.finish(stream_id, UNAVAILABLE, "the memory for answers and requests in flight (VKACT_INFLIGHT_BYTES) is "
                        "held by answers clients have not read yet; retry shortly")
        return False

    def finish(self, stream_id: int, code: int, message: str) -> None:
        if self.session is not None:
            self.session.finish(stream_id, code, percent_encoded(status_text(message)) if message else b"")

    def flush(self) -> None:
        session, transport = self.session, self.transport
        if session is None or transport is None or transport.is_closing():
            return
        # a chunk at a time while the transport takes them: write() calls pause_writing past its mark
        while self.writing and (data := session.pending(WRITE_CHUNK)):
            transport.write(data)
        if self.unread != session.answers:  # what nghttp2 took (or a reset dropped) leaves the budget
            if session.answers < self.unread:
                self.read_at = self.loop.time()
            self.server.budget.release(self.unread - session.answers)
            self.unread = session.answers
        if not session.open:
            self.close()

    def shutdown(self) -> None:
        if self.session is not None:
            self.session.goaway()
            self.flush()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def _inflated(message: bytes, encoding: bytes, limit: int, claim: Claim) -> memoryview:
    """A compressed message (grpc-encoding gzip or deflate, as grpcio clients send them), inflated up to
    ``limit`` bytes within ``claim``: a small bomb grows past neither the message bound nor the budget
    of bytes in flight (v2.encoding.Inflater). The compressed message, charged to ``claim`` when it was
    handed over (_hand_over), is given back once inflated."""
    if encoding == b"":
        raise RpcError(INTERNAL, "a compressed message without grpc-encoding")
    if encoding not in (b"gzip", b"deflate"):
        raise RpcError(UNIMPLEMENTED, f"grpc-encoding {encoding.decode('latin-1')!r} is not supported (gzip, deflate, identity)")
    try:
        out = await inflated(Inflater(message, encoding.decode(), limit, claim, "request message"), first_on_loop=False)
    except InvalidRequest as exc:
        raise RpcError(INTERNAL, exc.message) from None
    except PayloadTooLarge as exc:
        raise RpcError(RESOURCE_EXHAUSTED, exc.message) from None
    claim.shrink(len(message))
    return out
