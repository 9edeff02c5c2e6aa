"""Issue 24's three remote faults of the gRPC transport, at the wire (a raw HTTP/2 client, tests/service/
h2_client.py): every call ends (an error message echoing a huge input is capped, so its trailer can be
sent); memory follows the bytes that arrived (a 5-byte prefix announcing 256 MiB reserves nothing); a
POST without content-type is refused with 415. Also the Session itself, driven without a socket."""
from __future__ import annotations

import asyncio
import socket

import h2.config
import h2.connection
import h2.events
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from service.api.grpc.status import INTERNAL, MAX_STATUS_MESSAGE, RESOURCE_EXHAUSTED, UNAVAILABLE, status_text
from service.api.grpc.transport import GrpcTransport, Route
from service.inflight import InflightBudget
from service.native import h2grpc
from tests.service.conftest import start_server, stop_server
from tests.service.h2_client import PREFACE, Answer, H2Client, frame, framed, literal_headers
from tests.service.test_grpc_transport import INFER, assert_serving, relu_request

# Driver-independent (test-portability.sh leaves them to make test): the gRPC transport's faults at the wire and its
# Session without a socket
pytestmark = pytest.mark.driver_independent

CHECK = "/grpc.health.v1.Health/Check"
C_STATUS_CAP = 4096  # h2grpc_answer.c's MAX_STATUS_MESSAGE: the most grpc-message bytes a frame carries


def test_an_error_echoing_a_huge_input_still_ends_the_call(server):
    """Health/Check of a 70,000-byte service name: NOT_FOUND, with the name elided from a capped message
    (the uncapped trailer was over nghttp2's 64 KiB header block: dropped, the call never ended)."""
    name = "n" * 70_000
    with H2Client(server.grpc) as client:
        answer = client.call(CHECK, health_pb2.HealthCheckRequest(service=name).SerializeToString())
    assert answer.reset is None, answer
    assert answer.status == "5", answer.headers
    assert 0 < len(answer.message) <= MAX_STATUS_MESSAGE, len(answer.message)
    assert "unknown service" in answer.message and "elided" in answer.message
    with H2Client(server.grpc) as client:  # a short name is echoed whole
        answer = client.call(CHECK, health_pb2.HealthCheckRequest(service="no.such").SerializeToString())
    assert answer.status == "5" and answer.message == "unknown service 'no.such'"
    assert_serving(server.grpc)


def test_status_text_elides_the_middle():
    assert status_text("short") == "short"
    long = "a" * 10_000 + "MIDDLE" + "z" * 10_000
    text = status_text(long)
    assert len(text) <= MAX_STATUS_MESSAGE and text.startswith("a" * 100) and text.endswith("z" * 100)
    assert "MIDDLE" not in text and "elided" in text


def test_a_post_without_content_type_is_refused_with_415(server):
    """gRPC over HTTP/2: a server answers a request without content-type 415 (as text/plain), not as a call."""
    message = relu_request(np.ones(4, np.float32)).SerializeToString()
    with H2Client(server.grpc) as client:
        bare = client.call(INFER, message, content_type=None)
        typed = client.call(INFER, message, content_type="text/plain")
        grpc_call = client.call(INFER, message)
    assert bare.headers.get(":status") == "415" and bare.status is None, bare
    assert typed.headers.get(":status") == "415", typed
    assert grpc_call.headers.get(":status") == "200" and grpc_call.status == "0", grpc_call
    assert_serving(server.grpc)


def _vm_size(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize")


def _ping_acked(sock: socket.socket, payload: bytes) -> None:
    """Send a PING and read until its ACK: every frame sent before it has been processed."""
    sock.sendall(frame(6, 0, 0, payload))
    seen = b""
    while True:
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed a connection holding announced messages"
        seen += chunk
        if frame(6, 1, 0, payload) in seen:
            return


def test_announced_messages_reserve_no_memory():
    """8,192 streams (64 connections of 128) each sending only a 5-byte prefix announcing 256 MiB - 1: the
    serving process's address space grows by less than 256 MiB (it reserved each whole message: 2 TiB),
    liveness is answered throughout, and calls are served while they are held."""
    server = start_server(max_body_bytes=256 << 20)
    held: list[socket.socket] = []
    try:
        host, port = server.grpc.rsplit(":", 1)
        block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "vkact"),
                                 ("content-type", "application/grpc"), ("te", "trailers")])
        prefix = b"\0" + ((256 << 20) - 1).to_bytes(4, "big")
        before = _vm_size(server.process.pid)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for c in range(64):
                s = socket.create_connection((host, int(port)), timeout=60)
                held.append(s)
                data = PREFACE + frame(4, 0, 0, b"")
                for stream_id in range(1, 256, 2):
                    data += frame(1, 4, stream_id, block) + frame(0, 0, stream_id, prefix)
                s.sendall(data)
                _ping_acked(s, c.to_bytes(8, "big"))
                if c % 8 == 7:
                    assert http.get("/health/live").status_code == 200
            grown = _vm_size(server.process.pid) - before
            assert grown < 256 << 20, f"address space grew by {grown >> 20} MiB"
            assert http.get("/health/live").status_code == 200
        assert_serving(server.grpc)
    finally:
        for s in held:
            s.close()
        stop_server(server)


# -- the Session alone: an h2 client in memory, no socket ----------------------------------------------


class _Pair:
    """An h2 client connected to an h2grpc.Session through memory."""

    def __init__(self, **kwargs: int) -> None:
        self.session = h2grpc.Session({CHECK.encode(): "check"}, kwargs.get("max_message", 1 << 20), 128, 1 << 20)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.client = h2.connection.H2Connection(config)
        self.client.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.requests: list[tuple] = []
        self.pump()

    def pump(self) -> None:
        while True:
            out = self.client.data_to_send()
            if out:
                self.requests += self.session.receive(out)
            back = self.session.pending()
            if not out and not back:
                return
            self.events += self.client.receive_data(back)

    def request(self, body: bytes, end: bool = True) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", CHECK),
                                       (":authority", "x"), ("content-type", "application/grpc")])
        self.send(sid, body, end)
        return sid

    def send(self, sid: int, data: bytes, end: bool = False) -> None:
        """``data`` in frames the client may send, pumped through as it goes (nghttp2 opens the windows)."""
        while data:
            size = min(len(data), 16384, self.client.local_flow_control_window(sid))
            assert size > 0, "no window left"
            self.client.send_data(sid, data[:size])
            data = data[size:]
            self.pump()
        if end:
            self.client.end_stream(sid)
        self.pump()

    def ended(self, sid: int) -> dict[str, str]:
        """The headers of ``sid``'s last HEADERS frame (its trailers), asserting that the stream ended."""
        assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in self.events), self.events
        last = [e for e in self.events if isinstance(e, (h2.events.ResponseReceived, h2.events.TrailersReceived)) and e.stream_id == sid]
        return dict(last[-1].headers)


def test_session_caps_the_status_message_of_both_trailer_kinds():
    """Bytes over the C cap are cut (never mid-%XX): the trailers-only answer and the trailer after a
    message both reach the client, so the call ends."""
    pair = _Pair()
    first, second = pair.request(framed(b"")), pair.request(framed(b""))
    assert [r[0] for r in pair.requests] == [first, second]
    pair.session.finish(first, 5, b"%41" * 30_000)
    pair.session.send(second, b"message")
    pair.session.finish(second, 2, b"x" * 70_000)
    pair.pump()
    only = pair.ended(first)
    assert only["grpc-status"] == "5" and only["grpc-message"] == "%41" * (C_STATUS_CAP // 3)
    trailer = pair.ended(second)
    assert trailer["grpc-status"] == "2" and trailer["grpc-message"] == "x" * C_STATUS_CAP
    data = b"".join(e.data for e in pair.events if isinstance(e, h2.events.DataReceived) and e.stream_id == second)
    assert data == framed(b"message")


def test_session_buffers_only_what_arrived():
    """``buffered`` counts the bytes partial messages hold: nothing for a bare prefix announcing 16 MiB,
    at most twice what arrived as its DATA comes, nothing once the message is handed over."""
    pair = _Pair(max_message=16 << 20)
    sid = pair.request(b"\0" + (16 << 20).to_bytes(4, "big"), end=False)
    assert pair.session.buffered == 0
    for sent in range(1, 9):
        pair.send(sid, b"\1" * 40_000)
        assert 40_000 * sent <= pair.session.buffered <= 2 * 40_000 * sent
    pair.send(sid, b"\1" * ((16 << 20) - 320_000), end=True)
    assert pair.session.buffered == 0
    (event,) = pair.requests
    assert event[0] == sid and event[2] == b"\1" * (16 << 20)


def test_session_refuses_what_its_room_cannot_hold():
    """``room``: the bytes partial messages may hold at once (the process's in-flight budget, set by
    the transport before each read). A message growing past it is dropped and answered as one the
    server will not hold; the Session keeps serving."""
    pair = _Pair()
    pair.session.room = 100_000
    big = pair.request(framed(b"\2" * 200_000))
    small = pair.request(framed(b"\3" * 1000))
    events = {r[0]: r for r in pair.requests}
    assert events[big][2] is None and events[big][4] == "over-budget"
    assert events[small][2] == b"\3" * 1000
    assert pair.session.buffered == 0


def test_partial_messages_are_charged_to_the_process_budget():
    """A transport with a 256 KiB budget: a 1 MiB message is refused RESOURCE_EXHAUSTED (it could only be
    held past the budget), one that fits is answered; the budget held what arrived, never more than its
    limit, and has everything back once the connection closes."""
    budget = InflightBudget(256 << 10)
    peak = 0
    reserve = budget.try_reserve

    def try_reserve(nbytes: int) -> bool:
        nonlocal peak
        taken = reserve(nbytes)
        peak = max(peak, budget.held)
        return taken

    budget.try_reserve = try_reserve  # type: ignore[method-assign]  # the most it held

    async def echo(message: bytes) -> bytes:
        return message[:16]

    async def scenario() -> None:
        transport = GrpcTransport({"/echo": Route(unary=echo)}, lambda exc: (INTERNAL, str(exc)), max_message=4 << 20,
                                  max_calls=8, max_connections=8, budget=budget)
        await transport.start("127.0.0.1", 0, reuse_port=False)

        def client() -> tuple[Answer, Answer]:
            with H2Client(f"127.0.0.1:{transport.port}") as c:
                return c.call("/echo", b"\1" * (1 << 20)), c.call("/echo", b"\2" * (100 << 10))

        try:
            big, fits = await asyncio.to_thread(client)
            for _ in range(100):  # until the server has seen the close (its own time)
                if not transport.connections:
                    break
                await asyncio.sleep(0.05)
        finally:
            await transport.stop(grace=1)
        assert big.status == str(RESOURCE_EXHAUSTED) and "retry later" in big.message, big
        assert fits.status == "0" and fits.body == framed(b"\2" * 16), fits
        assert 0 < peak <= budget.limit and budget.held == 0, (peak, budget.held)

    asyncio.run(scenario())


def test_session_counts_the_answers_the_client_has_not_taken():
    """``answers``: the answer bytes queued and not yet taken by nghttp2 (what the transport charges to the
    in-flight budget). ``pending(limit)`` hands over about ``limit`` bytes (one frame more); a client that
    opens no window takes its 64 KiB and the rest stays counted; a reset drops its stream's share; reading
    (WINDOW_UPDATE) takes the rest, whole."""
    pair = _Pair()
    a, b = pair.request(framed(b"")), pair.request(framed(b""))
    pair.session.send(a, b"\1" * 200_000)
    pair.session.send(b, b"\2" * 100_000)
    assert pair.session.answers == 300_000
    chunk = pair.session.pending(1000)
    assert 1000 <= len(chunk) <= 1000 + 16_384 + 200  # one DATA frame (and the HEADERS) past the limit
    assert pair.session.answers >= 300_000 - len(chunk)
    pair.events += pair.client.receive_data(chunk)
    pair.pump()  # the client's connection window (64 KiB) is all nghttp2 may take
    assert 300_000 - 65_535 <= pair.session.answers <= 300_000 - 65_535 + 10  # the 5-byte prefixes are not counted
    pair.client.reset_stream(b)
    pair.pump()
    assert pair.session.answers == 200_000 - sum(len(e.data) for e in pair.events if isinstance(e, h2.events.DataReceived) and e.stream_id == a) + 5
    pair.session.finish(a, 0)
    acknowledged = 0
    while not any(isinstance(e, h2.events.StreamEnded) and e.stream_id == a for e in pair.events):
        for e in pair.events[acknowledged:]:
            if isinstance(e, h2.events.DataReceived):
                pair.client.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        acknowledged = len(pair.events)
        pair.pump()
    assert pair.session.answers == 0
    data = b"".join(e.data for e in pair.events if isinstance(e, h2.events.DataReceived) and e.stream_id == a)
    assert data == framed(b"\1" * 200_000)


def test_unread_answers_hold_the_budget_and_stop_their_connection_being_served():
    """A 1 MiB budget, 400 KB answers. A client that reads nothing (its 64 KiB window never reopened)
    leaves two answers queued: ~735 KB counted in the budget, past its connection's bound (half the
    budget), so its third call is refused RESOURCE_EXHAUSTED without being computed; another client's
    answer, finding the budget held, is dropped and answered UNAVAILABLE. Once the first client goes,
    the budget is back to 0 and a call is answered whole."""
    budget = InflightBudget(1 << 20)
    computed = 0
    answer = b"\7" * 400_000

    async def big(message: bytes) -> bytes:
        nonlocal computed
        computed += 1
        return answer

    async def scenario() -> None:
        transport = GrpcTransport({"/big": Route(unary=big)}, lambda exc: (INTERNAL, str(exc)), max_message=4 << 20,
                                  max_calls=8, max_connections=8, budget=budget)
        await transport.start("127.0.0.1", 0, reuse_port=False)
        address = f"127.0.0.1:{transport.port}"
        try:
            stalled = H2Client(address)
            stalled.conn.acknowledge_received_data = lambda *args: None  # type: ignore[method-assign]  # never reads
            for _ in range(2):
                stalled.send(stalled.start("/big"), framed(b""))
            for _ in range(200):  # until both calls have ended, their answers queued (the server's own time)
                if computed == 2 and transport.calls == 0:
                    break
                await asyncio.sleep(0.05)
            held = budget.held
            assert transport.max_unread < 800_000 - 65_535 <= held <= 800_000 - 65_535 + 10, held  # what nghttp2 took is out
            refused = await asyncio.to_thread(stalled.call, "/big", b"")
            assert refused.status == str(RESOURCE_EXHAUSTED) and "read them first" in refused.message, refused
            assert computed == 2
            with H2Client(address) as other:
                dropped = await asyncio.to_thread(other.call, "/big", b"")
            assert dropped.status == str(UNAVAILABLE) and dropped.body == b"", dropped
            assert computed == 3 and budget.held == held
            stalled.close()
            for _ in range(200):  # until the server has seen the close
                if not transport.connections and budget.held == 0:
                    break
                await asyncio.sleep(0.05)
            assert budget.held == 0
            with H2Client(address) as reader:
                served = await asyncio.to_thread(reader.call, "/big", b"")
            assert served.status == "0" and served.body == framed(answer), served.status
            for _ in range(200):
                if not transport.connections:
                    break
                await asyncio.sleep(0.05)
            assert budget.held == 0
        finally:
            await transport.stop(grace=1)

    asyncio.run(scenario())
