"""64-bit elements as JSON numbers, end to end, now that their kernels exist: /v1 JSON lists, /v2 JSON
data, gRPC's typed contents (int64_contents, uint64_contents, fp64_contents) and the Python client's JSON
encoding carry INT64 2^63 - 1 and -2^63, UINT64 2^64 - 1, 2^53 + 1 and 2^53 + 2 (neither a float64), and
FLOAT64's extremes (the smallest subnormal, the largest finite, infinities, NaN) through SHRINK and RELU
and back, exactly; values the type cannot hold are 400s. Both kernel paths: the device's own (native
where it reports shaderInt64/shaderFloat64) and VKACT_NATIVE_64BIT=0 (emulated in 32-bit words).
Oracles independent of the service: Python integers and fractions for the integers (float64 rounds
beyond 2^53), IEEE float64 arithmetic in numpy for FLOAT64 (x -/+ Bias rounded once)."""
from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.service.conftest import Server
from tests.service.test_v2_errors import assert_error

DML = {"INT64": "DML_TENSOR_DATA_TYPE_INT64", "UINT64": "DML_TENSOR_DATA_TYPE_UINT64", "FP64": "DML_TENSOR_DATA_TYPE_FLOAT64"}
DTYPE = {"INT64": np.int64, "UINT64": np.uint64, "FP64": np.float64}
CONTENTS = {"INT64": "int64_contents", "UINT64": "uint64_contents", "FP64": "fp64_contents"}
FRONT_ENDS = ["v1-json", "v2-json", "grpc-typed"]

BIG = 1.7976931348623157e308   # float64's largest finite value
TINY = 5e-324                  # its smallest subnormal, 2^-1074
NAN, INF = math.nan, math.inf


@pytest.fixture(scope="module", params=["device", "emulated"])
def service(request, server) -> Server:
    """The session's server (native 64-bit kernels where the device has the features), or one whose
    kernels use no 64-bit feature (VKACT_NATIVE_64BIT=0)."""
    return server if request.param == "device" else request.getfixturevalue("emulated_64bit_server")


@pytest.fixture(scope="module")
def http(service) -> Iterator:
    with service.client() as client:
        yield client


@pytest.fixture(scope="module")
def stub(service) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(service.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def as_json(values: list) -> list:
    """Non-finite floats as the strings JSON tensor data spells them."""
    return [("NaN" if v != v else "Infinity" if v > 0 else "-Infinity") if isinstance(v, float) and not math.isfinite(v) else v for v in values]


def from_json(values: list) -> list:
    return [float(v.replace("Infinity", "inf")) if isinstance(v, str) else v for v in values]


def call(front_end: str, http, stub, model: str, datatype: str, values: list, **params):
    """The output elements as Python numbers, or the failed response (httpx or grpc.RpcError)."""
    n = len(values)
    if front_end == "v1-json":
        operator = {"Type": f"DML_OPERATOR_ACTIVATION_{model.upper()}", "InputTensor": {"DataType": DML[datatype], "Sizes": [n]}, **params}
        response = http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": as_json(values)}})
        return from_json(response.json()["Output"]) if response.status_code == 200 else response
    if front_end == "v2-json":
        body = {"inputs": [{"name": "InputTensor", "shape": [n], "datatype": datatype, "data": as_json(values)}], "parameters": params}
        response = http.post(f"/v2/models/{model}/infer", json=body)
        return from_json(response.json()["outputs"][0]["data"]) if response.status_code == 200 else response
    request = service_pb2.ModelInferRequest(model_name=model)
    for key, value in params.items():
        request.parameters[key].double_param = value
    getattr(request.inputs.add(name="InputTensor", datatype=datatype, shape=[n]).contents, CONTENTS[datatype]).extend(values)
    try:
        raw = stub.ModelInfer(request).raw_output_contents[0]
    except grpc.RpcError as error:
        return error
    return np.frombuffer(raw, DTYPE[datatype]).tolist()


def shrink_exact(values: list[int], bits: int, signed: bool, Bias: float, Threshold: float) -> list[int]:
    """Integer SHRINK in rationals: x -/+ Bias truncated toward zero, wrapped to the type."""
    t, b = Fraction(Threshold), Fraction(Bias)
    out = []
    for v in values:
        r = int(v + b if v < -t else v - b if v > t else Fraction(0)) % 2**bits
        out.append(r - 2**bits if signed and r >= 2 ** (bits - 1) else r)
    return out


def shrink_float64(values: list[float], Bias: float, Threshold: float) -> np.ndarray:
    x = np.array(values, np.float64)
    b, t = np.float64(np.float32(Bias)), np.float64(np.float32(Threshold))
    with np.errstate(invalid="ignore"):
        return np.where(x < -t, x + b, np.where(x > t, x - b, 0.0))


def same_bits(got: list, want: np.ndarray) -> None:
    """Bit for bit, -0.0 against +0.0 included; any NaN matches any NaN (no operator defines its sign)."""
    got_a = np.array(got, np.float64)
    both_nan = np.isnan(got_a) & np.isnan(want)
    assert (both_nan | (got_a.view(np.uint64) == want.view(np.uint64))).all(), (got, want.tolist())


INT64 = [2**63 - 1, -(2**63), 2**53 + 1, 2**53 + 2, -(2**53) - 2, -1, 0]
UINT64 = [2**64 - 1, 2**53 + 1, 2**53 + 2, 2**63, 1, 0]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("datatype, values", [("INT64", INT64), ("UINT64", UINT64)], ids=["INT64", "UINT64"])
def test_64_bit_integers_through_shrink_exactly(http, stub, front_end, datatype, values):
    params = {"Bias": 1.0, "Threshold": 0.5}
    want = shrink_exact(values, 64, datatype == "INT64", **params)
    assert 2**53 + 1 in want   # an answer float64 cannot hold
    got = call(front_end, http, stub, "shrink", datatype, values, **params)
    assert isinstance(got, list), getattr(got, "text", got)
    assert got == want


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_int64_through_relu_exactly(http, stub, front_end):
    got = call(front_end, http, stub, "relu", "INT64", INT64)
    assert isinstance(got, list), getattr(got, "text", got)
    assert got == [max(v, 0) for v in INT64]


def test_64_bit_integers_are_written_as_json_integers(http):
    values = [2**63 - 1, -(2**63)]
    body = {"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "INT64", "data": values}]}
    response = http.post("/v2/models/relu/infer", json=body)
    assert response.status_code == 200 and '"data":[9223372036854775807,0]' in response.text.replace(" ", ""), response.text
    operator = {"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "InputTensor": {"DataType": DML["UINT64"], "Sizes": [1]}, "Threshold": 0.0}
    response = http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": [2**64 - 1]}})
    assert response.status_code == 200 and "18446744073709551615" in response.text and "e+19" not in response.text, response.text


FLOAT64 = [TINY, -TINY, 2.2250738585072014e-308, -BIG, BIG, 1e16 + 2, 1.5, 0.1, -0.0, INF, -INF, NAN]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize("params", [{"Bias": 0.0, "Threshold": 0.0}, {"Bias": 1.0, "Threshold": 0.5}], ids=["identity", "bias-1"])
def test_float64_extremes_through_shrink_exactly(http, stub, front_end, params):
    """Bias 0: every non-zero value comes back as itself (the shortest decimal reads back to the same
    double, subnormals and the largest finite included); Bias 1: x - 1 rounded once (1e16 + 2 - 1 is a
    tie, to even: 1e16), BIG - 1 is BIG."""
    got = call(front_end, http, stub, "shrink", "FP64", FLOAT64, **params)
    assert isinstance(got, list), getattr(got, "text", got)
    same_bits(got, shrink_float64(FLOAT64, **params))


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_float64_extremes_through_relu(http, stub, front_end):
    """RELU FLOAT64 has only the native kernel: served where the kernels use shaderFloat64, else refused
    with the feature named."""
    native = "shaderFloat64" in http.get("/v1/device").json()["features"]["used_by_kernels"]
    got = call(front_end, http, stub, "relu", "FP64", FLOAT64)
    if not native:
        text = got.details() if isinstance(got, grpc.RpcError) else got.text
        assert "shaderFloat64" in text, text
        return
    assert isinstance(got, list), getattr(got, "text", got)
    x = np.array(FLOAT64)
    want = np.where(np.isnan(x), x, np.maximum(x, 0.0))
    np.testing.assert_array_equal(np.array(got), want)   # by value: RELU(-0.0) and RELU(-TINY) may be either zero
    assert got[0] == TINY and got[4] == BIG


@pytest.mark.parametrize("datatype, value", [("INT64", 2**63), ("INT64", -(2**63) - 1), ("UINT64", -1), ("UINT64", 2**64),
                                             ("INT64", 9007199254740994.0), ("FP64", "1e400")])
def test_what_the_type_cannot_hold_is_a_400(http, datatype, value):
    """Out of range, an integer written as a float beyond 2^53 (it could stand for several), a number
    beyond float64's range: 400s naming the input and the type, as each protocol names it."""
    text = f"[0, {value}]"
    v2 = ('{"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "%s", "data": %s}]}' % (datatype, text)).encode()
    assert_error(http.post("/v2/models/shrink/infer", content=v2, headers={"content-type": "application/json"}), 400, "inputs[0].data", datatype)
    v1 = ('{"Operator": {"Type": "DML_OPERATOR_ACTIVATION_SHRINK", "InputTensor": {"DataType": "%s", "Sizes": [2]}}, '
          '"Inputs": {"InputTensor": %s}}' % (DML[datatype], text)).encode()
    response = http.post("/v1/execute", content=v1, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["field"] == "Inputs.InputTensor", response.text
    assert DML[datatype] in response.json()["error"]
    assert call("v2-json", http, None, "shrink", datatype, [1, 2], Bias=1.0) == [0, 1]   # still serving


@pytest.mark.parametrize("dtype, values", [(np.int64, INT64), (np.uint64, UINT64), (np.float64, FLOAT64)], ids=["int64", "uint64", "float64"])
def test_the_client_carries_64_bit_arrays_as_json_exactly(service, dtype, values):
    from client import Client

    x = np.array(values, dtype)
    with Client(service.url, encoding="json") as vk:
        y = vk.shrink(x, bias=1.0, threshold=0.5)
    assert y.dtype == x.dtype
    if x.dtype.kind == "f":
        same_bits(y.tolist(), shrink_float64(values, Bias=1.0, Threshold=0.5))
    else:
        assert y.tolist() == shrink_exact(values, 64, x.dtype.kind == "i", Bias=1.0, Threshold=0.5)
