"""JSON tensor data is exact on every front-end (/v1 JSON lists, /v2 JSON data, gRPC typed contents): a
value the type cannot hold is a 400 naming the input and the type as that protocol names it, never a
wrapped or clamped element; the integers at the ends of each type's range go through and come back
exactly. The oracle: Shrink's exact rational reference (service.operators.shrink)."""
from __future__ import annotations

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from service.operators import parse_operator
from tests.service.helpers import request_body
from tests.service.test_grpc import stub  # noqa: F401 (fixture)
from tests.service.test_v2_errors import assert_error, assert_still_serving

V2_NAMES = {"i1": "INT8", "<i2": "INT16", "<i4": "INT32", "u1": "UINT8", "<u2": "UINT16", "<u4": "UINT32", "<f4": "FP32", "<f2": "FP16"}
CONTENTS = {"i": "int_contents", "u": "uint_contents", "f": "fp32_contents"}


def v1(http, values: list, dtype: str, **params):
    x = np.zeros(len(values), dtype)
    body = {"Operator": request_body("SHRINK", x, **params), "Inputs": {"InputTensor": values}}
    return http.post("/v1/execute", json=body)


def v2(http, values: list, dtype: str, **params):
    body = {"inputs": [{"name": "InputTensor", "shape": [len(values)], "datatype": V2_NAMES[dtype], "data": values}], "parameters": params}
    return http.post("/v2/models/shrink/infer", json=body)


def typed(values: list, dtype: str, **params) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="shrink")
    for key, value in params.items():
        request.parameters[key].double_param = value
    tensor = request.inputs.add(name="InputTensor", datatype=V2_NAMES[dtype], shape=[len(values)])
    getattr(tensor.contents, CONTENTS[np.dtype(dtype).kind]).extend(values)
    return request


def shrink(values: list, dtype: str, **params) -> list:
    x = np.array(values, dtype)
    return parse_operator(request_body("SHRINK", x, **params)).reference(x).tolist()


def test_the_issues_example_is_a_400_on_every_front_end(http, stub):
    """SHRINK INT8 [300, 1.5, -129, 5]: /v1 answered [44, 1, 127, 5] with a 200 before."""
    response = v1(http, [300, 1.5, -129, 5], "i1")
    assert response.status_code == 400, response.text
    assert response.json()["field"] == "Inputs.InputTensor"
    assert "element 1 is 1.5, not a whole number: datatype DML_TENSOR_DATA_TYPE_INT8" in response.json()["error"]
    response = v1(http, [300, 1, -129, 5], "i1")
    assert response.status_code == 400 and "element 0 is 300, out of range for datatype DML_TENSOR_DATA_TYPE_INT8 (-128..127)" in response.json()["error"]
    assert_error(v2(http, [300, 1.5, -129, 5], "i1"), 400, "inputs[0].data", "1.5, not a whole number: datatype INT8")
    assert_error(v2(http, [300, 1, -129, 5], "i1"), 400, "inputs[0].data", "element 0 is 300, out of range for datatype INT8")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(typed([300, 1, -129, 5], "i1"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inputs[0].data" in info.value.details() and "out of range for datatype INT8" in info.value.details()
    assert_still_serving(http)


@pytest.mark.parametrize("dtype", ["i1", "<i2", "<i4", "u1", "<u2", "<u4"])
def test_the_ends_of_each_integer_range_go_through_exactly(http, stub, dtype):
    info = np.iinfo(dtype)
    values = [int(info.min), int(info.max), int(info.max) - 1, 0, 3]
    want = shrink(values, dtype, Threshold=1.0, Bias=1.0)
    got = v1(http, values, dtype, Threshold=1.0, Bias=1.0)
    assert got.status_code == 200 and got.json()["Output"][: len(values)] == want, got.text
    assert str(info.max - 1) in got.text  # written as a JSON integer, not a float
    got = v2(http, values, dtype, Threshold=1.0, Bias=1.0)
    assert got.status_code == 200 and got.json()["outputs"][0]["data"] == want, got.text
    raw = stub.ModelInfer(typed(values, dtype, Threshold=1.0, Bias=1.0)).raw_output_contents[0]
    assert np.frombuffer(raw, dtype).tolist() == want
    for outside in (int(info.min) - 1, int(info.max) + 1):
        assert v1(http, [0, outside], dtype).status_code == 400
        assert_error(v2(http, [0, outside], dtype), 400, f"element 1 is {outside}, out of range for datatype {V2_NAMES[dtype]}")
        carrier = np.iinfo(np.int32 if info.kind == "i" else np.uint32)  # int_contents, uint_contents
        if carrier.min <= outside <= carrier.max:
            with pytest.raises(grpc.RpcError, match=f"out of range for datatype {V2_NAMES[dtype]}"):
                stub.ModelInfer(typed([0, outside], dtype))


@pytest.mark.parametrize("dtype, too_big, largest", [("<f4", 1e39, 3.4028234663852886e38), ("<f2", 65520, 65504.0)])
def test_a_finite_number_that_would_become_an_infinity_is_a_400(http, dtype, too_big, largest):
    assert_error(v2(http, [1.0, too_big], dtype), 400, "inputs[0].data", f"overflows {V2_NAMES[dtype]}")
    response = v1(http, [1.0, too_big], dtype)
    assert response.status_code == 400 and "overflows DML_TENSOR_DATA_TYPE" in response.json()["error"]
    # (gRPC's fp32_contents are float32 on the wire already: protobuf made 1e39 an infinity before sending)
    # the largest finite value, and an infinity written as one, go through
    got = v2(http, [largest, "Infinity", -largest], dtype, Threshold=0.0)
    assert got.status_code == 200 and got.json()["outputs"][0]["data"] == [largest, "Infinity", -largest]
    assert_still_serving(http)


def test_booleans_and_out_of_float64_numbers_are_400s(http):
    response = http.post("/v1/execute", content=b'{"Operator": {"Type": "DML_OPERATOR_ACTIVATION_RELU", "InputTensor": '
                         b'{"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [2]}}, "Inputs": {"InputTensor": [1, 1e400]}}')
    assert response.status_code == 400 and "beyond float64's range" in response.json()["error"], response.text
    assert_error(v2(http, [1.0, True], "<f4"), 400, "booleans are not numbers of datatype FP32")


@pytest.mark.parametrize("datatype, field, dtype, values", [
    ("INT64", "int64_contents", "<i8", [2**63 - 1, -(2**63), 2**53 + 1]),
    ("UINT64", "uint64_contents", "<u8", [2**64 - 1, 2**53 + 1, 0]),
    ("FP64", "fp64_contents", "<f8", [5e-324, -1.7976931348623157e308, -0.0]),
])
def test_grpc_64_bit_typed_contents_decode_exactly(datatype, field, dtype, values):
    """The decoding step alone: gRPC's 64-bit typed contents become /v2's data and then the exact
    elements, through the same decoder (test_exact_wire_64bit.py takes them through the kernels)."""
    from service.api.grpc.infer import inference_request
    from service.api.v2.codec import json_tensor

    request = service_pb2.ModelInferRequest(model_name="shrink")
    getattr(request.inputs.add(name="InputTensor", datatype=datatype, shape=[3]).contents, field).extend(values)
    req, _ = inference_request(request, [], "", 1000)
    got = json_tensor(req.inputs[0].data, np.dtype(dtype), 3, "inputs[0].data", datatype)
    assert got.tobytes() == np.array(values, dtype).tobytes()
    if datatype == "INT64":
        with pytest.raises(Exception, match="out of range for datatype INT32"):
            json_tensor(req.inputs[0].data, np.dtype("<i4"), 3, "inputs[0].data", "INT32")
