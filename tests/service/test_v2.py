"""/v2 (Open Inference Protocol) through Triton's own Python clients, sync and asyncio, against the real
server: health, metadata, every model, binary and JSON tensors, FP16, integers, compression, ids."""
from __future__ import annotations

import asyncio
import gzip
import json
import re
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from client.codec import HEADER_LENGTH
from service.dataplane.models import MODELS, datatypes, param_fields
from service.operators import parse_operator
from tests.engine.test_operators import F32_ULP
from tests.helpers import assert_matches, tensor

RNG = np.random.default_rng(7)


def address(server) -> str:
    return server.url.removeprefix("http://")


@pytest.fixture(scope="module")
def tc(server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(address(server))
    yield client
    client.close()


def reference(model: str, arrays: dict[str, np.ndarray], **params) -> np.ndarray:
    """The operator's numpy reference for these inputs and parameters."""
    op_class = MODELS[model]
    desc = {"Type": op_class.type_name(), **{n: tensor(a.dtype, a.shape) for n, a in arrays.items()}, **params}
    return parse_operator(desc).reference(*(arrays[n] for n in op_class.input_fields))


def inputs_for(model: str, shape: tuple[int, ...], dtype=np.float32) -> dict[str, np.ndarray]:
    if np.dtype(dtype).kind in "iu":
        return {n: RNG.integers(-20, 20, shape).astype(dtype) for n in MODELS[model].input_fields}
    return {n: (RNG.standard_normal(shape) * 3).astype(dtype) for n in MODELS[model].input_fields}


def infer(client, model: str, arrays: dict[str, np.ndarray], binary_in=True, binary_out: bool | None = True, **kwargs):
    inputs = []
    for name, a in arrays.items():
        i = triton.InferInput(name, list(a.shape), triton_dtype(a.dtype))
        i.set_data_from_numpy(a, binary_data=binary_in)
        inputs.append(i)
    output = MODELS[model].output_field
    outputs = None if binary_out is None else [triton.InferRequestedOutput(output, binary_data=binary_out)]
    return client.infer(model, inputs, outputs=outputs, **kwargs)


def triton_dtype(dtype) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(np.dtype(dtype))


def output_of(model: str) -> str:
    return MODELS[model].output_field


# -- health and metadata --------------------------------------------------------------------------------


def test_health(tc):
    assert tc.is_server_live() and tc.is_server_ready()
    assert tc.is_model_ready("shrink") and tc.is_model_ready("scaled_tanh", "1")
    assert not tc.is_model_ready("nope") and not tc.is_model_ready("shrink", "2")


def test_unknown_model_readiness_reads_false(server):
    """A probe that reads the flag: false for an unknown model or version, the reason beside it."""
    with server.client() as http:
        for path, answer, reason in (("/v2/models/nope/ready", {"name": "nope"}, "unknown model"),
                                     ("/v2/models/shrink/versions/2/ready", {"name": "shrink", "version": "2"}, "no version")):
            r = http.get(path)
            assert r.status_code == 404
            assert r.json() == {**answer, "ready": False, "error": r.json()["error"]} and reason in r.json()["error"]


def test_server_metadata_lists_only_what_is_implemented(tc):
    meta = tc.get_server_metadata()
    assert meta["name"] == "vkact" and meta["version"]
    assert set(meta["extensions"]) == {"binary_tensor_data", "system_shared_memory", "model_repository", "model_configuration", "statistics"}


@pytest.mark.parametrize("model", list(MODELS))
def test_every_operator_is_a_model(tc, model):
    """Generated from the registry: a model per operator, its tensors named as the descriptor's fields."""
    op = MODELS[model]
    meta = tc.get_model_metadata(model)
    assert meta == tc.get_model_metadata(model, "1")
    assert meta["name"] == model and meta["versions"] == ["1"]
    assert [i["name"] for i in meta["inputs"]] == list(op.input_fields)
    assert [o["name"] for o in meta["outputs"]] == [op.output_field]
    # every accepted type: served on this device, or refused with the device feature it lacks
    served = meta["parameters"]["datatypes"].split(",")
    refused = [t.split(" (")[0] for t in meta["parameters"].get("datatypes_refused", "").split(",") if t]
    assert served == [t for t in datatypes(op) if t not in refused] and set(refused) <= set(datatypes(op))
    config = tc.get_model_config(model)
    batched = op.kind == "elementwise"  # the device worker batches elementwise models only
    assert (config["max_batch_size"] > 1) == batched and ("dynamic_batching" in config) == batched and config["name"] == model
    shape = [-1, -1] if batched else [-1]  # a batched model's leading dimension, as Triton shows it
    assert all(t["datatype"] == "FP32" and t["shape"] == shape for t in meta["inputs"] + meta["outputs"])
    assert meta["parameters"]["dimension_counts"] == "1-8"
    assert config["parameters"]["datatypes"]["string_value"] == meta["parameters"]["datatypes"]
    assert [i["name"] for i in config["input"]] == list(op.input_fields)
    assert all(i["dims"] == [-1] and i["data_type"] == "TYPE_FP32" for i in config["input"] + config["output"])


def test_repository_index(tc):
    index = tc.get_model_repository_index()
    assert [m["name"] for m in index] == list(MODELS)
    assert all(m["state"] == "READY" and m["version"] == "1" for m in index)
    tc.load_model("shrink")  # always loaded: a no-op
    with pytest.raises(InferenceServerException, match="cannot be unloaded"):
        tc.unload_model("shrink")


# -- inference ------------------------------------------------------------------------------------------

CASES = [
    ("shrink", {"Bias": 0.25, "Threshold": 0.75}),
    ("shrink", {}),
    ("celu", {"Alpha": 0.3}),
    ("softsign", {}),
    ("scaled_tanh", {"Alpha": 1.7159, "Beta": 0.6667}),
    ("parameterized_relu", {}),
    ("relu_grad", {}),
]


@pytest.mark.parametrize("binary_in,binary_out", [(True, True), (False, False), (True, False), (False, True)], ids=["bin-bin", "json-json", "bin-json", "json-bin"])
@pytest.mark.parametrize("model,params", CASES, ids=[f"{m}{'-p' if p else ''}" for m, p in CASES])
def test_infer_matches_the_reference(tc, model, params, binary_in, binary_out):
    arrays = inputs_for(model, (3, 5))
    result = infer(tc, model, arrays, binary_in, binary_out, parameters=params)
    kind = MODELS[model].type_name().removeprefix("DML_OPERATOR_ACTIVATION_")
    assert_matches(result.as_numpy(output_of(model)), reference(model, arrays, **params), F32_ULP.get(kind, 4))
    entry = result.get_output(output_of(model))
    assert entry["datatype"] == "FP32" and entry["shape"] == [3, 5]
    assert ("binary_data_size" in entry.get("parameters", {})) == binary_out


@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_infers(tc, model):
    """Operators added later are served without a route change; the engine tests own their accuracy."""
    arrays = inputs_for(model, (3, 4))
    params = {"Axes": [1]} if "Axes" in param_fields(MODELS[model]) else {}
    y = infer(tc, model, arrays, parameters=params).as_numpy(output_of(model))
    np.testing.assert_allclose(y, reference(model, arrays, **params), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_fp16(tc, binary):
    """FP16 in binary, as Triton, and in JSON too, which Triton refuses: accepting it is friendlier."""
    arrays = inputs_for("celu", (7,), np.float16)
    result = infer(tc, "celu", arrays, binary, binary, parameters={"Alpha": 0.5})
    assert result.get_output("OutputTensor")["datatype"] == "FP16"
    assert_matches(result.as_numpy("OutputTensor"), reference("celu", arrays, Alpha=0.5), 1)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint32])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_shrink_integers(tc, dtype, binary):
    x = {"InputTensor": np.arange(-9, 9).astype(dtype)}  # 18 elements: not a multiple of 4 bytes for INT8
    result = infer(tc, "shrink", x, binary, binary, parameters={"Bias": 1.5, "Threshold": 2})
    y = result.as_numpy("OutputTensor")
    assert y.dtype == dtype and result.get_output("OutputTensor")["datatype"] == triton_dtype(dtype)
    np.testing.assert_array_equal(y, reference("shrink", x, Bias=1.5, Threshold=2))


def test_outputs_omitted_are_all_returned_binary(tc):
    """tritonclient then asks for binary_data_output; the two-input RELU_GRAD's one output comes back."""
    arrays = inputs_for("relu_grad", (4, 4))
    result = infer(tc, "relu_grad", arrays, binary_out=None)
    assert "binary_data_size" in result.get_output("OutputGradientTensor")["parameters"]
    assert_matches(result.as_numpy("OutputGradientTensor"), reference("relu_grad", arrays), 0)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_compression(tc, algorithm, binary):
    x = {"InputTensor": np.linspace(-3, 3, 1000, dtype=np.float32)}
    result = infer(tc, "shrink", x, binary, binary, request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OutputTensor"), reference("shrink", x))


def test_version_and_request_id(tc):
    x = {"InputTensor": np.ones(4, np.float32)}
    result = infer(tc, "softsign", x, model_version="1", request_id="req-42")
    assert result.get_response()["id"] == "req-42" and result.get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException) as info:
        infer(tc, "softsign", x, model_version="2")
    assert info.value.status() == "404" and "only version is 1" in info.value.message()


def test_nan_and_infinity_in_json(tc):
    x = {"InputTensor": np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)}
    y = infer(tc, "scaled_tanh", x, False, False).as_numpy("OutputTensor")
    np.testing.assert_array_equal(y, reference("scaled_tanh", x))


def test_asyncio_client(server):
    async def scenario() -> None:
        async with triton_aio.InferenceServerClient(address(server)) as client:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready("celu")
            assert (await client.get_model_metadata("celu"))["inputs"][0]["name"] == "InputTensor"
            assert "binary_tensor_data" in (await client.get_server_metadata())["extensions"]
            x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
            for binary in (True, False):
                for algorithm in (None, "gzip", "deflate"):
                    i = triton.InferInput("InputTensor", [8, 8], "FP32")
                    i.set_data_from_numpy(x, binary_data=binary)
                    out = triton.InferRequestedOutput("OutputTensor", binary_data=binary)
                    result = await client.infer("celu", [i], outputs=[out], parameters={"Alpha": 0.5},
                                                request_compression_algorithm=algorithm, response_compression_algorithm=algorithm)
                    assert_matches(result.as_numpy("OutputTensor"), reference("celu", {"InputTensor": x}, Alpha=0.5), 4)
            with pytest.raises(InferenceServerException, match="unknown model"):
                await client.infer("nope", [i])

    asyncio.run(scenario())


# -- the protocol by hand (httpx): what tritonclient does not send ---------------------------------------


def test_nested_json_data_and_x_request_id(http):
    body = {"inputs": [{"name": "InputTensor", "shape": [2, 3], "datatype": "FP32", "data": [[-2, -1, 0], [1, 2, 3]]}],
            "parameters": {"Threshold": 1.0}}
    response = http.post("/v2/models/shrink/infer", json=body, headers={"X-Request-ID": "trace-7"})
    assert response.status_code == 200 and response.headers["x-request-id"] == "trace-7"
    out = response.json()
    assert out["id"] == "trace-7" and out["model_name"] == "shrink"
    assert out["outputs"] == [{"name": "OutputTensor", "datatype": "FP32", "shape": [2, 3], "data": [-2.0, 0.0, 0.0, 0.0, 2.0, 3.0]}]
    assert re.fullmatch(r"[0-9a-f]{32}", http.get("/v2/health/live").headers["x-request-id"])  # one is made up


def test_raw_binary_request(http):
    """Inference-Header-Content-Length: 0 means no JSON at all: the body is the one input's bytes, read
    as a 1-D FP32 tensor; every output comes back binary."""
    x = np.linspace(-3, 3, 10, dtype=np.float32)
    response = http.post("/v2/models/shrink/infer", content=x.tobytes(), headers={HEADER_LENGTH: "0"})
    assert response.status_code == 200, response.text
    n = int(response.headers[HEADER_LENGTH])
    head = json.loads(response.content[:n])
    assert head["outputs"][0]["shape"] == [10] and head["outputs"][0]["parameters"] == {"binary_data_size": 40}
    np.testing.assert_array_equal(np.frombuffer(response.content[n:], np.float32), reference("shrink", {"InputTensor": x}))


def test_compressed_binary_response_header_counts_the_uncompressed_json(http):
    x = np.arange(16, dtype=np.float32)
    head = json.dumps({"inputs": [{"name": "InputTensor", "shape": [16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}],
                       "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
    body = gzip.compress(head + x.tobytes())
    with http.stream("POST", "/v2/models/identity/infer", content=body,
                     headers={HEADER_LENGTH: str(len(head)), "Content-Encoding": "gzip", "Accept-Encoding": "deflate"}) as response:
        assert response.status_code == 200 and response.headers["content-encoding"] == "deflate"
        raw = zlib.decompress(b"".join(response.iter_raw()))  # as sent: httpx would decode it
    n = int(response.headers[HEADER_LENGTH])
    assert json.loads(raw[:n])["outputs"][0]["parameters"]["binary_data_size"] == 64
    np.testing.assert_array_equal(np.frombuffer(raw[n:], np.float32), x)


def test_triton_metrics(tc, http):
    def value(text: str, name: str, model: str) -> float:
        match = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        assert match, f"{name} for {model} missing"
        return float(match.group(1))

    before = http.get("/metrics").text
    infer(tc, "softsign", {"InputTensor": np.ones(8, np.float32)})
    infer(tc, "softsign", {"InputTensor": np.ones(8, np.float32)}, parameters={})
    with pytest.raises(InferenceServerException):
        infer(tc, "softsign", {"InputTensor": np.ones(8, np.float32)}, parameters={"Alpha": 1.0})
    after = http.get("/metrics").text
    assert "# TYPE nv_inference_request_success counter" in after and "nv_inference_request_success_total" not in after
    for name, delta in [("nv_inference_request_success", 2), ("nv_inference_count", 2), ("nv_inference_exec_count", 2), ("nv_inference_request_failure", 1)]:
        assert value(after, name, "softsign") - value(before, name, "softsign") == delta, name
    for name in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_compute_infer_duration_us",
                 "nv_inference_compute_input_duration_us", "nv_inference_compute_output_duration_us"):
        assert value(after, name, "softsign") >= value(before, name, "softsign")
    # compute_input is the request's time outside its queue and dispatch, as the statistics' span
    spans = tc.get_inference_statistics("softsign")["model_stats"][0]["inference_stats"]
    assert abs(value(after, "nv_inference_compute_input_duration_us", "softsign") - spans["compute_input"]["ns"] / 1000) <= 1
    assert value(after, "nv_inference_compute_input_duration_us", "softsign") > value(before, "nv_inference_compute_input_duration_us", "softsign")
    assert value(after, "nv_inference_pending_request_count", "softsign") == 0
    assert 'vkact_requests_total{code="200",operator="DML_OPERATOR_ACTIVATION_SOFTSIGN"}' in after
