"""ONNX Shrink's node tests (test_shrink_hard, test_shrink_soft) in all eleven types of its type
constraint, through /v1 (binary frames, JSON), /v2 (binary, JSON) and gRPC (raw and typed contents),
on whatever device the service runs (make test-portability: lavapipe, native 64-bit kernels, and
SwiftShader, emulated ones). Oracles: an exact one (Python integers and fractions), and ONNX's
reference evaluator on the same typed model where it is exact (it computes integers through float64:
beyond 2^53 it rounds, and vkact does not)."""
from __future__ import annotations

import base64
from collections.abc import Iterator
from fractions import Fraction

import grpc
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conformance.peers import model_for, run_reference
from tests.conformance.test_onnx import node_cases
from tests.service.helpers import binary_request, decode_response, request_body
from tests.service.test_v2 import address, infer

SHRINK_TYPES = [np.float64, np.float32, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
CASES = ["test_shrink_hard", "test_shrink_soft"]
FRONT_ENDS = ["v1-binary", "v1-json", "v2-binary", "v2-json", "grpc-raw", "grpc-typed"]
V2_NAME = {np.dtype(t): n for t, n in zip(SHRINK_TYPES, ["FP64", "FP32", "FP16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64"])}
TYPED_FIELD = {"FP64": "fp64_contents", "FP32": "fp32_contents", "INT64": "int64_contents", "UINT64": "uint64_contents",
               "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
               "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents"}


def case(name: str, dtype) -> tuple[np.ndarray, dict[str, float]]:
    """The node test's input in ``dtype`` (an integer type takes the values modulo 2^bits, as a cast
    does: -2 is 254 in UINT8, 2^64 - 2 in UINT64) and its attributes as DirectML fields."""
    c = node_cases()[name]
    (x,), _ = c.data_sets[0]
    attrs = {a.name: a.f for a in c.model.graph.node[0].attribute}
    x = np.asarray(x, np.float64)
    typed = x.astype(np.int64).astype(dtype) if np.dtype(dtype).kind in "iu" else x.astype(dtype)
    return typed, {"Bias": attrs.get("bias", 0.0), "Threshold": attrs.get("lambd", 0.5)}


def exact(x: np.ndarray, Bias: float, Threshold: float) -> np.ndarray:
    t, b = Fraction(Threshold), Fraction(Bias)
    if x.dtype.kind == "f":
        with np.errstate(all="ignore"):  # one correctly rounded x -/+ Bias: numpy in the type is exact
            return np.where(x < -x.dtype.type(Threshold), x + x.dtype.type(Bias), np.where(x > x.dtype.type(Threshold), x - x.dtype.type(Bias), 0)).astype(x.dtype)
    bits = 8 * x.dtype.itemsize
    out = []
    for v in (int(v) for v in x):
        r = int(v + b if v < -t else v - b if v > t else Fraction(0)) % 2**bits
        out.append(r - 2**bits if x.dtype.kind == "i" and r >= 2 ** (bits - 1) else r)
    return np.array(out, x.dtype)


@pytest.fixture(scope="module")
def tc(server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(address(server))
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(server) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def through(front_end: str, x: np.ndarray, params: dict[str, float], http, tc, stub) -> np.ndarray:
    v2 = V2_NAME[x.dtype]
    if front_end == "v1-binary":
        padded = np.zeros(-(-x.nbytes // 4) * 4, np.uint8)   # TotalTensorSizeInBytes: a multiple of 4
        padded[: x.nbytes] = x.view(np.uint8)
        content, headers = binary_request(request_body("SHRINK", x, **params), padded)
        return decode_response(http.post("/v1/execute", content=content, headers=headers), x.dtype)
    if front_end == "v1-json":
        body = {"Operator": request_body("SHRINK", x, **params), "Inputs": {"InputTensor": x.tolist()}}
        return decode_response(http.post("/v1/execute", json=body), x.dtype)
    if front_end.startswith("v2"):
        result = infer(tc, "shrink", {"InputTensor": x}, front_end == "v2-binary", front_end == "v2-binary", parameters=params)
        return result.as_numpy("OutputTensor")
    request = service_pb2.ModelInferRequest(model_name="shrink")
    for name, value in params.items():
        request.parameters[name].double_param = value
    tensor = request.inputs.add(name="InputTensor", datatype=v2, shape=list(x.shape))
    if front_end == "grpc-raw" or v2 == "FP16":   # the protocol has no typed contents for FP16
        request.raw_input_contents.append(x.tobytes())
    else:
        getattr(tensor.contents, TYPED_FIELD[v2]).extend(x.tolist())
    return np.frombuffer(stub.ModelInfer(request).raw_output_contents[0], x.dtype)


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("dtype", SHRINK_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("name", CASES)
def test_onnx_shrink_node_tests_in_every_type(http, tc, stub, name, dtype, front_end):
    """Every front end exact, JSON and gRPC's typed contents included (client/json_values.py: 2^64 - 2
    in UINT64 is not rounded through float64)."""
    x, params = case(name, dtype)
    want = exact(x, **params)
    if np.abs(x.astype(np.float64)).max() < 2**53:   # ONNX's reference evaluator is exact here
        from tests.conformance.test_onnx import descriptor

        op = descriptor("DML_OPERATOR_ACTIVATION_SHRINK", x.dtype, x.shape, params)
        np.testing.assert_array_equal(run_reference(model_for(op, x.dtype, [x.shape]), x), want)
    got = through(front_end, x, params, http, tc, stub)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.reshape(-1), want)


def test_the_eleven_types_are_served_or_refused_with_the_feature(http, tc):
    """What the catalog and /v2 metadata say of Shrink's types matches what the device reports."""
    device = http.get("/v1/device").json()
    used = set(device["features"]["used_by_kernels"])
    meta = tc.get_model_metadata("shrink")
    served = set(meta["parameters"]["datatypes"].split(","))
    assert served == set(V2_NAME.values())   # every type: native or emulated, on any device
    assert "datatypes_refused" not in meta["parameters"]
    for t, entry in device["data_types_64bit"].items():
        assert entry["native"] == (entry["needs_feature"] in used)
        assert entry["native"] or "DML_OPERATOR_ACTIVATION_SHRINK" in entry["emulated_for"], t


def test_without_the_features_shrink_is_emulated_and_float64_hardmax_refused(emulated_64bit_server):
    with emulated_64bit_server.client() as http:
        device = http.get("/v1/device").json()
        assert device["features"]["used_by_kernels"] == []
        assert not device["data_types_64bit"]["DML_TENSOR_DATA_TYPE_FLOAT64"]["native"]
        x = np.array([-2.0, 2.0**-1074, 3.0 + 2.0**-51, np.inf], np.float64)   # through the emulated add
        body = {"Operator": request_body("SHRINK", x, Bias=0.5, Threshold=0.5), "Inputs": {"InputTensor": {"base64": base64.b64encode(x.tobytes()).decode()}}}
        np.testing.assert_array_equal(decode_response(http.post("/v1/execute", json=body), x.dtype), [-1.5, 0.0, 2.5 + 2.0**-51, np.inf])
        refused = http.post("/v1/execute", json={"Operator": {**request_body("HARDMAX", x.reshape(1, 4))}, "Inputs": {"InputTensor": x.tolist()[:3] + [0.0]}})
        assert refused.status_code == 422 and refused.json()["field"].endswith("InputTensor.DataType"), refused.text
        assert "shaderFloat64" in refused.json()["error"]
        hardmax = next(op for op in http.get("/v1/operators").json()["operators"] if op["name"] == "hardmax")
        assert hardmax["data_types_without_kernel"][0]["missing_feature"] == "shaderFloat64"
        meta = http.get("/v2/models/hardmax").json()["parameters"]
        assert "FP64" not in meta["datatypes"].split(",") and meta["datatypes_refused"] == "FP64 (shaderFloat64)"
        assert "BF16" in meta["datatypes"].split(",")   # no device feature needed
        assert "FP64" in http.get("/v2/models/shrink").json()["parameters"]["datatypes"].split(",")
