"""gRPC's transport (service/api/grpc/transport.py over service/native/h2grpc.c, libnghttp2) as the wire
sees it: what tritonclient never sends (unknown and streaming methods, compression, deadlines, resets,
non-gRPC requests, garbage) answered as gRPC says, and the server serving on after each. The RPCs
themselves are test_grpc.py's."""
from __future__ import annotations

import asyncio
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service.api.grpc.status import deadline_seconds, percent_encoded
from tests.service.conftest import start_server, stop_server
from tests.service.h2_client import PREFACE, framed, frame as _frame, literal_headers as _literal_headers
from tests.service.test_load import worker_pid
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge

# Driver-independent (test-portability.sh leaves them to make test): the gRPC transport's wire behaviour; the RPCs'
# answers are test_grpc.py's
pytestmark = pytest.mark.driver_independent

INFER = "/inference.GRPCInferenceService/ModelInfer"


def relu_request(x: np.ndarray) -> service_pb2.ModelInferRequest:
    msg = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[x.tobytes()])
    msg.inputs.add(name="InputTensor", datatype="FP32", shape=list(x.shape))
    return msg


def relu_of(answer: service_pb2.ModelInferResponse) -> np.ndarray:
    return np.frombuffer(answer.raw_output_contents[0], np.float32)


@pytest.fixture(scope="module")
def channel(server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc) as ch:
        yield ch


def assert_serving(address: str) -> None:
    x = np.linspace(-2, 2, 33, dtype=np.float32)
    with grpc.insecure_channel(address) as ch:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(relu_request(x), timeout=30)
    np.testing.assert_array_equal(relu_of(answer), np.maximum(x, 0))


def test_grpc_timeout_and_message_encodings():
    assert deadline_seconds(b"1S") == 1.0
    assert deadline_seconds(b"250m") == 0.25
    assert deadline_seconds(b"99999999n") == pytest.approx(0.099999999)
    assert deadline_seconds(b"2H") == 7200.0
    for bad in (b"", b"S", b"123456789S", b"1s", b"-1S", b"1.5S"):
        assert deadline_seconds(bad) is None, bad
    assert percent_encoded("a b/c:d") == b"a b/c:d"
    assert percent_encoded("50% über\n") == b"50%25 %C3%BCber%0A"


def test_unknown_methods_are_unimplemented_without_waiting_for_the_stream(channel):
    """A bidirectional stream of a method vkact does not serve is refused as soon as its headers arrive:
    the client, still sending, is not left waiting for its own end of stream."""
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/no.such.Service/Method")(b"", timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    pending: queue.Queue = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (item := pending.get()) is not None:
            yield item

    call = channel.stream_stream("/inference.GRPCInferenceService/NoSuchStream")(requests(), timeout=30)
    try:
        with pytest.raises(grpc.RpcError) as info:
            next(call)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        pending.put(None)


@pytest.mark.parametrize("compression", [grpc.Compression.Gzip, grpc.Compression.Deflate])
def test_compressed_requests_are_inflated(channel, compression):
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    answer = stub.ModelInfer(relu_request(x), timeout=30, compression=compression)
    np.testing.assert_array_equal(relu_of(answer), np.maximum(x, 0))


def test_a_compressed_message_inflating_past_the_limit_is_refused():
    """A 2 KB gzip of 4 MiB of zeros against a 1 MiB message limit: RESOURCE_EXHAUSTED, inflated no
    further than the limit; the server serves on."""
    server = start_server(max_body_bytes=1 << 20)
    try:
        with grpc.insecure_channel(server.grpc) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(relu_request(np.zeros(1 << 20, np.float32)), timeout=30, compression=grpc.Compression.Gzip)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "decompressed request message exceeds" in info.value.details()
        assert_serving(server.grpc)
    finally:
        stop_server(server)


def test_many_calls_on_one_connection_at_once(server):
    """HTTP/2 multiplexing: 200 calls in flight on one channel (beyond the per-connection stream limit,
    so the client queues some), each answered with its own result; those that find the device queue
    full (UNAVAILABLE, as clients are told to) are retried."""
    async def scenario() -> None:
        async with grpc.aio.insecure_channel(server.grpc) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)

            async def infer(x: np.ndarray) -> service_pb2.ModelInferResponse:
                while True:
                    try:
                        return await stub.ModelInfer(relu_request(x), timeout=60)
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.UNAVAILABLE:
                            raise
                        await asyncio.sleep(0.05)

            xs = [np.linspace(-k, k, 17 + k, dtype=np.float32) for k in range(200)]
            answers = await asyncio.gather(*(infer(x) for x in xs))
            for x, answer in zip(xs, answers):
                np.testing.assert_array_equal(relu_of(answer), np.maximum(x, 0))

    asyncio.run(scenario())


def nghttp(address: str, *args: str, body: bytes | None = None) -> str:
    """nghttp (Debian's nghttp2-client) in verbose mode: every frame it received, trailers included."""
    with tempfile.NamedTemporaryFile() as f:
        extra: list[str] = []
        if body is not None:
            f.write(body)
            f.flush()
            extra = ["-d", f.name]
        done = subprocess.run(["nghttp", "-nv", "-t", "30", *extra, *args, f"http://{address}{INFER}"],
                              capture_output=True, text=True, errors="replace", timeout=60)
    return done.stdout + done.stderr


@pytest.mark.skipif(not os.path.exists("/usr/bin/nghttp"), reason="nghttp2-client (scripts/setup.sh installs it)")
def test_requests_that_are_not_grpc_calls_get_http_errors(server):
    assert ":status: 405" in nghttp(server.grpc, "-H", ":method: GET")
    out = nghttp(server.grpc, "-H", "content-type: text/plain", body=framed(b""))
    assert ":status: 415" in out
    out = nghttp(server.grpc, "-H", "content-type: application/grpc+proto", body=framed(relu_request(np.ones(4, np.float32)).SerializeToString()))
    assert ":status: 200" in out and "grpc-status: 0" in out
    out = nghttp(server.grpc, "-H", "content-type: application/grpc", body=b"\0\0\0")  # a cut prefix
    assert "grpc-status: 13" in out
    two = framed(relu_request(np.ones(4, np.float32)).SerializeToString()) * 2
    assert "grpc-status: 3" in nghttp(server.grpc, "-H", "content-type: application/grpc", body=two)
    assert_serving(server.grpc)


@pytest.mark.skipif(not os.path.exists("/usr/bin/nghttp"), reason="nghttp2-client (scripts/setup.sh installs it)")
def test_the_deadline_ends_a_call_waiting_on_the_device():
    """The server enforces grpc-timeout itself (the trailer says DEADLINE_EXCEEDED; a grpcio client would
    give up on its own clock either way): a call held by a stopped device ends at its deadline, and
    the server answers the next one once the device goes on."""
    server = start_server()
    pid = worker_pid(server)
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            out = nghttp(server.grpc, "-H", "content-type: application/grpc", "-H", "grpc-timeout: 500m",
                         body=framed(relu_request(np.ones(8, np.float32)).SerializeToString()))
        finally:
            os.kill(pid, signal.SIGCONT)
        assert "grpc-status: 4" in out, out
        assert_serving(server.grpc)
    finally:
        stop_server(server)


def test_a_cancelled_call_gives_its_place_back():
    """With room for one call (VKACT_MAX_CONNECTIONS=1) and the device stopped, a call the client cancels
    frees its place: the next call waits on the device (and is answered once it goes on) instead of
    being refused with RESOURCE_EXHAUSTED. Each step waits for the state it needs, as the server counts
    its calls (vkact_grpc_calls): the first call held, then given back, then the second one held."""
    server = start_server(max_connections=1)
    pid = worker_pid(server)
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    try:
        with grpc.insecure_channel(server.grpc) as ch, server.client() as http:  # one connection each: the bound
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            calls = lambda: gauge(http, "vkact_grpc_calls")  # noqa: E731
            assert calls() == 0
            os.kill(pid, signal.SIGSTOP)
            try:
                first = stub.ModelInfer.future(relu_request(x), timeout=60)
                assert until(lambda: calls() == 1 or first.done()), "the first call never reached the server"
                assert not first.done(), first.exception()
                first.cancel()
                assert until(lambda: calls() == 0), "the cancelled call never gave its place back"
                second = stub.ModelInfer.future(relu_request(-x), timeout=60)
                assert until(lambda: calls() == 1 or second.done())
                assert not second.done(), second.exception()  # waiting on the device, not refused
            finally:
                os.kill(pid, signal.SIGCONT)
            np.testing.assert_array_equal(relu_of(second.result()), np.maximum(-x, 0))
    finally:
        stop_server(server)


def test_health_watch_streams_the_status(server):
    with grpc.insecure_channel(server.grpc) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        unknown = health.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
        assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        unknown.cancel()
    assert_serving(server.grpc)


def _send_and_close(address: str, data: bytes, read: bool = True) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        if read:
            try:
                s.recv(65536)
            except OSError:
                pass


def test_garbage_and_abrupt_clients_leave_the_server_serving(server):
    """Bytes that are not HTTP/2, an HTTP/1.1 request, a preface followed by malformed frames, a call
    cut off mid-message, and 50 idle connections held open: each is closed or answered, and calls on
    a fresh connection are served throughout."""
    rng = np.random.default_rng(7)
    settings = b"\0\0\0\4\0\0\0\0\0"
    bad_frames = [
        rng.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        PREFACE + settings + b"\xff\xff\xff\x01\x04\0\0\0\1" + b"x" * 64,   # a frame over the size limit
        PREFACE + settings + b"\0\0\5\1\5\0\0\0\2" + b"\xff\xff\xff\xff\xff",  # undecodable HPACK
        PREFACE + settings + b"\0\0\x08\6\0\0\0\0\1" + b"12345678" * 1,     # a PING on a stream
        PREFACE[:10],
    ]
    for data in bad_frames:
        _send_and_close(server.grpc, data)
    idle = []
    host, port = server.grpc.rsplit(":", 1)
    for _ in range(50):
        idle.append(socket.create_connection((host, int(port)), timeout=10))
    try:
        assert_serving(server.grpc)
        cut = threading.Thread(target=_send_and_close, args=(server.grpc, PREFACE + settings + b"\0\0\x10\0\0\0\0\0\1" + b"\0" * 4, False))
        cut.start()
        cut.join()
        assert_serving(server.grpc)
    finally:
        for s in idle:
            s.close()
    assert_serving(server.grpc)


def test_connections_beyond_the_bound_are_closed_and_the_others_served():
    """VKACT_MAX_CONNECTIONS=3: with three connections open, a fourth is closed as it is accepted (no
    HTTP/2 SETTINGS from the server, an end of stream); once one of the three closes, calls are served."""
    server = start_server(max_connections=3)
    host, port = server.grpc.rsplit(":", 1)
    try:
        held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        for s in held:  # each was accepted: the server's SETTINGS come first
            s.sendall(PREFACE + b"\0\0\0\4\0\0\0\0\0")
            head = b""
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                assert chunk, "an accepted connection was closed"
                head += chunk
            assert head[3] == 4
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.sendall(PREFACE)
            try:
                assert extra.recv(9) == b""
            except ConnectionResetError:
                pass
        held.pop().close()
        for attempt in range(100):  # until the server has seen that close (its own time)
            try:
                assert_serving(server.grpc)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and attempt < 99, exc
                time.sleep(0.1)
        for s in held:
            s.close()
    finally:
        stop_server(server)


def test_calls_reset_in_the_read_that_brought_them_give_their_places_back():
    """200 calls each sent whole and reset in one write: the server starts and cancels each before it
    runs (the task's coroutine never starts, so only its done callback can give the place back). With
    room for 8 calls, every later call is still served, none refused as RESOURCE_EXHAUSTED."""
    server = start_server(max_connections=8)
    host, port = server.grpc.rsplit(":", 1)
    block = _literal_headers([(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "vkact"),
                              ("content-type", "application/grpc"), ("te", "trailers")])
    body = framed(relu_request(np.ones(16, np.float32)).SerializeToString())
    cancel = (8).to_bytes(4, "big")
    data = PREFACE + _frame(4, 0, 0, b"")
    for stream_id in range(1, 400, 2):
        data += _frame(1, 4, stream_id, block) + _frame(0, 1, stream_id, body) + _frame(3, 0, stream_id, cancel)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(data)
            time.sleep(1)
        for _ in range(10):
            assert_serving(server.grpc)
    finally:
        stop_server(server)
