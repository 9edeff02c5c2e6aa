"""Large /v2 binary answers sent from the job's slot (api/execution.py FrameResponse with ``hold``): the
bytes right, the slot kept until the socket has taken them (a slow reader gets its own answer, not the
next request's), a reader that stalls cut off and its slot given back. Raw sockets on loopback."""
from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest

from tests.service.conftest import Server, start_server, stop_server
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge

N = 1 << 22  # 16 MiB of FLOAT32 each way: more than loopback's socket buffers hold
WAIT_S = 60  # the test's own bound on waiting for the server: far past its timeouts


def frame(x: np.ndarray) -> bytes:
    """A /v2 binary request for relu, as tritonclient frames it (same JSON header for every x)."""
    head = json.dumps({"inputs": [{"name": "InputTensor", "shape": [x.size], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
    return (b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\nContent-Type: application/octet-stream\r\n"
            + f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(head) + x.nbytes}\r\n\r\n".encode()
            + head + x.tobytes())


def connect(server: Server, rcvbuf: int | None = None) -> socket.socket:
    address = urlparse(server.url)
    s = socket.socket()
    if rcvbuf is not None:  # before connect: the window the server may fill without the client reading
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(WAIT_S)
    s.connect((address.hostname, address.port))
    return s


def read_answer(s: socket.socket) -> tuple[int, np.ndarray | bytes]:
    """One response: its status and, for a 200, the output tensor; else the body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed before the headers: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers["content-length"])
    parts, have = [body], len(body)
    while have < length:
        chunk = s.recv(min(1 << 20, length - have))
        assert chunk, f"closed after {have} of {length} bytes"
        parts.append(chunk)
        have += len(chunk)
    body = b"".join(parts)
    status = int(lines[0].split()[1])
    if status != 200:
        return status, body
    json_length = int(headers["inference-header-content-length"])
    assert json.loads(body[:json_length])["outputs"][0]["parameters"]["binary_data_size"] == 4 * N
    return status, np.frombuffer(body, np.float32, N, json_length)


def call(s: socket.socket, x: np.ndarray) -> np.ndarray:
    s.sendall(frame(x))
    status, out = read_answer(s)
    assert status == 200, out
    return out


@pytest.fixture(scope="module")
def small_queue() -> Server:
    # queue_size 1: three slots (one queued job and the two the worker holds, limits.IN_FLIGHT)
    server = start_server(queue_size=1, body_timeout_s=3)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def patient() -> Server:  # three slots, and a stall limit no loaded machine reaches while the test reads slowly
    server = start_server(queue_size=1, body_timeout_s=WAIT_S)
    yield server
    stop_server(server)


def inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(N).astype(np.float32)


def test_a_slow_reader_gets_its_own_answer_while_others_reuse_the_slots(patient):
    with connect(patient) as warm:  # the first request of this header: its answer's JSON is cached
        np.testing.assert_array_equal(call(warm, inputs(0)), np.maximum(inputs(0), 0))
    x = inputs(1)
    with connect(patient, rcvbuf=1 << 16) as slow, connect(patient) as other:
        slow.sendall(frame(x))
        first = slow.recv(4096)  # the answer has started; most of it waits in the server, from the slot
        assert first.startswith(b"HTTP/1.1 200 "), first[:200]
        for seed in range(2, 6):  # they take free slots: the slow reader's stays its own until sent
            y = inputs(seed)
            np.testing.assert_array_equal(call(other, y), np.maximum(y, 0))
        with httpx.Client(base_url=patient.url, timeout=10) as probe:  # a liveness probe's budget
            assert probe.get("/v2/health/live").status_code == 200  # answered while the answer waits to be sent
        rest = read_answer_after(slow, first)
    np.testing.assert_array_equal(rest, np.maximum(x, 0))


def read_answer_after(s: socket.socket, first: bytes) -> np.ndarray:
    class Replay:  # the bytes already read, then the socket
        def __init__(self) -> None:
            self.pending = first

        def recv(self, n: int) -> bytes:
            if self.pending:
                out, self.pending = self.pending[:n], self.pending[n:]
                return out
            return s.recv(n)

    status, out = read_answer(Replay())  # type: ignore[arg-type]
    assert status == 200, out
    return out  # type: ignore[return-value]


@pytest.mark.driver_independent
def test_readers_that_stall_are_cut_off_and_their_slots_given_back(small_queue):
    with connect(small_queue) as warm:
        call(warm, inputs(0))
    stalled = [connect(small_queue, rcvbuf=1 << 16) for _ in range(3)]  # as many as there are slots
    try:
        for s in stalled:
            s.sendall(frame(inputs(7)))
        received = {s: 0 for s in stalled}
        for s in stalled:  # never read past the first bytes: the server cuts each after body_timeout_s
            received[s] += len(s.recv(4096))
        time.sleep(5)  # past the stall limit (3 s) before reading again: the server has given up on each
        for s in stalled:
            try:
                while chunk := s.recv(1 << 20):
                    received[s] += len(chunk)
            except ConnectionResetError:
                pass
        for s, n in received.items():
            assert n < 4 * N, "a stalled reader was sent its whole answer"  # the tensor alone is 4 * N bytes
    finally:
        for s in stalled:
            s.close()
    with connect(small_queue) as after:  # every slot is free again: no 503
        y = inputs(8)
        np.testing.assert_array_equal(call(after, y), np.maximum(y, 0))


def test_a_client_leaving_mid_body_gives_back_its_bytes_in_flight(patient):
    with connect(patient) as warm:  # the header is seen before: the body is kept as its chunks
        call(warm, inputs(0))
    request = frame(inputs(9))
    with connect(patient) as leaving:
        leaving.sendall(request[: len(request) // 2])
        with httpx.Client(base_url=patient.url, timeout=10) as http:
            assert until(lambda: gauge(http, "vkact_inflight_bytes") > 0)  # what it sent is held
            leaving.close()
            assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0)
    with connect(patient) as after:
        y = inputs(10)
        np.testing.assert_array_equal(call(after, y), np.maximum(y, 0))
