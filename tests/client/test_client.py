"""Client and AsyncClient against an httpx.MockTransport: request frames, responses, errors."""
from __future__ import annotations

import base64
import inspect
import json
from email.utils import format_datetime
from datetime import datetime, timedelta, timezone

import httpx
import numpy as np
import pytest

from client import (
    AsyncClient, BadRequest, Client, Encoding, InternalServerError, InvalidDescriptor, NotFound,
    PayloadTooLarge, ProtocolError, ServerError, ServiceBusy, Timeout, TransportError,
)
from client import codec
from client.codec import HEADER_LENGTH

from .fake_server import FakeServer, output_response, response

ENCODINGS = [e.value for e in Encoding]
rng = np.random.default_rng(7)
ARRAYS = {
    "contiguous": rng.standard_normal((3, 4)).astype(np.float32),
    "every-other": rng.standard_normal((4, 6)).astype(np.float32)[:, ::2],
    "transposed": rng.standard_normal((3, 5)).astype(np.float32).T,
    "reversed": rng.standard_normal(7).astype(np.float32)[::-1],
    "broadcast": np.broadcast_to(rng.standard_normal(3).astype(np.float32), (2, 3)),
    "float16-odd": rng.standard_normal(5).astype(np.float16),
    "0-d": np.float32(1.25),
    "non-finite": np.array([np.nan, np.inf, -np.inf, 0.0], np.float32),
    "empty": np.zeros((0, 2), np.float32),
}


def make_client(handler, **kw) -> Client:
    return Client("http://vkact.test", transport=httpx.MockTransport(handler), **kw)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


# -- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("name", list(ARRAYS))
def test_round_trip_negates(server: FakeServer, name: str, encoding: str) -> None:
    x = ARRAYS[name]
    with make_client(server, encoding=encoding) as vk:
        y = vk.softsign(x)
    np.testing.assert_array_equal(y, -np.asarray(x))
    assert y.dtype == np.asarray(x).dtype and y.shape == np.shape(x)
    assert y.flags.owndata and y.flags.c_contiguous


def test_strided_input_asks_for_a_packed_output(server: FakeServer) -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    with make_client(server) as vk:
        vk.softsign(x)
    op = server.last[0]["Operator"]
    assert op["InputTensor"]["Strides"] == [6, 2]
    assert op["OutputTensor"] == {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [4, 3], "TotalTensorSizeInBytes": 48}


def test_in_place_and_output_strides(server: FakeServer) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with make_client(server) as vk:
        y = vk.celu(x, alpha=2.0, in_place=True, feature_level="5.1")
        assert server.last[0]["InPlace"] is True and server.last[0]["FeatureLevel"] == "DML_FEATURE_LEVEL_5_1"
        assert "OutputTensor" not in server.last[0]["Operator"]
        z = vk.celu(x, output_strides=(1, 2))  # column-major output: the response comes back strided
    assert server.last[0]["Operator"]["OutputTensor"]["Strides"] == [1, 2]
    np.testing.assert_array_equal(y, -x)
    np.testing.assert_array_equal(z, -x)


# -- request bodies -----------------------------------------------------------------------------

def test_binary_frame_layout(server: FakeServer) -> None:
    x = np.arange(3, dtype=np.float16)  # 6 bytes: the frame carries 8
    with make_client(server) as vk:
        vk.shrink(x)
    request = server.requests[-1]
    n = int(request.headers[HEADER_LENGTH])
    assert request.headers["Content-Type"] == "application/octet-stream"
    assert int(request.headers["Content-Length"]) == len(request.content) == n + 8
    header = json.loads(request.content[:n])
    assert header == {
        "Operator": {
            "Type": "DML_OPERATOR_ACTIVATION_SHRINK",
            "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT16", "Sizes": [3], "TotalTensorSizeInBytes": 8},
            "Bias": 0.0,
            "Threshold": 0.5,
        },
        "Inputs": {"InputTensor": {"binary_data_size": 8}},
        "InPlace": False,
        "ResponseEncoding": "binary",
    }
    assert request.content[n:] == x.tobytes() + b"\0\0"


def test_json_body(server: FakeServer) -> None:
    x = np.array([[1.5, np.nan], [np.inf, -2.0]], np.float32)
    with make_client(server, encoding="json") as vk:
        vk.scaled_tanh(x, beta=0.25)
    request = server.requests[-1]
    assert request.headers["Content-Type"] == "application/json" and HEADER_LENGTH not in request.headers
    body = json.loads(request.content)
    assert body["Inputs"] == {"InputTensor": [1.5, "NaN", "Infinity", -2.0]}
    assert body["Operator"]["Alpha"] == 1.0 and body["Operator"]["Beta"] == 0.25
    assert body["ResponseEncoding"] == "json"


def test_base64_body_and_per_call_encoding(server: FakeServer) -> None:
    x = np.arange(4, dtype=np.float32)
    with make_client(server, encoding="json") as vk:
        vk.softsign(x, encoding="base64")
    body = json.loads(server.requests[-1].content)
    assert base64.b64decode(body["Inputs"]["InputTensor"]["base64"]) == x.tobytes()
    assert body["ResponseEncoding"] == "base64"


def test_execute_accepts_type_short_name_and_dict(server: FakeServer) -> None:
    x = np.ones(2, np.float32)
    with make_client(server) as vk:
        vk.execute("DML_OPERATOR_ACTIVATION_CELU", x, params={"Alpha": 3.0})
        assert server.last[0]["Operator"] == {"Type": "DML_OPERATOR_ACTIVATION_CELU", "InputTensor": server.last[0]["Operator"]["InputTensor"], "Alpha": 3.0}
        vk.execute("shrink", x)
        assert server.last[0]["Operator"]["Type"] == "DML_OPERATOR_ACTIVATION_SHRINK" and "Bias" not in server.last[0]["Operator"]
        vk.execute({"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "Bias": 0.25}, x, params={"Threshold": 1.0})
        assert server.last[0]["Operator"]["Bias"] == 0.25 and server.last[0]["Operator"]["Threshold"] == 1.0
        with pytest.raises(TypeError, match="takes 1 array"):
            vk.execute("shrink", x, x)
        with pytest.raises(ValueError, match="InputTensor"):
            vk.execute({"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "InputTensor": {}}, x)
        with pytest.raises(TypeError, match="no DML_TENSOR_DATA_TYPE"):
            vk.softsign(np.zeros(2, np.complex64))
    assert len(server.requests) == 3


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_numpy_scalar_parameters_are_sent_as_numbers(server: FakeServer, encoding: str) -> None:
    with make_client(server, encoding=encoding) as vk:
        vk.shrink(np.ones(2, np.float32), bias=np.float32(0.25), threshold=np.float64(1.5))
    op = server.last[0]["Operator"]
    assert (op["Bias"], op["Threshold"]) == (0.25, 1.5)


def test_headers_and_base_url_are_used(server: FakeServer) -> None:
    with make_client(server, headers={"X-Trace": "abc"}) as vk:
        vk.softsign(np.ones(1, np.float32))
    request = server.requests[-1]
    assert request.headers["X-Trace"] == "abc" and str(request.url) == "http://vkact.test/v1/execute"


@pytest.mark.parametrize("base", ["http://gateway.test/vkact", "http://gateway.test/vkact/"])
def test_a_base_url_with_a_path_prefixes_every_request(server: FakeServer, base: str) -> None:
    """Behind a gateway that routes a path prefix; /v1/execute is resolved once and reused."""
    seen: list[str] = []

    def gateway(request: httpx.Request) -> httpx.Response:  # strips the prefix, as the gateway would
        seen.append(str(request.url))
        path = request.url.path.removeprefix("/vkact")
        if path == "/health/live":
            return httpx.Response(200, json={"live": True})
        return server(httpx.Request(request.method, request.url.copy_with(path=path), headers=request.headers, content=request.content))

    with Client(base, transport=httpx.MockTransport(gateway)) as vk:
        assert vk.softsign(np.ones(1, np.float32)).tolist() == [-1.0]
        assert vk.softsign(np.ones(2, np.float32)).tolist() == [-1.0, -1.0]
        assert vk.live()
    assert seen == ["http://gateway.test/vkact/v1/execute"] * 2 + ["http://gateway.test/vkact/health/live"]


def test_generated_methods_follow_the_registry() -> None:
    from service.client_codegen import snake
    from service.operators import OPERATORS, short_name

    for op in OPERATORS.values():
        sig = inspect.signature(getattr(Client, short_name(op)))
        kwonly = {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}
        # snake_case of the DirectML field: Alpha -> alpha, SigmoidInputScale -> sigmoid_input_scale
        assert kwonly == {snake(f): op.model_fields[f].default for f in op.param_fields()}
        assert op.type_name() in getattr(Client, short_name(op)).__doc__


# -- responses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", list(Encoding))
def test_strided_padded_response_in_each_encoding(encoding: Encoding) -> None:
    result = np.arange(6, dtype=np.float16).reshape(2, 3)
    desc = {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT16", "Sizes": [2, 3], "Strides": [1, 2], "TotalTensorSizeInBytes": 12}
    with make_client(lambda request: output_response("DML_OPERATOR_ACTIVATION_SOFTSIGN", desc, result, encoding)) as vk:
        y = vk.softsign(np.zeros((2, 3), np.float16))
    np.testing.assert_array_equal(y, result)
    assert y.dtype == np.float16 and y.flags.c_contiguous


@pytest.mark.parametrize(
    "reply",
    [
        lambda: httpx.Response(200, text="<html>proxy</html>"),
        lambda: httpx.Response(200, json={"Operator": "x"}),
        lambda: httpx.Response(200, json={"OutputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [4]}, "Output": {"binary_data_size": 16}}),
        lambda: httpx.Response(200, json={"OutputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [4], "TotalTensorSizeInBytes": 4}, "Output": [1]}),
        lambda: httpx.Response(200, json={"OutputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [2]}, "Output": [1, "x"]}),
        lambda: response({"OutputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [1]}, "Output": {"binary_data_size": 4}}, [np.zeros(2, np.uint8)], Encoding.BINARY),
    ],
    ids=["html", "no-output", "missing-bytes", "short-total", "bad-number", "short-frame"],
)
def test_malformed_success_is_a_protocol_error(reply) -> None:
    with make_client(lambda request: reply()) as vk, pytest.raises(ProtocolError):
        vk.softsign(np.zeros(4, np.float32))


# -- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "status, cls",
    [(400, BadRequest), (404, NotFound), (413, PayloadTooLarge), (422, InvalidDescriptor), (409, ServerError),
     (500, InternalServerError), (502, InternalServerError), (503, ServiceBusy)],
)
def test_error_status_maps_to_exception(status: int, cls: type[ServerError]) -> None:
    body = {"error": "InputTensor.Sizes[2]: must be positive", "field": "InputTensor.Sizes[2]"}
    with make_client(lambda request: httpx.Response(status, json=body)) as vk, pytest.raises(cls) as info:
        vk.shrink(np.zeros(2, np.float32))
    assert type(info.value) is cls
    assert (info.value.status, info.value.message, info.value.field) == (status, body["error"], body["field"])
    assert "InputTensor.Sizes[2]" in str(info.value)


@pytest.mark.parametrize(
    "header, expected",
    [("3", 3.0), ("0.5", 0.5), (None, None), ("soon", None), ("HTTP-date in 120 s", pytest.approx(120, abs=5))],
)
def test_busy_carries_retry_after(header: str | None, expected) -> None:
    if header == "HTTP-date in 120 s":  # made now, not at collection, which may be minutes earlier
        header = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=120), usegmt=True)
    headers = {"Retry-After": header} if header else {}
    reply = httpx.Response(503, json={"error": "queue full", "field": None}, headers=headers)
    with make_client(lambda request: reply) as vk, pytest.raises(ServiceBusy) as info:
        vk.softsign(np.zeros(1, np.float32))
    assert info.value.retry_after == expected and info.value.field is None and info.value.message == "queue full"


def test_error_without_json_body_keeps_the_text() -> None:
    with make_client(lambda request: httpx.Response(502, text="Bad gateway from nginx")) as vk, pytest.raises(InternalServerError) as info:
        vk.softsign(np.zeros(1, np.float32))
    assert info.value.message == "Bad gateway from nginx" and info.value.field is None


@pytest.mark.parametrize("exc, cls", [(httpx.ConnectError("refused"), TransportError), (httpx.ReadTimeout("slow"), Timeout)])
def test_transport_errors_are_wrapped(exc: Exception, cls: type) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    with make_client(handler) as vk, pytest.raises(cls) as info:
        vk.live()
    assert info.value.__cause__ is exc


# -- other endpoints and lifetime ---------------------------------------------------------------

def endpoints(ready_status: int = 200):
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/operators":
            return httpx.Response(200, json={"operators": ["DML_OPERATOR_ACTIVATION_CELU"]})
        if path == "/v1/device":
            return httpx.Response(200, json={"name": "llvmpipe"})
        if path == "/health/live":
            return httpx.Response(200, json={"status": "live"})
        if path == "/health/ready":
            return httpx.Response(ready_status, json={"error": "warming up", "field": None})
        return httpx.Response(404, json={"error": "no route", "field": None})
    return handler


def test_catalog_device_and_health() -> None:
    with make_client(endpoints()) as vk:
        assert vk.operators() == {"operators": ["DML_OPERATOR_ACTIVATION_CELU"]}
        assert vk.device() == {"name": "llvmpipe"}
        assert vk.live() is True and vk.ready() is True
    with make_client(endpoints(503)) as vk:
        assert vk.ready() is False
    with make_client(endpoints(500)) as vk, pytest.raises(InternalServerError):
        vk.ready()


def test_one_http_client_per_client_closed_on_exit(server: FakeServer) -> None:
    with make_client(server) as vk:
        http = vk._http
        vk.softsign(np.ones(1, np.float32))
        vk.softsign(np.ones(1, np.float32))
        assert vk._http is http and not http.is_closed
    assert http.is_closed
    assert repr(vk) == "Client('http://vkact.test', encoding='binary')"


# -- async ----------------------------------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_async_round_trip(server: FakeServer, encoding: str) -> None:
    x = ARRAYS["every-other"]
    async with AsyncClient("http://vkact.test", transport=httpx.MockTransport(server), encoding=encoding) as vk:
        y = await vk.scaled_tanh(x, alpha=2.0)
        z = await vk.execute("celu", ARRAYS["0-d"])
        http = vk._http
    assert http.is_closed
    np.testing.assert_array_equal(y, -x)
    assert z.shape == () and z == -ARRAYS["0-d"]
    assert "Alpha" not in server.last[0]["Operator"]  # execute() sends no defaults: the service has them
    first = server.requests[0]
    header = codec.split_frame(first.content, first.headers.get(HEADER_LENGTH))[0]
    assert (header["Operator"]["Alpha"], header["Operator"]["Beta"]) == (2.0, 0.5)  # the method sends its defaults


@pytest.mark.anyio
async def test_async_errors_and_endpoints() -> None:
    async with AsyncClient(transport=httpx.MockTransport(endpoints(503))) as vk:
        assert await vk.live() is True and await vk.ready() is False
        assert await vk.device() == {"name": "llvmpipe"}
    reply = httpx.Response(503, json={"error": "busy", "field": None}, headers={"Retry-After": "2"})
    async with AsyncClient(transport=httpx.MockTransport(lambda request: reply)) as vk:
        with pytest.raises(ServiceBusy) as info:
            await vk.softsign(np.zeros(1, np.float32))
    assert info.value.retry_after == 2.0


@pytest.mark.anyio
async def test_async_transport_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("no route")

    async with AsyncClient(transport=httpx.MockTransport(handler)) as vk:
        with pytest.raises(Timeout):
            await vk.operators()
