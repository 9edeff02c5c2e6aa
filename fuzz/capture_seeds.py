"""Writes fuzz/corpus/: the bytes real clients send vkact's gRPC port (the client preface stripped: the
fuzz target sends it), recorded by a relay in front of a running service. tritonclient.grpc's RPCs,
grpc.health.v1 (Check, Watch and its cancel), compressed calls, a ModelStreamInfer stream, and the wire-level attacks of
tests/service/test_grpc_transport.py and test_grpc_wire.py (issue 24's three faults among them); and,
written without a server, streams for the stall guard (stall_seeds).
Run: .venv/bin/python -m fuzz.capture_seeds  (starts and stops its own server)."""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
import tritonclient.grpc as tg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.service.conftest import start_server, stop_server
from tests.service.h2_client import PREFACE, H2Client, frame, framed, literal_headers
from tests.service.test_grpc_transport import INFER, relu_request

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


class Relay:
    """A loopback port relaying to ``upstream``, keeping each connection's client bytes."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.recorded: list[bytearray] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.upstream)
            record = bytearray()
            self.recorded.append(record)
            threading.Thread(target=self._pump, args=(client, server, record), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(1 << 16):
                if record is not None:
                    record += data
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def capture(self, name: str, session: Callable[[str], None]) -> None:
        before = len(self.recorded)
        session(self.address)
        time.sleep(0.5)  # the relay's threads to record the last bytes
        for i, data in enumerate(self.recorded[before:]):
            data = bytes(data)
            data = data[len(PREFACE):] if data.startswith(PREFACE) else data
            if data:
                with open(os.path.join(CORPUS, f"{name}-{i}"), "wb") as f:
                    f.write(data)


def triton(address: str) -> None:
    client = tg.InferenceServerClient(address)
    client.is_server_live()
    client.get_model_metadata("relu")
    x = np.linspace(-2, 2, 16, dtype=np.float32)
    inp = tg.InferInput("InputTensor", [16], "FP32").set_data_from_numpy(x)
    client.infer("relu", [inp])
    client.infer("relu", [inp], compression_algorithm="gzip")
    client.close()


def stream(address: str) -> None:
    """ModelStreamInfer: three requests (one for an unknown model) on tritonclient's stream, then its end."""
    import queue

    answers: queue.Queue = queue.Queue()
    client = tg.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: answers.put(error))
    x = np.linspace(-2, 2, 16, dtype=np.float32)
    for k, model in enumerate(("relu", "nope", "relu")):
        client.async_stream_infer(model, [tg.InferInput("InputTensor", [16], "FP32").set_data_from_numpy(x)], request_id=str(k))
    for _ in range(3):
        answers.get(timeout=30)
    client.stop_stream()
    client.close()


def health(address: str) -> None:
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        next(watch)
        watch.cancel()


def huge_name(address: str) -> None:
    with H2Client(address) as c:
        c.call("/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest(service="n" * 70_000).SerializeToString())


def not_grpc(address: str) -> None:
    message = relu_request(np.ones(4, np.float32)).SerializeToString()
    with H2Client(address) as c:
        c.call(INFER, message, content_type=None)
        c.call(INFER, message, content_type="text/plain")
        c.call(INFER, message + b"\0\0", content_type="application/grpc+proto")
        c.call("/no.such/Method", message)
        sid = c.start(INFER)
        c.send(sid, b"\0\0\0")  # a cut prefix
        c.wait(sid)
        sid = c.start(INFER)
        c.send(sid, framed(message) * 2)  # two messages on a unary call
        c.wait(sid)


def announced(address: str) -> None:
    """Streams sending only a prefix announcing 256 MiB - 1, and calls reset in the write that sent them."""
    host, port = address.rsplit(":", 1)
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "vkact"),
                             ("content-type", "application/grpc"), ("te", "trailers")])
    body = framed(relu_request(np.ones(16, np.float32)).SerializeToString())
    data = PREFACE + frame(4, 0, 0, b"")
    for sid in range(1, 17, 2):
        data += frame(1, 4, sid, block) + frame(0, 0, sid, b"\0" + ((256 << 20) - 1).to_bytes(4, "big"))
    for sid in range(17, 33, 2):
        data += frame(1, 4, sid, block) + frame(0, 1, sid, body) + frame(3, 0, sid, (8).to_bytes(4, "big"))
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data + frame(6, 0, 0, b"12345678"))
        s.recv(1 << 16)


def stall_seeds() -> None:
    """Written, not recorded: streams the stall guard resets (a unary message stopped mid-way, a streaming
    call inside its second message, headers alone; beside a streaming call resting between messages, a
    PING and bytes after the reset), under the target's stall modes 1 and 2 (a SETTINGS frame of one
    and of two settings: h2grpc_fuzz.c); and calls answered before their clients finished sending them."""
    def headers(path: str, sid: int) -> bytes:
        return frame(1, 4, sid, literal_headers([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                                                 ("content-type", "application/grpc"), ("te", "trailers")]))

    streams = (headers("/u", 1) + frame(0, 0, 1, b"\0" + (40).to_bytes(4, "big") + b"0123456789")
               + headers("/b", 3) + frame(0, 0, 3, framed(b"abc")) + frame(0, 0, 3, b"\0\0")
               + headers("/b", 5) + frame(0, 0, 5, framed(b"rest")) + headers("/u", 7) + frame(6, 0, 0, b"12345678")
               + frame(0, 0, 1, b"more") + frame(0, 1, 7, framed(b"late")))
    one = (2).to_bytes(2, "big") + (0).to_bytes(4, "big")
    two = one + (3).to_bytes(2, "big") + (100).to_bytes(4, "big")
    early = (frame(4, 0, 0, b"") + headers("/no.such/Method", 1) + frame(0, 0, 1, framed(b"x" * 100)) + frame(0, 0, 1, b"y" * 50)
             + headers("/u", 3) + frame(0, 0, 3, b"\0\x7f\xff\xff\xff") + frame(0, 0, 3, b"z" * 30) + frame(0, 1, 3, b""))
    for name, data in [("stalled-0", frame(4, 0, 0, one) + streams), ("stalled-1", frame(4, 0, 0, two) + streams),
                       ("answered-early-0", early)]:
        with open(os.path.join(CORPUS, name), "wb") as f:
            f.write(data)


def main() -> None:
    os.makedirs(CORPUS, exist_ok=True)
    stall_seeds()
    server = start_server(max_body_bytes=256 << 20)
    try:
        relay = Relay(server.grpc)
        for name, session in [("triton", triton), ("health", health), ("huge-name", huge_name),
                              ("not-grpc", not_grpc), ("announced", announced), ("stream", stream)]:
            relay.capture(name, session)
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
