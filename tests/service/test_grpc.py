"""The Open Inference Protocol over gRPC: tritonclient.grpc (sync and asyncio), unchanged, against the real
server's gRPC port; every RPC, typed and raw tensors, system shared memory, error codes and the standard
health service. Results are checked against the operators' numpy references, metadata against /v2's."""
from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.engine.test_operators import F32_ULP
from tests.helpers import assert_matches
from tests.service.test_v2 import inputs_for, output_of, reference, triton_dtype
from tests.service.test_v2_errors import assert_still_serving
from tests.service.test_v2_shm import Region


@pytest.fixture(scope="module")
def gc(server) -> Iterator[tg.InferenceServerClient]:
    client = tg.InferenceServerClient(server.grpc)
    client.unregister_system_shared_memory()
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture(scope="module")
def stub(server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """Raw requests, for what tritonclient never sends (typed contents, malformed messages)."""
    with grpc.insecure_channel(server.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list[tg.InferInput]:
    out = []
    for name, a in arrays.items():
        out.append(tg.InferInput(name, list(a.shape), triton_dtype(a.dtype)).set_data_from_numpy(a))
    return out


def code_of(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


# -- health, metadata, repository ---------------------------------------------------------------------


def test_health_rpcs(gc):
    assert gc.is_server_live() and gc.is_server_ready()
    assert gc.is_model_ready("shrink") and gc.is_model_ready("shrink", "1")
    # as Triton: an unknown model or version is not ready (OK, ready=false), not NOT_FOUND
    assert not gc.is_model_ready("nope") and not gc.is_model_ready("shrink", "2")


def test_standard_health_service(server):
    with grpc.insecure_channel(server.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "inference.GRPCInferenceService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=name)).status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_metadata_is_v2s(gc, http):
    meta = gc.get_server_metadata()
    assert meta.name == "vkact" and list(meta.extensions) == http.get("/v2").json()["extensions"]
    assert "statistics" in meta.extensions
    for model in MODELS:
        over_http = http.get(f"/v2/models/{model}").json()
        got = json_format.MessageToDict(gc.get_model_metadata(model), preserving_proto_field_name=True)
        for tensor in got["inputs"] + got["outputs"]:
            tensor["shape"] = [int(d) for d in tensor["shape"]]  # protobuf's JSON writes int64 as strings
        assert got == {k: v for k, v in over_http.items() if k != "parameters"}  # the gRPC message has no parameters
        assert gc.get_model_metadata(model, "1") == gc.get_model_metadata(model)
        config = gc.get_model_config(model, as_json=True)["config"]
        expected = http.get(f"/v2/models/{model}/config").json()
        assert config["name"] == expected["name"] == model and config["backend"] == "vkact"
        assert [i["name"] for i in config["input"]] == [i["name"] for i in expected["input"]]
        assert all(t["data_type"] == "TYPE_FP32" and t["dims"] == ["-1"] for t in config["input"] + config["output"])
        assert {k: v["string_value"] for k, v in config.get("parameters", {}).items()} == {k: v["string_value"] for k, v in expected["parameters"].items()}
    assert code_of(lambda: gc.get_model_metadata("nope"))[0] == "StatusCode.NOT_FOUND"
    assert code_of(lambda: gc.get_model_config("shrink", "3"))[0] == "StatusCode.NOT_FOUND"


def test_repository(gc, http):
    index = gc.get_model_repository_index().models
    assert [(m.name, m.version, m.state) for m in index] == [(m["name"], m["version"], m["state"]) for m in http.post("/v2/repository/index").json()]
    assert {m.name for m in index} == set(MODELS)
    gc.load_model("shrink")
    status, message = code_of(lambda: gc.unload_model("shrink"))
    assert status == "StatusCode.INVALID_ARGUMENT" and "cannot be unloaded" in message


# -- inference ------------------------------------------------------------------------------------------

CASES = [
    ("shrink", {"Bias": 0.25, "Threshold": 0.75}, np.float32),
    ("celu", {"Alpha": 0.3}, np.float32),
    ("scaled_tanh", {"Alpha": 1.7159, "Beta": 0.6667}, np.float32),
    ("parameterized_relu", {}, np.float32),
    ("relu_grad", {}, np.float32),
    ("sigmoid", {}, np.float16),
    ("shrink", {"Threshold": 2.0}, np.int32),
    ("parameterized_relu", {}, np.int8),
    ("softmax1", {"Axes": "1"}, np.float32),
]


@pytest.mark.parametrize("model,params,dtype", CASES, ids=[f"{m}-{np.dtype(d).name}" for m, _, d in CASES])
def test_infer_matches_the_reference(gc, model, params, dtype):
    arrays = inputs_for(model, (3, 5), dtype)
    result = gc.infer(model, grpc_inputs(arrays), parameters=params, request_id="r-1")
    axes = {"Axes": [int(a) for a in params["Axes"].split(",")]} if "Axes" in params else {}
    expected = reference(model, arrays, **{**params, **axes})
    kind = MODELS[model].type_name().removeprefix("DML_OPERATOR_ACTIVATION_")
    got = result.as_numpy(output_of(model))
    if np.dtype(dtype) == np.float16:
        np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
    else:
        assert_matches(got, expected, F32_ULP.get(kind, 4))
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (model, "1", "r-1")
    assert list(response.outputs[0].shape) == [3, 5] and response.outputs[0].datatype == triton_dtype(dtype)


def test_typed_contents(stub):
    """Tensors in InferTensorContents (what KServe's and MLServer's clients may send) give the same result."""
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="shrink", id="typed")
    request.parameters["Threshold"].double_param = 1.0
    tensor = request.inputs.add(name="InputTensor", datatype="FP32", shape=[3, 4])
    tensor.contents.fp32_contents.extend(x.tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed" and len(response.raw_output_contents) == 1
    got = np.frombuffer(response.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(got, reference("shrink", {"InputTensor": x.reshape(3, 4)}, Threshold=1.0).reshape(-1))
    ints = service_pb2.ModelInferRequest(model_name="shrink")
    ints.parameters["Threshold"].int64_param = 1
    ints.inputs.add(name="InputTensor", datatype="INT16", shape=[4]).contents.int_contents.extend([-3, -1, 1, 3])
    expected = reference("shrink", {"InputTensor": np.array([-3, -1, 1, 3], np.int16)}, Threshold=1)
    assert np.frombuffer(stub.ModelInfer(ints).raw_output_contents[0], np.int16).tolist() == expected.tolist()


def test_numeric_string_parameters_for_clients_without_double(stub):
    """KServe's gRPC InferParameter has bool, int64 and string, no double: a fractional parameter goes
    as its decimal text and is read as the number (README says so)."""
    x = np.linspace(-3, 3, 12, dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="shrink")
    request.parameters["Bias"].string_param = "0.5"
    request.parameters["Threshold"].string_param = "1.25"
    request.inputs.add(name="InputTensor", datatype="FP32", shape=[12]).contents.fp32_contents.extend(x.tolist())
    got = np.frombuffer(stub.ModelInfer(request).raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(got, reference("shrink", {"InputTensor": x}, Bias=0.5, Threshold=1.25))
    request.parameters["Bias"].string_param = "half"
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameters.Bias" in info.value.details()
    # a number past float32's range, on an integer tensor (where it once reached the kernel's set-up: INTERNAL)
    integers = service_pb2.ModelInferRequest(model_name="shrink")
    integers.parameters["Threshold"].string_param = "1e39"
    integers.inputs.add(name="InputTensor", datatype="INT32", shape=[4]).contents.int_contents.extend([1, 2, 3, 4])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(integers)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameters.Threshold" in info.value.details()
    assert "float32" in info.value.details()


def test_large_tensor(gc):
    """16 MiB each way: over gRPC's 4 MiB default receive limit, within the service's body limit."""
    x = np.random.default_rng(3).standard_normal(4 << 20).astype(np.float32)
    got = gc.infer("relu", grpc_inputs({"InputTensor": x})).as_numpy("OutputTensor")
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_asyncio_client(server):
    x = np.linspace(-2, 2, 64, dtype=np.float32)

    async def scenario() -> list[np.ndarray]:
        async with tg_aio.InferenceServerClient(server.grpc) as client:
            assert await client.is_server_ready()
            results = await asyncio.gather(*(client.infer("tanh", grpc_inputs({"InputTensor": x * k})) for k in range(1, 9)))
            return [r.as_numpy("OutputTensor") for r in results]

    for k, got in enumerate(asyncio.run(scenario()), start=1):
        np.testing.assert_allclose(got, np.tanh(x * k), rtol=1e-6, atol=1e-6)


# -- system shared memory -------------------------------------------------------------------------------


def test_shared_memory(gc):
    x = np.linspace(-3, 3, 48, dtype=np.float32)
    region = Region(2 * x.nbytes)
    try:
        shm.set_shared_memory_region(region.handle, [x])
        gc.register_system_shared_memory(region.name, region.key, region.size)
        status = gc.get_system_shared_memory_status(region.name).regions[region.name]
        assert (status.key, status.offset, status.byte_size) == (region.key, 0, region.size)
        inp = tg.InferInput("InputTensor", [48], "FP32")
        inp.set_shared_memory(region.name, x.nbytes)
        out = tg.InferRequestedOutput("OutputTensor")
        out.set_shared_memory(region.name, x.nbytes, offset=x.nbytes)
        result = gc.infer("celu", [inp], outputs=[out], parameters={"Alpha": 0.5})
        assert list(result.get_response().raw_output_contents) == [b""]  # the output went to the region
        expected = reference("celu", {"InputTensor": x}, Alpha=0.5)
        np.testing.assert_allclose(shm.get_contents_as_numpy(region.handle, np.float32, [48], offset=x.nbytes), expected, rtol=1e-6, atol=1e-6)
        # a mixed request: the input from the region, the output in the response
        result = gc.infer("celu", [inp], parameters={"Alpha": 0.5})
        np.testing.assert_allclose(result.as_numpy("OutputTensor"), expected, rtol=1e-6, atol=1e-6)
        status, message = code_of(lambda: gc.register_system_shared_memory(region.name, region.key, region.size))
        assert status == "StatusCode.INVALID_ARGUMENT" and "already registered" in message
        gc.unregister_system_shared_memory(region.name)
        assert region.name not in gc.get_system_shared_memory_status().regions
        assert code_of(lambda: gc.get_system_shared_memory_status(region.name))[0] == "StatusCode.NOT_FOUND"
        status, message = code_of(lambda: gc.infer("celu", [inp]))
        assert status == "StatusCode.NOT_FOUND" and "not a registered" in message
        status, _ = code_of(lambda: gc.register_system_shared_memory("bad", "/vkact_no_such_object", 64))
        assert status == "StatusCode.INVALID_ARGUMENT"
    finally:
        shm.destroy_shared_memory_region(region.handle)


def test_no_cuda_shared_memory(gc):
    assert len(gc.get_cuda_shared_memory_status().regions) == 0
    status, message = code_of(lambda: gc.register_cuda_shared_memory("gpu", b"AAAA", 0, 64))
    assert status == "StatusCode.INVALID_ARGUMENT" and "no CUDA memory" in message
    gc.unregister_cuda_shared_memory()  # nothing to unregister: OK, as perf_analyzer expects


# -- errors -----------------------------------------------------------------------------------------------


def test_errors_map_to_tritons_codes(gc, stub, http):
    x = np.ones(8, np.float32)
    bad = [
        (lambda: gc.infer("nope", grpc_inputs({"InputTensor": x})), "NOT_FOUND", "unknown model"),
        (lambda: gc.infer("shrink", grpc_inputs({"InputTensor": x}), model_version="2"), "NOT_FOUND", "no version"),
        (lambda: gc.infer("relu", grpc_inputs({"InputTensor": x}), parameters={"Alpha": 1.0}), "INVALID_ARGUMENT", "no parameter 'Alpha'"),
        (lambda: gc.infer("shrink", grpc_inputs({"Other": x})), "INVALID_ARGUMENT", "unexpected input"),
        (lambda: gc.infer("shrink", grpc_inputs({"InputTensor": x.astype(bool)})), "INVALID_ARGUMENT", "BOOL"),
        (lambda: gc.infer("parameterized_relu", grpc_inputs({"InputTensor": x})), "INVALID_ARGUMENT", "'SlopeTensor' is missing"),
        (lambda: gc.infer("celu", grpc_inputs({"InputTensor": x}), parameters={"Alpha": "many"}), "INVALID_ARGUMENT", "Alpha"),
        (lambda: gc.infer("shrink", grpc_inputs({"InputTensor": np.ones((1,) * 9, np.float32)})), "INVALID_ARGUMENT", ""),
    ]
    for call, code, piece in bad:
        status, message = code_of(call)
        assert status == f"StatusCode.{code}" and piece in message, (status, message)

    def raw(request: service_pb2.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request)
        return info.value.code(), info.value.details()

    short = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[x.tobytes()[:12]])
    short.inputs.add(name="InputTensor", datatype="FP32", shape=[8])
    assert raw(short)[0] == grpc.StatusCode.INVALID_ARGUMENT
    both = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[x.tobytes()])
    both.inputs.add(name="InputTensor", datatype="FP32", shape=[8]).contents.fp32_contents.extend(x.tolist())
    assert raw(both) == (grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].contents: contents must be empty when raw_input_contents is used")
    extra = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[x.tobytes(), x.tobytes()])
    extra.inputs.add(name="InputTensor", datatype="FP32", shape=[8])
    assert raw(extra)[0] == grpc.StatusCode.INVALID_ARGUMENT
    half = service_pb2.ModelInferRequest(model_name="relu")
    half.inputs.add(name="InputTensor", datatype="FP16", shape=[2]).contents.fp32_contents.extend([1.0, 2.0])
    assert raw(half) == (grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].contents: FP16 tensors travel in raw_input_contents only")
    negative = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[b""])
    negative.inputs.add(name="InputTensor", datatype="FP32", shape=[-1])
    assert raw(negative)[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert_still_serving(http)
    assert gc.infer("relu", grpc_inputs({"InputTensor": x})).as_numpy("OutputTensor").tolist() == [1.0] * 8
    assert 'vkact_errors_total{code="500"}' not in http.get("/metrics").text


@pytest.mark.driver_independent
def test_a_message_over_the_body_limit_is_resource_exhausted():
    from tests.service.conftest import start_server, stop_server

    server = start_server(max_body_bytes=1 << 20)
    try:
        client = tg.InferenceServerClient(server.grpc)
        status, message = code_of(lambda: client.infer("relu", grpc_inputs({"InputTensor": np.ones(1 << 19, np.float32)})))
        assert status == "StatusCode.RESOURCE_EXHAUSTED", message
        assert client.infer("relu", grpc_inputs({"InputTensor": -np.ones(16, np.float32)})).as_numpy("OutputTensor").tolist() == [0.0] * 16
        client.close()
    finally:
        stop_server(server)


@pytest.mark.driver_independent
def test_grpc_port_zero_serves_no_grpc():
    from tests.service.conftest import free_port, start_server, stop_server

    port = free_port()
    server = start_server(grpc_port=0)
    try:
        assert server.grpc == ""
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as info:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stop_server(server)


@pytest.mark.driver_independent
def test_a_taken_grpc_port_stops_the_server_with_a_clear_message(server):
    from tests.service.conftest import start_server

    with pytest.raises(RuntimeError) as info:
        start_server(grpc_port=int(server.grpc.rsplit(":", 1)[1]))
    assert "gRPC cannot listen on 127.0.0.1" in str(info.value)


def test_every_http_process_serves_grpc_on_one_port(two_processes):
    """VKACT_WORKERS=2: both processes bind the gRPC port (SO_REUSEPORT); connections reach either (and
    neither says it cannot listen: the two_processes fixture reads their output when it stops them)."""
    server = two_processes
    ready_in_a_row = 0  # start_server saw one process ready; the other may still open its device
    for _ in range(300):
        with tg.InferenceServerClient(server.grpc) as client:
            ready_in_a_row = ready_in_a_row + 1 if client.is_server_ready() else 0
        if ready_in_a_row == 16:
            break
        time.sleep(0.1 if ready_in_a_row == 0 else 0)
    assert ready_in_a_row == 16
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    for _ in range(8):  # a new channel (connection) each time
        with tg.InferenceServerClient(server.grpc) as client:
            np.testing.assert_allclose(client.infer("tanh", grpc_inputs({"InputTensor": x})).as_numpy("OutputTensor"), np.tanh(x), rtol=1e-6, atol=1e-6)


def test_a_repeated_request_takes_new_bytes_and_is_still_checked(gc, stub):
    """Repeated requests (their decisions kept by the server) answer each one's own tensors; one whose
    raw entry no longer matches the shape is refused as the first time."""
    rng = np.random.default_rng(11)
    for _ in range(3):
        a, b = rng.standard_normal((2, 6, 7)).astype(np.float32)
        got = gc.infer("parameterized_relu", grpc_inputs({"InputTensor": a, "SlopeTensor": b}), parameters={}).as_numpy("OutputTensor")
        np.testing.assert_array_equal(got, reference("parameterized_relu", {"InputTensor": a, "SlopeTensor": b}))
    request = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[np.ones(8, np.float32).tobytes()])
    request.inputs.add(name="InputTensor", datatype="FP32", shape=[8])
    assert np.frombuffer(stub.ModelInfer(request).raw_output_contents[0], np.float32).tolist() == [1.0] * 8
    del request.raw_input_contents[:]
    request.raw_input_contents.append(np.ones(7, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "28 bytes given" in info.value.details()


@pytest.mark.driver_independent
def test_grpc_needs_a_port_of_its_own():
    from pydantic import ValidationError

    from service.config import Settings

    with pytest.raises(ValidationError, match="a port of its own"):
        Settings(port=9000, grpc_port=9000)
    with pytest.raises(ValidationError):
        Settings(grpc_port=-1)
    assert Settings(port=9000, grpc_port=0).grpc_port == 0


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 16383, 16384, (1 << 24) + 5])
def test_the_hand_serialized_response_is_what_protobuf_reads(n):
    """ModelInfer's answer is serialized by vkact (one copy of the output); protobuf's own parser is
    the oracle, at every varint length boundary of the raw entry."""
    from service.api.grpc.infer import serialized

    head = service_pb2.ModelInferResponse(model_name="relu", model_version="1", id="x")
    head.outputs.add(name="OutputTensor", datatype="UINT8", shape=[n])
    head.outputs.add(name="Second", datatype="UINT8", shape=[0])
    data = np.arange(n, dtype=np.uint8)
    parsed = service_pb2.ModelInferResponse.FromString(serialized(head, [data.data, b""]))
    assert list(parsed.raw_output_contents) == [data.tobytes(), b""]
    assert (parsed.model_name, parsed.model_version, parsed.id, [o.name for o in parsed.outputs]) == ("relu", "1", "x", ["OutputTensor", "Second"])


def test_a_server_without_its_device_answers_unavailable():
    """No device (none matches VKACT_DEVICE): live, not ready, inference UNAVAILABLE, health NOT_SERVING,
    the models listed as UNAVAILABLE, as Triton answers while its models are not ready."""
    import subprocess
    import sys

    from tests.service.conftest import ROOT, free_port, server_env

    http_port, grpc_port = free_port(), free_port()
    env = server_env({"VKACT_DEVICE": "no-such-device", "VKACT_GRPC_PORT": str(grpc_port)})
    proc = subprocess.Popen([sys.executable, "-m", "service", "--port", str(http_port), "--log-level", "critical", "--no-supervise"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Until the gRPC port listens, by a plain connect: a gRPC channel refused early backs off (1 s, 1.6 s,
        # ... growing), and grpcio shares its subchannels by address across channels, so one to a port an
        # earlier test's server had used may still be backing off; CI's full run saw it refused 30 s long.
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited with {proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", grpc_port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the gRPC port never listened"
                time.sleep(0.1)
        client = tg.InferenceServerClient(f"127.0.0.1:{grpc_port}", channel_args=[("grpc.use_local_subchannel_pool", 1)])
        assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready("relu")
        status, message = code_of(lambda: client.infer("relu", grpc_inputs({"InputTensor": np.ones(4, np.float32)})))
        assert status == "StatusCode.UNAVAILABLE" and "not ready" in message
        assert {m.state for m in client.get_model_repository_index().models} == {"UNAVAILABLE"}
        assert len(client.get_model_repository_index(as_json=True).get("models", [])) == len(MODELS)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        client.close()
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.driver_independent
def test_typed_contents_are_bounded_like_json_values():
    """Typed contents become one Python value each, as a JSON text's numbers do: past VKACT_MAX_JSON_VALUES
    they are refused before that (RESOURCE_EXHAUSTED naming the field), and the server serves on."""
    from tests.service.conftest import start_server, stop_server

    server = start_server(max_json_values=2048)
    try:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="relu")
            request.inputs.add(name="InputTensor", datatype="FP32", shape=[3000]).contents.fp32_contents.extend([-1.0] * 3000)
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "inputs[0].contents" in info.value.details() and "VKACT_MAX_JSON_VALUES" in info.value.details()
            small = service_pb2.ModelInferRequest(model_name="relu")
            small.inputs.add(name="InputTensor", datatype="FP32", shape=[4]).contents.fp32_contents.extend([-1.0, 2.0, -3.0, 4.0])
            assert np.frombuffer(stub.ModelInfer(small, timeout=30).raw_output_contents[0], np.float32).tolist() == [0.0, 2.0, 0.0, 4.0]
    finally:
        stop_server(server)


@pytest.mark.driver_independent
def test_calls_beyond_the_bound_are_refused_and_the_others_answered():
    """At most VKACT_MAX_CONNECTIONS calls at once per process: with the device held (SIGSTOP), of three
    calls two wait on it and the third is refused with RESOURCE_EXHAUSTED; once the device goes on, both
    waiting calls get their right answers."""
    import os
    import signal

    from tests.service.conftest import start_server, stop_server
    from tests.service.test_load import worker_pid

    server = start_server(max_connections=2)
    pid = worker_pid(server)
    try:
        async def scenario() -> None:
            async with grpc.aio.insecure_channel(server.grpc) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

                def request(x: np.ndarray) -> service_pb2.ModelInferRequest:
                    msg = service_pb2.ModelInferRequest(model_name="relu", raw_input_contents=[x.tobytes()])
                    msg.inputs.add(name="InputTensor", datatype="FP32", shape=list(x.shape))
                    return msg

                xs = [np.linspace(-1, 1, 64, dtype=np.float32) * k for k in (1, 2, 3)]
                os.kill(pid, signal.SIGSTOP)
                try:
                    calls = [asyncio.ensure_future(stub.ModelInfer(request(x), timeout=60)) for x in xs]
                    # the device is stopped: the first call to end is the refused one
                    done, _ = await asyncio.wait(calls, timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    assert len(done) == 1
                    (refused,) = done
                    assert isinstance(refused.exception(), grpc.aio.AioRpcError)
                    assert refused.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                finally:
                    os.kill(pid, signal.SIGCONT)
                for x, call in zip(xs, calls):
                    if call is not refused:
                        got = np.frombuffer((await call).raw_output_contents[0], np.float32)
                        np.testing.assert_array_equal(got, np.maximum(x, 0))

        asyncio.run(scenario())
    finally:
        stop_server(server)


def test_trace_and_log_settings_answer_as_triton_without_them(gc, http):
    """Triton built without tracing or dynamic logging: UNAVAILABLE over gRPC, 503 over HTTP, with a
    message that says so (no Retry-After: asking again will not help); neither extension is listed."""
    for call, text in ((gc.get_trace_settings, "does not support trace"), (lambda: gc.get_trace_settings("relu"), "does not support trace"),
                       (lambda: gc.update_trace_settings(settings={"trace_rate": "2"}), "does not support trace"),
                       (gc.get_log_settings, "does not support dynamic logging"),
                       (lambda: gc.update_log_settings({"log_verbose_level": 1}), "does not support dynamic logging")):
        status, message = code_of(call)
        assert status == "StatusCode.UNAVAILABLE" and text in message
    for method, path, text in (("GET", "/v2/trace/setting", "tracing"), ("POST", "/v2/trace/setting", "tracing"),
                               ("GET", "/v2/models/relu/trace/setting", "tracing"), ("POST", "/v2/logging", "dynamic logging"),
                               ("GET", "/v2/logging", "dynamic logging")):
        answer = http.request(method, path, json={} if method == "POST" else None)
        assert answer.status_code == 503 and answer.json() == {"error": f"the server does not support {text}"}, answer.text
        assert "retry-after" not in answer.headers
    assert not {"trace", "logging"} & set(http.get("/v2").json()["extensions"])


def test_the_descriptor_set_lets_a_client_call_without_proto_files(server, http):
    """GET /grpc/vkact.protoset, as grpcurl -protoset reads it: every service and method vkact serves,
    and messages built from it alone (no generated module) make working calls."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    answer = http.get("/grpc/vkact.protoset")
    assert answer.status_code == 200
    files = descriptor_pb2.FileDescriptorSet.FromString(answer.content)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:  # in dependency order, as grpcurl loads them
        pool.Add(f)
    service = pool.FindServiceByName("inference.GRPCInferenceService")
    assert {"ModelInfer", "ModelReady", "ModelConfig", "ModelStatistics", "RepositoryModelLoad"} <= {m.name for m in service.methods}
    assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"]

    def call(method: str, **fields):
        m = service.methods_by_name[method]
        request, reply = message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type)
        with grpc.insecure_channel(server.grpc) as channel:
            return channel.unary_unary(f"/{service.full_name}/{method}", request_serializer=lambda r: r.SerializeToString(),
                                       response_deserializer=reply.FromString)(request(**fields))

    assert call("ServerMetadata").name == "vkact"
    assert call("ModelReady", name="relu").ready and not call("ModelReady", name="nope").ready
    assert call("ModelConfig", name="softmax").config.name == "softmax"  # model_config.proto's messages too


@pytest.mark.parametrize("version", ["v1alpha", "v1"])
def test_server_reflection(server, version):
    """grpcio-reflection's client, as grpcurl lists and describes: the services, and descriptors enough
    to build and send a call without any .proto file or generated module."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(server.grpc) as channel:
        if version == "v1":  # the same messages on the wire at v1's path (grpcurl asks there first)
            info = channel.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                         request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                         response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
            (answer,) = list(info(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30))
            assert "inference.GRPCInferenceService" in {s.name for s in answer.list_services_response.service}
            return
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= set(database.get_services())
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName("inference.GRPCInferenceService")
        method = service.methods_by_name["ModelReady"]
        request, reply = message_factory.GetMessageClass(method.input_type), message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(f"/{service.full_name}/{method.name}", request_serializer=lambda r: r.SerializeToString(),
                                   response_deserializer=reply.FromString)
        assert call(request(name="relu"), timeout=30).ready
        with pytest.raises(KeyError):
            pool.FindServiceByName("no.such.Service")
