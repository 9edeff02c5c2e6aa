"""The HTTP port's native path (service/http_native.py, h1http.c) against the same service on httptools
alone (VKACT_HTTP_NATIVE=0): byte for byte the same answers, errors included; pipelined requests that
mix both parsers on one connection answered in order; what h1http leaves to httptools still served."""
from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import urlparse

import numpy as np
import pytest

from tests.service.conftest import Server, start_server, stop_server
from tests.service.helpers import binary_request, request_body
from tests.service.test_connections import read_until_closed

# Driver-independent (test-portability.sh leaves them to make test): the same answers from two HTTP parsers,
# whatever the device computes
pytestmark = pytest.mark.driver_independent

SETTINGS = {"max_body_bytes": 4096, "header_timeout_s": 5}  # a small body bound: its 413 is reachable natively


@pytest.fixture(scope="module")
def servers() -> dict[str, Server]:
    started = {"native": start_server(http_native=1, **SETTINGS), "httptools": start_server(http_native=0, **SETTINGS)}
    yield started
    for server in started.values():
        stop_server(server)


def raw_request(path: str, body: bytes, headers: dict[str, str] | None = None, method: bytes = b"POST") -> bytes:
    lines = [b"%s %s HTTP/1.1" % (method, path.encode()), b"Host: vkact"]
    lines += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
    if method == b"POST":
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(server: Server, raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``raw`` on one connection, closed by the server after its last answer (Connection: close);
    the answers in the order they came."""
    address = urlparse(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as s:
        s.sendall(raw)
        data = read_until_closed([s], 60)[s]
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        n = int(headers.get("content-length", 0))
        answers.append((int(lines[0].split()[1]), headers, rest[:n]))
        data = rest[n:]
    return answers


def comparable(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = answer
    return status, {k: v for k, v in headers.items() if k not in ("date", "x-request-id")}, body


X = np.linspace(-3, 3, 16, dtype=np.float32)
V2_JSON = json.dumps({"inputs": [{"name": "InputTensor", "shape": [16], "datatype": "FP32", "data": X.tolist()}]}).encode()
V2_HEAD = (b'{"inputs":[{"name":"InputTensor","shape":[16],"datatype":"FP32","parameters":{"binary_data_size":64}}],'
           b'"outputs":[{"name":"OutputTensor","parameters":{"binary_data":true}}]}')
V1_BINARY = binary_request(request_body("RELU", X), X)
CASES = {
    "v2 JSON": ("/v2/models/relu/infer", V2_JSON, {"Content-Type": "application/json"}),
    "v2 one version": ("/v2/models/relu/versions/1/infer", V2_JSON, {"X-Request-ID": "caller-7"}),
    "v2 binary": ("/v2/models/relu/infer", V2_HEAD + X.tobytes(),
                  {"Inference-Header-Content-Length": str(len(V2_HEAD)), "Content-Type": "application/octet-stream"}),
    "v1 binary": ("/v1/execute", *V1_BINARY),
    "v1 JSON": ("/v1/execute", json.dumps({"Operator": request_body("SIGMOID", X), "Inputs": {"InputTensor": X.tolist()}}).encode(), {}),
    "v2 bad datatype": ("/v2/models/relu/infer", V2_JSON.replace(b'"FP32"', b'"FP33"'), {}),
    "v2 unknown model": ("/v2/models/nope/infer", V2_JSON, {}),
    "v2 version missing": ("/v2/models/relu/versions/9/infer", V2_JSON, {}),
    "v1 not JSON": ("/v1/execute", b"{not json", {}),
    "over max_body_bytes": ("/v2/models/relu/infer", b" " * 5000, {}),
    "v2 JSON over 64 KiB": ("/v2/models/relu/infer", V2_JSON + b" " * 70_000, {}),  # handed over at its head: http_body
    "bad header length": ("/v2/models/relu/infer", V2_JSON, {"Inference-Header-Content-Length": "x"}),
    "HEAD of an inference route": ("/v2/models/relu/infer", b"", {"_method": "HEAD"}),
    "GET of an inference route": ("/v1/execute", b"", {"_method": "GET"}),
    "Expect: 100-continue": ("/v2/models/relu/infer", V2_JSON, {"Expect": "100-continue"}),
}


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_answers_are_those_of_httptools(servers, case):
    path, body, headers = CASES[case]
    headers = dict(headers)
    method = headers.pop("_method", "POST").encode()
    raw = raw_request(path, body, {**headers, "Connection": "close"}, method)
    native, plain = (exchange(servers[name], raw) for name in ("native", "httptools"))
    assert [comparable(a) for a in native] == [comparable(a) for a in plain]
    assert [("x-request-id" in h) for _, h, _ in native] == [("x-request-id" in h) for _, h, _ in plain]
    status, answer_headers, answer = native[-1]
    if status >= 400 and method != b"HEAD":
        assert json.loads(answer)["error"], answer  # 4xx with a JSON body
    if "X-Request-ID" in headers:
        assert answer_headers["x-request-id"] == headers["X-Request-ID"]
    if case == "v2 JSON":
        assert json.loads(answer)["outputs"][0]["data"] == np.maximum(X, 0).tolist()


def test_pipelined_requests_of_both_parsers_are_answered_in_order(servers):
    """Native requests, then one httptools takes (and the connection with it), then native ones again."""
    relu, live = CASES["v2 JSON"], ("/v2/health/live", b"", {})
    chunked = (b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(V2_JSON) + V2_JSON + b"\r\n0\r\n\r\n")
    raw = (raw_request(*relu) * 3 + raw_request(live[0], b"", method=b"GET") + chunked + raw_request(*relu)
           + raw_request(relu[0], relu[1], {"Connection": "close"}))
    for name in ("native", "httptools"):
        answers = exchange(servers[name], raw)
        assert [status for status, _, _ in answers] == [200] * 7, name
        for i, (_, _, body) in enumerate(answers):
            if i != 3:
                assert json.loads(body)["outputs"][0]["data"] == np.maximum(X, 0).tolist(), (name, i)


def test_repeated_binary_requests_pipelined_answer_as_on_httptools(servers):
    """Repeated binary headers, which the native port answers on the direct path (service/http_direct.py)
    from the second on, pipelined on one connection: the same answers as httptools', in order, right."""
    v2, v1 = CASES["v2 binary"], CASES["v1 binary"]
    # then a chunked one, which hands the connection to httptools while direct ones queue before it
    chunked = (b"POST /v1/execute HTTP/1.1\r\nHost: vkact\r\nTransfer-Encoding: chunked\r\n"
               + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in v1[2].items())
               + b"\r\n%x\r\n" % len(v1[1]) + v1[1] + b"\r\n0\r\n\r\n")
    raw = (raw_request(*v2) * 4 + raw_request(*v1) * 4 + chunked + raw_request(*v2)
           + raw_request(v2[0], v2[1], {**v2[2], "Connection": "close"}))
    native, plain = (exchange(servers[name], raw) for name in ("native", "httptools"))
    assert [comparable(a) for a in native] == [comparable(a) for a in plain]
    assert [status for status, _, _ in native] == [200] * 11
    for _, headers, body in native:
        assert body.endswith(np.maximum(X, 0).tobytes())
    assert all(len(headers["x-request-id"]) == 32 for _, headers, _ in native[:4] + native[9:])


def shrink(x: np.ndarray, bias: float, threshold: float) -> np.ndarray:
    """DirectML's SHRINK in float64, rounded to float32 once."""
    x64 = x.astype(np.float64)
    return np.where(x64 < -threshold, x64 + bias, np.where(x64 > threshold, x64 - bias, 0.0)).astype(np.float32)


@pytest.mark.parametrize("datatype", ["FP32", "FP16"])
def test_repeated_json_requests_pipelined_answer_each_ones_values(servers, datatype):
    """JSON /v2 requests of one structure whose values change, pipelined on one connection (the native port
    answers them on the direct path by their structure: v2.json_repeat): each answer is SHRINK of its own
    values (float64 numpy), and the same as httptools'."""
    dtype = np.float32 if datatype == "FP32" else np.float16
    xs = [np.random.default_rng(i).standard_normal(16).astype(dtype) * 2 for i in range(6)]
    params = {"Bias": 0.25, "Threshold": 0.5}
    bodies = [json.dumps({"inputs": [{"name": "InputTensor", "shape": [4, 4], "datatype": datatype, "data": x.reshape(4, 4).tolist()}],
                          "parameters": params}).encode() for x in xs]
    raw = b"".join(raw_request("/v2/models/shrink/infer", body, {"Connection": "close"} if i == len(bodies) - 1 else {})
                   for i, body in enumerate(bodies))
    native, plain = (exchange(servers[name], raw) for name in ("native", "httptools"))
    assert [comparable(a) for a in native] == [comparable(a) for a in plain]
    assert [status for status, _, _ in native] == [200] * len(xs)
    for x, (_, _, body) in zip(xs, native):
        got = np.array(json.loads(body)["outputs"][0]["data"], np.float64)
        expected = shrink(x.astype(np.float32), **{k.lower(): v for k, v in params.items()}).astype(dtype)
        np.testing.assert_array_equal(got, expected.astype(np.float64))


def test_many_keep_alive_requests_split_anywhere(servers):
    """One connection, 40 requests, written in pieces that cut heads and bodies at every offset."""
    path, body, headers = CASES["v1 binary"]
    raw = raw_request(path, body, headers) * 39 + raw_request(path, body, {**headers, "Connection": "close"})
    address = urlparse(servers["native"].url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        i, step = 0, 1
        while i < len(raw):
            s.sendall(raw[i : i + step])
            i += step
            step = step % 97 + 13
        data = read_until_closed([s], 60)[s]
    assert data.count(b"HTTP/1.1 200 OK") == 40
    assert data.count(np.maximum(X, 0).tobytes()) == 40


def test_a_request_over_the_native_body_bound_streams_through_uvicorn(servers):
    """h1http takes bodies up to 64 KiB; a larger one is httptools' (here: over max_body_bytes, 413)."""
    answers = exchange(servers["native"], raw_request("/v1/execute", b" " * 70000, {"Connection": "close"}))
    assert answers[0][0] == 413 and json.loads(answers[0][2])["field"] == "Content-Length"


def test_an_idle_keep_alive_connection_is_closed_and_a_busy_one_is_not(servers):
    """uvicorn's keep-alive timeout (5 s) holds on the native path, whose one timer is re-armed as it fires."""
    path, body, headers = CASES["v1 binary"]
    address = urlparse(servers["native"].url)
    busy = socket.create_connection((address.hostname, address.port), timeout=10)
    idle = socket.create_connection((address.hostname, address.port), timeout=10)
    with busy, idle:
        idle.sendall(raw_request(path, body, headers))
        started = time.monotonic()
        while time.monotonic() - started < 8:  # a request every second, past the 5 s: still open
            busy.sendall(raw_request(path, body, headers))
            assert busy.recv(65536).startswith(b"HTTP/1.1 200 OK")
            time.sleep(1)
        closed = read_until_closed([idle], 60)
        assert closed[idle].startswith(b"HTTP/1.1 200 OK") and closed[idle].count(b"HTTP/1.1") == 1
        busy.sendall(raw_request(path, body, {**headers, "Connection": "close"}))
        assert read_until_closed([busy], 60)[busy].startswith(b"HTTP/1.1 200 OK")


def server_output(server: Server) -> bytes:
    """What the server has logged since the last call (its output is a pipe: read without blocking)."""
    fd = server.process.stdout.fileno()  # type: ignore[union-attr]
    os.set_blocking(fd, False)
    out = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return out
        if not chunk:
            return out
        out += chunk


def test_a_client_that_pipelines_and_hangs_up_leaves_no_error_in_the_log(servers):
    """The answer in progress when a client with requests pipelined behind it hangs up: uvicorn marks only
    the newest request's cycle gone, and the answer went to the closed transport, an ERROR traceback each
    time (a log any client could flood). It is dropped quietly, and the service serves on."""
    v2, relu = CASES["v2 binary"], CASES["v2 JSON"]
    for name in ("native", "httptools"):
        server_output(servers[name])
        address = urlparse(servers[name].url)
        for i in range(40):
            with socket.create_connection((address.hostname, address.port), timeout=10) as s:
                s.sendall((raw_request(*v2) if i % 2 else raw_request(*relu)) * 3)
                time.sleep(0.002 * (i % 5))
        answers = exchange(servers[name], raw_request(relu[0], relu[1], {**relu[2], "Connection": "close"}))
        assert [status for status, _, _ in answers] == [200], name
        time.sleep(0.5)
        log = server_output(servers[name])
        assert b"Exception in" not in log and b"Traceback" not in log, (name, log[-3000:])
