"""A large inference request's body read by the kernel straight into where it goes (h1http's large
requests: service/native/h1http.c ``body_left``, service/http_native.py).

Read as data_received chunks, every body byte was copied three times after the kernel's read: uvloop's
read buffer into a bytes object, httptools' body callback into another, then the chunks into the job's
slot (bench/RESULTS.md, "Where a 16 MiB ... CPU goes"). Here, once h1http has the request's head, the
connection's protocol is switched (``transport.set_protocol``) to a ``BodyReader``, an
asyncio.BufferedProtocol whose buffers are the body's destinations, and back once the body is in:

- a repeated /v2 binary request (its JSON header read first, then found in the routes' cache,
  v2.routes.repeated_large): its tensors are read into their places in the job's slot (``SocketInput``,
  a worker.Source: the slot is taken first: none free, a 503 before its tensors are read), the job run through
  the data plane, the answer written from the slot (its header and the slot in one writev); at most
  half the worker's slots are read into at once (``slot_readers``), the requests beyond are read whole;
- any other (its first request, /v1, JSON, a graph model, anything the route must decide): the body read
  into one buffer and run on uvicorn's request cycle, whole, as a small body is; the route's read_body
  takes over its charge on the budget of bytes in flight (``PREPAID_KEY``).

Either way the body is charged to the budget of bytes in flight as it is read, each piece before it is
read, a piece no larger than what came before it (``read_charged``; 413 before any is read when it never
fits, 503 when others hold the budget): a client that declares a large body and sends it slowly holds
at most twice what it sent and a step, not the whole declared length, nearly as on httptools' path.
The body idle timeout holds (http_guard: each read restarts it, a read nobody asked for yet is not
timed), and the connection stays on h1http for the requests after it. An error answered before the body was read (no slot free, the budget)
is followed by the rest of the body read and dropped, as httptools drops it; a body not read to its end otherwise (the client
left, an exception) ends the connection. A destination is never written after its read ends (a slot
given back is another request's).
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.requests import ClientDisconnect

from .api.execution import CYCLE_KEY, PREPAID_KEY, send_whole
from .api.v2 import routes as v2
from .dataplane.execution import record_success, watched
from .errors import Busy, PayloadTooLarge
from .http_direct import _Failed
from .http_guard import _busy
from .inflight import Claim
from .limits import IN_FLIGHT, UNCHARGED_BYTES
from .jobs import LARGE

if TYPE_CHECKING:
    from .api.hot_routes import VkactApp
    from .http_native import NativeHttpProtocol

SPILL_BYTES = 1 << 16  # body bytes read before anyone asked for them (reading resumed elsewhere) kept, then reading pauses
CHARGE_STEP = 1 << 16  # a large body's first piece charged to the budget of bytes in flight before it is read


class BodyReader(asyncio.BufferedProtocol):
    """The connection's protocol while the rest of one request's body is read: ``read_into`` fills a
    caller's buffer from the socket. Everything else a protocol is told goes to the HTTP protocol."""

    def __init__(self, proto: NativeHttpProtocol, start: bytes, left: int) -> None:
        self.proto = proto
        self.pending = bytearray(start)  # body bytes read and not handed out yet
        self.left = left                 # body bytes still on the socket
        self.target: memoryview | None = None
        self.filled = 0
        self.waiter: asyncio.Future[None] | None = None
        self.spill = bytearray()
        self.lost = False
        proto.flow.pause_reading()  # until a read asks for bytes
        proto.transport.set_protocol(self)

    @property
    def done(self) -> bool:
        """The whole body has been read from the socket (the HTTP protocol reads the connection again)."""
        return self.left == 0

    async def read_into(self, dst: memoryview) -> None:
        """Fill ``dst`` (bytes, within what is left of the body) with the body's next bytes; ClientDisconnect
        when the connection is lost first. Once it returns or raises, ``dst`` is never written again."""
        n = min(len(self.pending), len(dst))
        if n:
            dst[:n] = self.pending[:n]
            del self.pending[:n]
        if n == len(dst):
            return
        if self.lost:
            raise ClientDisconnect()
        if len(dst) - n > self.left:
            raise ValueError("a read past the body's end")
        self.target, self.filled = dst, n
        self.waiter = waiter = self.proto.loop.create_future()
        self.proto.flow.resume_reading()
        try:
            await waiter
        finally:
            self.target = self.waiter = None  # not filled (cancelled, lost): no more bytes go there

    async def discard(self) -> None:
        """Read the rest of the body and drop it (the connection's next request follows it)."""
        scratch = memoryview(bytearray(min(len(self.pending) + self.left, 1 << 20)))
        while rest := len(self.pending) + self.left:
            await self.read_into(scratch[: min(rest, len(scratch))])

    # -- asyncio.BufferedProtocol ---------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview | bytearray:
        if self.target is not None:
            return self.target[self.filled :]
        self.spill = bytearray(min(self.left, SPILL_BYTES))  # nobody reading: kept for the next read
        return self.spill

    def buffer_updated(self, nbytes: int) -> None:
        proto = self.proto
        proto._since = proto.loop.time()  # a body's bytes came: its idle time starts again (http_guard)
        proto._idle_since = None  # not idle: the keep-alive timer leaves the connection open (an answer may be out)
        self.left -= nbytes
        if self.target is None:
            self.pending += memoryview(self.spill)[:nbytes]
            if len(self.pending) >= SPILL_BYTES:
                proto.flow.pause_reading()
        else:
            self.filled += nbytes
            if self.filled == len(self.target):
                waiter, self.target = self.waiter, None
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                if self.left:
                    proto.flow.pause_reading()  # until the next read asks
        if self.left == 0:  # the body is in: the next bytes are the next request's, h1http's again
            proto._waiting_for = ""
            proto.transport.set_protocol(proto)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.target = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ClientDisconnect())
        self.proto.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return self.proto.eof_received()

    def pause_writing(self) -> None:
        self.proto.pause_writing()

    def resume_writing(self) -> None:
        self.proto.resume_writing()


async def read_charged(reader: BodyReader, claim: Claim, dst: memoryview) -> None:
    """Fill ``dst`` with the body's next bytes, ``claim`` grown by each piece before it is read (Busy, a
    503, where others hold the budget meanwhile). A piece is as large as what the claim holds, at least
    CHARGE_STEP: the charge runs at most one piece ahead of the bytes that came (a client that stalls
    holds no more than twice what it sent and a step), in few pieces (9 for 16 MiB)."""
    at = 0
    while at < len(dst):
        piece = dst[at : at + max(CHARGE_STEP, claim.held)]
        claim.grow(len(piece))
        await reader.read_into(piece)
        at += len(piece)


def refuse_oversize(claim: Claim, nbytes: int) -> None:
    """PayloadTooLarge (413) before any of the body is read, where ``nbytes`` would never fit the budget."""
    if not claim.fits_alone(nbytes):
        claim.grow(nbytes)  # raises the budget's own 413


class SocketInput:
    """An input tensor still on the socket: read straight into the job's slot (worker.Source), charged as it is read."""

    __slots__ = ("reader", "claim", "size", "nbytes")

    def __init__(self, reader: BodyReader, claim: Claim, size: int, nbytes: int) -> None:
        self.reader, self.claim, self.size, self.nbytes = reader, claim, size, nbytes

    async def fill(self, dst: np.ndarray) -> None:
        await read_charged(self.reader, self.claim, memoryview(dst[: self.size]))
        dst[self.size :] = 0  # a descriptor's buffer is rounded up to 4 bytes


def slot_readers(queue_size: int) -> int:
    """How many requests of one HTTP process may read their tensors from the socket into a slot at once:
    half the worker's slots (queue_size + IN_FLIGHT). A slot is taken before its bytes arrive, so a
    client that sends a body slowly holds it for as long as it sends (a byte per body timeout); past
    this, or past half the slots' memory (``slot_reader_bytes``), bodies are read whole first (``_whole``,
    charged to the budget of bytes in flight as they come), so slow clients cannot take the slots that
    every request, a small one too, needs."""
    return max(1, (queue_size + IN_FLIGHT) // 2)


def slot_reader_bytes(slot_bytes: int) -> int:
    """The slot bytes that the requests reading into slots may hold together: half of VKACT_SLOT_BYTES,
    counted by the slots taken (a small job takes the smallest free slot that fits, which an earlier large
    one may have left). The count alone let four clients trickling 128 MiB tensors hold the 1 GiB default,
    every other request a 503 while they trickled."""
    return slot_bytes // 2


NOT_ADMITTED = object()  # _execute's answer where the slot taken would pass slot_reader_bytes


class LargeRequest:
    """The ASGI app that serves one large request on uvicorn's request cycle (its task, its place in the
    protocol's pipeline): reads its body through ``reader`` as the module's docstring says."""

    in_slots = 0  # this process's requests reading their tensors into a slot now (slot_readers bounds them)
    bytes_in_slots = 0  # the bytes of the slots they hold (slot_reader_bytes bounds them)

    def __init__(self, reader: BodyReader, length: int, runtime_app: VkactApp, app: Any,
                 route: tuple[str | None, str | None, str | None] | None) -> None:
        self.reader, self.length, self.runtime_app, self.app, self.route = reader, length, runtime_app, app, route
        self.head = b""  # the body's first bytes, read to look its JSON header up

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        cycle = scope[CYCLE_KEY]  # put there by http_guard (no access log: the only case h1http takes)
        try:
            if self.app is _busy:  # past the connection bound: answered without reading the body, then closed
                cycle.keep_alive = False
                await _busy(scope, receive, send)
            elif not await self._repeated(cycle, scope, receive, send):
                await self._whole(cycle, scope, receive, send)
            if not self.reader.done and cycle.response_complete and not cycle.transport.is_closing():
                await self.reader.discard()  # answered (an error) before the body was read: read and dropped, as httptools does
        except ClientDisconnect:  # gone mid-body: nobody to answer
            pass
        finally:
            if not self.reader.done and not cycle.transport.is_closing():  # its bytes can't be the next request's
                cycle.transport.close()

    async def _repeated(self, cycle: Any, scope: Any, receive: Any, send: Any) -> bool:
        """Serve a repeated /v2 binary request with its tensors read into the slot; False where the route decides."""
        if self.route is None or self.route[0] is None or self.route[2] is None:  # not /v2 binary: /v1, or JSON
            return False
        model, version, header_length = self.route
        state = self.runtime_app.runtime
        n = int(header_length) if header_length.isdigit() else 0
        if not 0 < n <= min(UNCHARGED_BYTES, self.length):
            return False
        head = bytearray(n)
        await self.reader.read_into(memoryview(head))
        self.head = bytes(head)
        parsed = v2.repeated_large(state, model, version, self.head, self.length - n)  # type: ignore[arg-type]
        if parsed is None:
            return False
        op = parsed.op
        room = slot_reader_bytes(state.settings.slot_bytes)
        need = sum(desc.total_bytes for desc in op.inputs) + op.output.total_bytes  # what any slot for it holds at least
        if LargeRequest.in_slots >= slot_readers(state.settings.queue_size) or LargeRequest.bytes_in_slots + need > room:
            return False  # the other slots, and their memory, stay others'
        held = 0

        def admit(slot_bytes: int) -> bool:  # the slot taken, before a byte is read into it
            nonlocal held
            if LargeRequest.bytes_in_slots + slot_bytes > room:
                return False
            held = slot_bytes
            LargeRequest.bytes_in_slots += held
            return True

        started = time.perf_counter()
        claim = state.inflight.claim()
        LargeRequest.in_slots += 1
        try:
            refuse_oversize(claim, self.length)
            claim.grow(len(self.head))
            inputs = [SocketInput(self.reader, claim, size, desc.total_bytes) for (_, size), desc in zip(parsed.binary, op.inputs)]
            result = await self._execute(state, op, inputs, parsed.key, admit)
        except ClientDisconnect:
            raise
        except Exception as exc:  # noqa: BLE001 - answered by the route's error handlers
            await self._fail(cycle, exc, op.type_name(), scope, receive, send)
            return True
        finally:
            LargeRequest.in_slots -= 1
            LargeRequest.bytes_in_slots -= held
            claim.release()
        if result is NOT_ADMITTED:  # nothing of the tensors read: the body is read whole, as past the bounds
            return False
        if result is None:  # the client left
            return True
        try:
            data = parsed.output(result)
            if data.nbytes > LARGE:  # from the slot, held until the socket has taken it
                await send_whole(cycle, parsed.frame_headers, (parsed.head, data), state.settings.body_timeout_s)  # type: ignore[arg-type]
            else:
                await send_whole(cycle, parsed.frame_headers, b"".join((parsed.head, data)))  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - as uvicorn's run_asgi: logged, the connection closed
            self.reader.proto.logger.error("Exception in the large HTTP body path", exc_info=exc)
            cycle.transport.close()
            return True
        finally:
            result.release()
        record_success(state, op, started, result, sum(i.nbytes for i in inputs), op.output.total_bytes)
        return True

    async def _execute(self, state: Any, op: Any, inputs: list[SocketInput], key: bytes, admit: Callable[[int], bool]) -> Any:
        """dataplane.execute with the tensors read into the slot first, outside the request timeout: a body
        comes at the client's pace, which the body idle timeout bounds (a slow link's repeated request
        was a 504 where its first, read whole before the route, was answered). NOT_ADMITTED where ``admit``
        refused the slot taken; None where the client left."""
        worker = state.worker
        job = await worker.filled(op, inputs, False, key, admit)
        if job is None:
            return NOT_ADMITTED
        running = worker.run_filled(job, sum(i.nbytes for i in inputs), state.metrics.triton.pending(op).add)
        try:
            return await watched(state, running, inputs, self.reader.proto._departure, op)
        finally:
            if inspect.getcoroutinestate(running) == inspect.CORO_CREATED:  # never run: its slot is still ours
                running.close()
                job.release()

    async def _whole(self, cycle: Any, scope: Any, receive: Any, send: Any) -> None:
        """The body read into one buffer, within the budget, and run on the cycle as a whole body."""
        claim = self.runtime_app.runtime.inflight.claim()
        try:
            try:
                refuse_oversize(claim, self.length)
                claim.grow(len(self.head))
                body = np.empty(self.length, np.uint8)  # its pages faulted in as the kernel fills them
                view = memoryview(body)
                view[: len(self.head)] = self.head
                await read_charged(self.reader, claim, view[len(self.head) :])
            except (PayloadTooLarge, Busy) as exc:  # 413 before the body is read, or 503 as it is
                await self._fail(cycle, exc, "-", scope, receive, send)
                return
            scope[PREPAID_KEY] = claim  # the route's read_body takes the charge over
            cycle.body, cycle.more_body = view, False
            cycle.message_event.set()
            await self.app(scope, receive, send)
        finally:
            claim.release()  # nothing, where the route took it over
            cycle.body = b""  # a route that answered without reading it (a 404) left it there, uncharged

    async def _fail(self, cycle: Any, exc: Exception, operator: str, scope: Any, receive: Any, send: Any) -> None:
        """Answer ``exc`` as the route would (the rest of the body is dropped after it: __call__)."""
        request_id = v2.fresh_request_id() if self.route is not None and self.route[0] is not None else None
        await _Failed(self.runtime_app, exc, operator, request_id)(scope, receive, send)

