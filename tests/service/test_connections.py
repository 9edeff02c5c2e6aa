"""Connections that hold the service without finishing a request (slowloris), and more connections
than it takes: raw sockets on loopback against a real server."""
from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from tests.service.test_bombs import PROBE_TIMEOUT_S
from tests.service.conftest import Server, start_server, stop_server

# Driver-independent (test-portability.sh leaves them to make test): connections and partial requests, cut before a
# request is whole
pytestmark = pytest.mark.driver_independent

WAIT_S = 60  # the test's own bound on waiting for the server to drop a connection: far past its timeouts


def connect(server: Server) -> socket.socket:
    address = urlparse(server.url)
    return socket.create_connection((address.hostname, address.port), timeout=10)


def read_until_closed(socks: list[socket.socket], seconds: float) -> dict[socket.socket, bytes]:
    """Everything each socket receives until the server closes it; the sockets still open after
    ``seconds`` are missing from the result."""
    received = {s: b"" for s in socks}
    open_ = set(socks)
    deadline = time.monotonic() + seconds
    while open_ and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_), [], [], 0.5)
        for s in readable:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                received[s] += data
            else:
                open_.discard(s)
    return {s: data for s, data in received.items() if s not in open_}


def request(server: Server, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 request on a new connection: status, headers and body of the answer."""
    with connect(server) as s:
        s.sendall(raw)
        data = read_until_closed([s], WAIT_S).get(s, b"")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.fixture(scope="module")
def guarded() -> Server:
    server = start_server(header_timeout_s=1, body_timeout_s=1)
    yield server
    stop_server(server)


def test_200_half_sent_requests_are_dropped_after_the_read_timeouts(guarded):
    socks = [connect(guarded) for _ in range(200)]
    half_headers, silent, half_body = socks[:100], socks[100:150], socks[150:]
    for s in half_headers:
        s.sendall(b"POST /v1/execute HTTP/1.1\r\nHost: vkact\r\nContent-Le")
    for s in half_body:
        s.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [")
    with httpx.Client(base_url=guarded.url, timeout=PROBE_TIMEOUT_S) as probe:  # generous: an answer, not a latency (test_bombs)
        assert probe.get("/health/live").status_code == 200  # answered while the 200 are held
        closed = read_until_closed(socks, WAIT_S)
        assert len(closed) == 200, f"{200 - len(closed)} of 200 half-sent requests still held after {WAIT_S} s"
        for s in half_headers + silent:
            assert closed[s].startswith(b"HTTP/1.1 408 "), closed[s][:80]
            assert json.loads(closed[s].partition(b"\r\n\r\n")[2])["error"]
        assert probe.get("/health/live").status_code == 200
        assert probe.post("/v2/models/relu/infer", json={"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "FP32", "data": [-1, 2]}]}).json()["outputs"][0]["data"] == [0, 2]
    for s in socks:
        s.close()


def test_a_request_sent_in_slow_steady_pieces_is_answered(guarded):
    """The body timeout is a pause between bytes, not a deadline for the whole body."""
    body = json.dumps({"inputs": [{"name": "InputTensor", "shape": [3], "datatype": "FP32", "data": [-1.5, 0, 2.5]}]}).encode()
    with connect(guarded) as s:
        s.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        for i in range(0, len(body), 4):  # ~2.5 s in all, longer than the timeout, in pieces 0.1 s apart
            s.sendall(body[i : i + 4])
            time.sleep(0.1)
        answer = read_until_closed([s], WAIT_S)[s]
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["outputs"][0]["data"] == [0, 0, 2.5]


def test_connections_beyond_the_bound_get_503_and_probes_still_answer():
    server = start_server(max_connections=8, header_timeout_s=120)
    try:
        idle = [connect(server) for _ in range(8)]
        get = b"GET /v2 HTTP/1.1\r\nHost: vkact\r\nConnection: close\r\n\r\n"
        status, headers, body = request(server, get)
        assert status == 503 and headers["retry-after"] == "1", (status, headers)
        assert "VKACT_MAX_CONNECTIONS" in json.loads(body)["error"]
        status, _, body = request(server, b"GET /health/live HTTP/1.1\r\nHost: vkact\r\nConnection: close\r\n\r\n")
        assert status == 200 and json.loads(body) == {"live": True}
        for s in idle:
            s.close()
        for _ in range(100):  # until the server has seen them go
            status, _, body = request(server, get)
            if status == 200:
                break
            time.sleep(0.1)
        assert status == 200 and json.loads(body)["name"] == "vkact"
    finally:
        stop_server(server)


def _read_answers(s: socket.socket, count: int) -> list[tuple[str, dict[str, str], bytes]]:
    """``count`` HTTP/1.1 answers read off one connection, each by its Content-Length."""
    data, answers = b"", []
    deadline = time.monotonic() + WAIT_S
    while len(answers) < count and time.monotonic() < deadline:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode().split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:])
            length = int(headers["content-length"])
            if len(rest) >= length:
                answers.append((lines[0], headers, rest[:length]))
                data = rest[length:]
                continue
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return answers


def test_pipelined_inferences_are_answered_in_order_each_whole_and_close_is_honoured(guarded):
    """Requests sent back to back on one connection (HTTP/1.1 pipelining), /v2 binary and /v1 binary
    (both answered by a frame written whole: api.execution.send_whole), each get their own answer in
    order, with their own request id; ``Connection: close`` on the last closes the connection after it."""
    import numpy as np

    from tests.service.helpers import request_body

    address = urlparse(guarded.url)
    xs = [np.linspace(-3, 3, 256, dtype=np.float32) * (i + 1) for i in range(4)]
    header = json.dumps({"inputs": [{"name": "InputTensor", "shape": [256], "datatype": "FP32", "parameters": {"binary_data_size": 1024}}],
                         "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
    v1_header = json.dumps({"Operator": request_body("RELU", xs[2]), "Inputs": {"InputTensor": {"binary_data_size": 1024}}}).encode()
    raw = b""
    for i, x in enumerate(xs):
        last = i == len(xs) - 1
        path, head = ("/v1/execute", v1_header) if i == 2 else ("/v2/models/relu/infer", header)
        body = head + x.tobytes()
        raw += (f"POST {path} HTTP/1.1\r\nHost: {address.hostname}\r\nContent-Type: application/octet-stream\r\n"
                f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\nX-Request-ID: r{i}\r\n"
                + ("Connection: close\r\n" if last else "") + "\r\n").encode() + body
    with connect(guarded) as s:
        s.sendall(raw)
        answers = _read_answers(s, len(xs))
        assert s.recv(1) == b""  # closed after the last answer
    assert len(answers) == len(xs)
    for i, (status, headers, body) in enumerate(answers):
        assert status == "HTTP/1.1 200 OK", (status, body[:200])
        if i != 2:
            assert headers["x-request-id"] == f"r{i}"
        out = np.frombuffer(body[int(headers["inference-header-content-length"]):], np.float32)
        np.testing.assert_array_equal(out, np.maximum(xs[i].astype(np.float64), 0).astype(np.float32))
    assert answers[-1][1].get("connection") == "close"


def padded_head(path: bytes, head_bytes: int) -> bytes:
    """A GET of ``path`` whose headers make its head about ``head_bytes`` long (1 KiB headers)."""
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(head_bytes // 1024))
    return b"GET " + path + b" HTTP/1.1\r\nHost: vkact\r\n" + pad + b"Connection: close\r\n\r\n"


def test_a_head_past_the_bound_is_431_and_one_within_it_is_served(server):
    """h1http hands a head over 16 KiB to httptools, which bounds none: one client's 1,000 headers of 1 MiB grew
    the HTTP process by 850 MiB. Past MAX_HTTP_HEAD it is a 431 with a JSON body and the connection closes
    (without waiting for the rest); a 40 KiB head, over h1http's bound and within the other, is served."""
    status, _, body = request(server, padded_head(b"/v2/health/live", 40 << 10))
    assert status == 200
    with connect(server) as s:
        s.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\n")
        for i in range(1000):  # 1 MiB headers, until the server closes
            try:
                s.sendall(b"X-Pad-%d: %s\r\n" % (i, b"a" * (1 << 20)))
            except (BrokenPipeError, ConnectionResetError):
                break
        data = read_until_closed([s], WAIT_S).get(s)
    assert data is not None and i < 10, i  # closed, after the first MiB or so
    if data:  # the 431 may be lost to the reset of the bytes still unread
        assert data.startswith(b"HTTP/1.1 431 ") and "headers passed" in json.loads(data.partition(b"\r\n\r\n")[2])["error"]
    with connect(server) as s:  # the answer itself, where the client stops sending at the bound
        s.sendall(padded_head(b"/v2/health/live", 100 << 10))
        data = read_until_closed([s], WAIT_S).get(s)
    assert data is not None and data.startswith(b"HTTP/1.1 431 ")
    # a long URL counts too (httptools refuses one past 64 KiB alone: 400)
    status, _, body = request(server, b"GET /v2/health/live?" + b"a" * (60 << 10) + b" HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 8000
                              + b"\r\nConnection: close\r\n\r\n")
    assert status == 431 and "headers passed" in json.loads(body)["error"]
    assert httpx.get(server.url + "/v2/health/ready", timeout=WAIT_S).status_code == 200
