"""gRPC's connection deadlines (service/api/grpc/guard.py over h2grpc's Session.idle and reset_stalled), at
the wire with a raw HTTP/2 client: an idle connection is told GOAWAY and closed (PINGs do not keep it),
a request that stops mid-way is answered CANCELLED and reset, a client that stops reading its answers is
cut, and each gives back what it held. The transport runs in this process with limits of a fraction of a
second; the last test runs a server with its limits set through the environment. Every wait polls with
a generous timeout: behaviour is asserted, never a time."""
from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pytest

from service.api.grpc.status import INTERNAL
from service.api.grpc.transport import GrpcTransport, Route, Send
from service.inflight import InflightBudget
from tests.service.conftest import start_server, stop_server
from tests.service.h2_client import PREFACE, H2Client, frame, framed, literal_headers, unread_calls
from tests.service.test_grpc_transport import INFER, assert_serving, relu_request
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge

# Driver-independent (test-portability.sh leaves them to make test): the gRPC transport's deadlines, in this process
# or before a call reaches the device
pytestmark = pytest.mark.driver_independent

CANCELLED = "1"
BIG = b"\7" * 400_000  # an answer far past HTTP/2's initial 64 KiB window


async def _echo(message: bytes) -> bytes:
    return message[:16]


async def _slow(message: bytes) -> bytes:  # a call that runs for 2 s: longer than the idle limit
    await asyncio.sleep(2.0)
    return b"slow"


async def _big(message: bytes) -> bytes:
    return BIG


async def _stream(messages, send: Send) -> None:  # ModelStreamInfer's shape: each message answered as it comes
    async for message in messages:
        send(bytes(message[:16]))


@dataclass
class Served:
    transport: GrpcTransport
    budget: InflightBudget
    address: str
    loop: asyncio.AbstractEventLoop

    def on_loop(self, read: Callable[[], object]) -> object:
        """``read()`` on the transport's loop (its state is the loop's)."""
        async def run() -> object:
            return read()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def until(self, condition: Callable[[], bool]) -> bool:
        return until(lambda: bool(self.on_loop(condition)), 30)


@contextmanager
def served(idle_timeout: float = 300.0, body_timeout: float = 30.0, budget_bytes: int = 4 << 20) -> Iterator[Served]:
    """A GrpcTransport on a loop of its own (a thread), with these limits."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    budget = InflightBudget(budget_bytes)
    routes = {"/echo": Route(unary=_echo), "/slow": Route(unary=_slow), "/big": Route(unary=_big), "/stream": Route(bidi=_stream)}
    transport = GrpcTransport(routes, lambda exc: (INTERNAL, str(exc)), max_message=4 << 20, max_calls=16, max_connections=16,
                              budget=budget, idle_timeout=idle_timeout, body_timeout=body_timeout)
    asyncio.run_coroutine_threadsafe(transport.start("127.0.0.1", 0, reuse_port=False), loop).result(30)
    try:
        yield Served(transport, budget, f"127.0.0.1:{transport.port}", loop)
    finally:
        asyncio.run_coroutine_threadsafe(transport.stop(grace=1), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def read_to_end(sock: socket.socket, seconds: float = 30) -> bytes:
    """What the server sends until it closes the connection (b"" read, or a reset)."""
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def read_until(sock: socket.socket, done: Callable[[list[tuple[int, int, bytes]]], bool], seconds: float = 30) -> list[tuple[int, int, bytes]]:
    """The server's frames, read until ``done(frames)`` (or the connection's end, or ``seconds``)."""
    sock.settimeout(seconds)
    data = b""
    while not done(frames(data)):
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        data += chunk
    return frames(data)


def frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of each whole HTTP/2 frame in ``data`` (the server's side: no preface)."""
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return out


def test_an_idle_connection_is_told_goaway_and_closed():
    """idle_timeout 1 s: a connection that never sends a byte, one that stops inside a frame's header,
    and one that made two calls and then only PINGs (each answered), are told GOAWAY (NO_ERROR, the last
    stream it began) and closed; a call that runs twice the idle limit is not cut by it."""
    with served(idle_timeout=1.0) as srv:
        host, port = srv.address.rsplit(":", 1)
        silent = socket.create_connection((host, int(port)))
        cut = socket.create_connection((host, int(port)))
        cut.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 4, 1, b"x" * 20)[:5])
        pinger = H2Client(srv.address)
        try:
            echo, slow = pinger.start("/echo"), pinger.start("/slow")  # together: no idle moment between them
            pinger.send(echo, framed(b"e" * 40))
            pinger.send(slow, framed(b""))
            assert pinger.wait(echo).status == "0"
            assert pinger.wait(slow).status == "0" and pinger.answers[slow].body == framed(b"slow"), pinger.answers[slow]
            assert pinger.pinging(lambda: pinger.closed), "a connection doing nothing but PINGs was kept open"
            assert pinger.pings_acked > 0  # the PINGs were read (and answered) all along
            assert pinger.goaway is not None and pinger.goaway.error_code == 0 and pinger.goaway.last_stream_id == 3
            for sock in (silent, cut):
                sent = frames(read_to_end(sock))
                assert sent[0][0] == 4 and sent[-1][:2] == (7, 0), sent  # its SETTINGS, ..., GOAWAY, then the end
                assert sent[-1][2][4:8] == b"\0\0\0\0"  # NO_ERROR
            assert srv.until(lambda: not srv.transport.connections)
        finally:
            silent.close()
            cut.close()
            pinger.close()


def test_requests_that_stall_are_reset_and_give_back_what_they_held():
    """body_timeout 0.5 s, one connection sending only PINGs after: a message stopped mid-way (70 KB of
    100 KB), a call of headers alone, and a streaming call inside its second message are answered
    CANCELLED naming the setting and reset (NO_ERROR); the partial message leaves the budget and the
    streaming call ends. A streaming call resting between messages is left alone, and goes on after.
    A call whose HEADERS frame stops inside its header block is answered and reset too."""
    with served(body_timeout=0.5) as srv:
        peak = 0  # the most the budget held: the partial message as it arrived (reset, it may be gone at any poll)
        reserve = srv.budget.try_reserve

        def try_reserve(nbytes: int) -> bool:
            nonlocal peak
            taken = reserve(nbytes)
            peak = max(peak, srv.budget.held)
            return taken

        srv.budget.try_reserve = try_reserve  # type: ignore[method-assign]
        host, port = srv.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as cut:
            block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", "/echo"), (":authority", "vkact"),
                                     ("content-type", "application/grpc"), ("te", "trailers")])
            cut.sendall(PREFACE + frame(4, 0, 0, b"") + frame(1, 4, 1, block)[:9 + len(block) // 2])
            sent = read_until(cut, lambda got: (3, 1) in [(kind, sid) for kind, sid, _ in got])
            assert [(kind, sid) for kind, sid, _ in sent if sid == 1] == [(1, 1), (3, 1)], sent  # its answer, then RST_STREAM
            assert sent[-1][2] == b"\0\0\0\0"  # NO_ERROR
        with H2Client(srv.address) as client:
            half = client.start("/echo")
            client.send(half, framed(b"\1" * 100_000)[:70_000], end=False)
            bare = client.start("/echo")
            resting = client.start("/stream")
            client.send(resting, framed(b"first"), end=False)
            inside = client.start("/stream")
            client.send(inside, framed(b"second"), end=False)
            client.send(inside, framed(b"third")[:4], end=False)
            stalled = (half, bare, inside)
            assert client.pinging(lambda: all(sid in client.ended for sid in stalled)), client.answers
            for sid in stalled:
                answer = client.answers[sid]
                assert answer.status == CANCELLED and "VKACT_BODY_TIMEOUT_S" in answer.message, (sid, answer)
                assert answer.reset == 0, (sid, answer)  # RST_STREAM NO_ERROR: the upload stops
            assert client.answers[inside].body == framed(b"second")
            assert peak >= 65_000, peak  # the partial message was held as it arrived
            assert srv.until(lambda: srv.budget.held == 0 and srv.transport.calls == 1)  # the resting call only
            assert resting not in client.ended
            client.send(resting, framed(b"fourth"), end=True)
            rested = client.wait(resting)
            assert rested.status == "0" and rested.body == framed(b"first") + framed(b"fourth"), rested
            assert client.call("/echo", b"again").status == "0"  # the connection serves on
        assert srv.until(lambda: not srv.transport.connections and srv.budget.held == 0 and srv.transport.calls == 0)


def test_a_closed_connection_whose_last_bytes_are_not_taken_is_aborted(caplog):
    """body_timeout 1 s: a client that sends 2,000 PINGs and GOAWAY and reads none of the acknowledgements
    (34 KB, under the transport's high-water mark, past the socket buffers made small): its session done,
    the connection is closed. asyncio's close() would wait for ever for its client to take the last
    bytes; one body timeout later it is aborted, and the connection is gone."""
    caplog.set_level(logging.INFO, logger="vkact.grpc")
    with served(body_timeout=1.0) as srv:
        host, port = srv.address.rsplit(":", 1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        try:
            sock.sendall(PREFACE + frame(4, 0, 0, b""))
            assert srv.until(lambda: len(srv.transport.connections) == 1)
            srv.on_loop(lambda: [c.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                                 for c in srv.transport.connections])
            sock.sendall(b"".join(frame(6, 0, 0, i.to_bytes(8, "big")) for i in range(2000)) + frame(7, 0, 0, bytes(8)))
            assert until(lambda: "aborting a closed gRPC connection" in caplog.text), caplog.text
            assert srv.until(lambda: not srv.transport.connections)
        finally:
            sock.close()


@pytest.mark.parametrize("huge_window", [False, True], ids=["64KiB-window", "2GiB-window-unread-socket"])
def test_a_client_that_stops_reading_is_cut(huge_window, caplog):
    """body_timeout 0.5 s: a connection whose 400 KB answers wait for a client that takes none of them
    (2 of them behind its window; 16, past what the kernel's socket buffers take, behind its socket) is
    cut, its answers' bytes given back to the budget; the server serves on."""
    caplog.set_level(logging.INFO, logger="vkact.grpc")
    with served(body_timeout=0.5, budget_bytes=16 << 20) as srv:
        sock = unread_calls(srv.address, "/big", [framed(b"")] * (16 if huge_window else 2), huge_window)
        try:
            assert until(lambda: "whose client took none of its answers" in caplog.text), caplog.text
            assert srv.until(lambda: not srv.transport.connections)
            assert srv.until(lambda: srv.budget.held == 0 and srv.transport.calls == 0)
        finally:
            sock.close()
        with H2Client(srv.address) as reader:
            answer = reader.call("/big", b"")
        assert answer.status == "0" and answer.body == framed(BIG)


@pytest.mark.timeout(300)
def test_a_server_applies_the_deadlines_from_its_environment():
    """A server with VKACT_GRPC_IDLE_TIMEOUT_S=1 and VKACT_BODY_TIMEOUT_S=1: a pinging idle connection is
    told GOAWAY and closed; a ModelInfer whose message stops after 200 KB is answered CANCELLED; a client
    that reads none of its 2 MiB answer is cut. The process's gauges come back to nothing held: no
    gRPC connection or call, no bytes of the in-flight budget, no tensor slot; and it serves on."""
    server = start_server(grpc_idle_timeout_s=1, body_timeout_s=1)
    try:
        with server.client() as http:
            with H2Client(server.grpc) as idle:
                assert idle.pinging(lambda: idle.closed), "the idle connection was kept open"
                assert idle.goaway is not None and idle.goaway.error_code == 0
            with H2Client(server.grpc) as client:
                sid = client.start(INFER)
                client.send(sid, framed(relu_request(np.ones(1 << 18, np.float32)).SerializeToString())[:200_000], end=False)
                assert client.pinging(lambda: sid in client.ended), client.answers
                answer = client.answers[sid]
                assert answer.status == CANCELLED and "VKACT_BODY_TIMEOUT_S" in answer.message, answer
            message = framed(relu_request(np.ones(1 << 19, np.float32)).SerializeToString())  # within the stream's window
            sock = unread_calls(server.grpc, INFER, [message], huge_window=False)  # one: sent whole before its answer waits
            try:
                assert read_to_end(sock, 240), "the server sent nothing before closing"  # the first 64 KiB, then the end
            finally:
                sock.close()
            held = ("vkact_grpc_connections", "vkact_grpc_calls", "vkact_inflight_bytes", "vkact_queue_depth")
            assert until(lambda: all(gauge(http, name) == 0 for name in held)), {name: gauge(http, name) for name in held}
        assert_serving(server.grpc)
    finally:
        stop_server(server)
