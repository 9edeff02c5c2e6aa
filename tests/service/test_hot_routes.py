"""The inference routes answered before FastAPI (service/api/hot_routes.py) answer exactly as FastAPI's
own routing of the same handlers does: same status, headers and body, errors included."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi import FastAPI

from client.codec import HEADER_LENGTH
from service.api import create_app
from service.api.hot_routes import route
from service.jobs import Facts, Repeatable, Result
from tests.service.helpers import binary_request, request_body


class _Job:
    def release(self) -> None:
        pass


class EchoWorker:
    """The device worker's interface, answering with the input's bytes: this file tests routing, the
    numerics are tested against the real worker everywhere else."""

    ready, restarts, idle = True, 0, True
    info = {"max_tensor_bytes": 1 << 30}

    async def run(self, op, buffers, in_place, key=None, waiting=None) -> Result:
        out = np.zeros(op.output.total_bytes, np.uint8)
        out[: buffers[0].nbytes] = buffers[0]
        return Result(memoryview(out), 0.0, 0.0, _Job())

    def repeatable(self, op, key, in_place, spans):
        return Repeatable(op, key, in_place, spans, Facts(op))

    def submit_repeat(self, rep, tensors):
        return None  # every job through run (the direct HTTP path's task): see test_http_direct_now's FastEcho


def call(app, via_fastapi: bool, method: str, path: str, body: bytes = b"", headers: dict | None = None,
         keep_request_id: bool = False) -> tuple[int, dict, bytes]:
    raw_headers = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
    raw_headers.append((b"content-length", str(len(body)).encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": raw_headers,
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    entry = FastAPI.__call__ if via_fastapi else type(app).__call__
    asyncio.run(entry(app, scope, receive, send))
    start = sent[0]
    headers_out = {k.decode(): v.decode() for k, v in start["headers"]}
    if "X-Request-ID" not in (headers or {}) and path.startswith("/v2/") and not keep_request_id:  # a fresh random one each time
        assert len(headers_out.pop("x-request-id")) == 32
    return start["status"], headers_out, b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture(scope="module")
def app():
    app = create_app()
    app.runtime.worker = EchoWorker()
    return app


x = np.linspace(-2, 2, 12, dtype=np.float32)
v1_body, v1_headers = binary_request(request_body("IDENTITY", x), x.view(np.uint8))
v2_header = json.dumps({"inputs": [{"name": "InputTensor", "shape": [12], "datatype": "FP32", "parameters": {"binary_data_size": 48}}],
                        "parameters": {"binary_data_output": True}}).encode()
REQUESTS = [
    ("POST", "/v1/execute", v1_body, v1_headers),
    ("POST", "/v1/execute", json.dumps({"Operator": request_body("IDENTITY", x), "Inputs": {"InputTensor": x.tolist()}}).encode(), {}),
    ("POST", "/v1/execute", b"{not json", {}),
    ("POST", "/v1/execute", v1_body, {**v1_headers, HEADER_LENGTH: "99999"}),
    ("POST", "/v1/execute", json.dumps({"Operator": {"Type": "DML_OPERATOR_ACTIVATION_NOPE"}, "Inputs": {}}).encode(), {}),
    ("POST", "/v2/models/identity/infer", v2_header + x.tobytes(), {HEADER_LENGTH: len(v2_header), "X-Request-ID": "abc"}),
    ("POST", "/v2/models/identity/versions/1/infer", v2_header + x.tobytes(), {HEADER_LENGTH: len(v2_header), "X-Request-ID": "abc"}),
    ("POST", "/v2/models/identity/versions/7/infer", v2_header + x.tobytes(), {HEADER_LENGTH: len(v2_header), "X-Request-ID": "abc"}),
    ("POST", "/v2/models/nope/infer", v2_header + x.tobytes(), {HEADER_LENGTH: len(v2_header), "X-Request-ID": "abc"}),
    ("POST", "/v2/models/identity/infer", b'{"inputs": 3}', {"X-Request-ID": "abc"}),
]


@pytest.mark.parametrize("method, path, body, headers", REQUESTS, ids=[f"{r[1]}-{i}" for i, r in enumerate(REQUESTS)])
def test_hot_route_answers_as_fastapi_does(app, method, path, body, headers):
    assert route(method, path) is not None
    hot = call(app, False, method, path, body, headers)
    routed = call(app, True, method, path, body, headers)
    assert hot == routed
    if hot[0] == 200 and HEADER_LENGTH.lower() in hot[1]:  # the echo's bytes came back after the header
        assert hot[2][int(hot[1][HEADER_LENGTH.lower()]):][:48] == x.tobytes()


PATHS = ["/v1/execute", "/v1/execute/", "/v1/executes", "/v2/models/shrink/infer", "/v2/models/shrink/versions/1/infer",
         "/v2/models//infer", "/v2/models/a/b/infer", "/v2/models/shrink/versions//infer", "/v2/models/shrink/ready",
         "/v2/models/shrink/versions/1/2/infer", "/v2/models/infer", "/v2/infer", "/v3/models/shrink/infer"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_hot_routes_take_exactly_the_paths_fastapi_gives_their_handlers(app, method, path):
    """A path the hot routes take gets the same answer from FastAPI's router; one they leave to FastAPI
    reaches none of the inference handlers there either: they would answer this body with a 400."""
    body = b"{not json"
    routed = call(app, True, method, path, body)
    if route(method, path) is None:
        assert routed[0] != 400, routed
    else:
        assert call(app, False, method, path, body) == routed and routed[0] in (400, 404)


@pytest.mark.parametrize("body", [v2_header + x.tobytes(), b"{not json"], ids=["answer", "error"])
def test_hot_v2_routes_make_up_a_fresh_uuid4_request_id(app, body):
    """Without a usable X-Request-ID, each /v2 inference answer (errors too) carries a new UUID4's hex."""
    import uuid

    ids = []
    for given in ({}, {"X-Request-ID": ""}, {"X-Request-ID": "x" * 201}):
        status, headers, _ = call(app, False, "POST", "/v2/models/identity/infer", body, {HEADER_LENGTH: len(v2_header), **given},
                                  keep_request_id=True)
        assert status == (200 if body[:1] == b"{" and body[1:2] == b'"' else 400)
        rid = headers["x-request-id"]
        assert uuid.UUID(hex=rid).version == 4 and uuid.UUID(hex=rid).hex == rid
        ids.append(rid)
    assert len(set(ids)) == len(ids)


def test_a_repeated_v2_header_is_answered_with_the_same_headers_and_compressed_when_asked(app):
    """The second and later binary frames of one JSON header take the cached path (head and headers built
    once): the same status, headers and frame as the first; Accept-Encoding still compresses them."""
    import gzip

    header = json.dumps({"inputs": [{"name": "InputTensor", "shape": [12], "datatype": "FP32", "parameters": {"binary_data_size": 48}}],
                         "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
    answers = []
    for i in range(3):
        y = x + i
        status, headers, body = call(app, False, "POST", "/v2/models/identity/infer", header + y.tobytes(), {HEADER_LENGTH: len(header)})
        assert status == 200 and body[int(headers[HEADER_LENGTH.lower()]):][:48] == y.tobytes()
        answers.append((headers, body[: int(headers[HEADER_LENGTH.lower()])]))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0]["vary"] == "Accept-Encoding" and answers[0][0]["content-type"] == "application/octet-stream"
    status, headers, body = call(app, False, "POST", "/v2/models/identity/infer", header + x.tobytes(),
                                 {HEADER_LENGTH: len(header), "Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    plain = gzip.decompress(body)
    assert plain[: int(headers[HEADER_LENGTH.lower()])] == answers[0][1] and plain[len(answers[0][1]):][:48] == x.tobytes()
