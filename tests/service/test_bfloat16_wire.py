"""BF16 through every front-end: /v2 JSON and binary, Triton's own HTTP and gRPC clients (raw bytes of
ml_dtypes.bfloat16 arrays), /v1 as VKACT_TENSOR_DATA_TYPE_BFLOAT16 in every encoding. The oracle: the
operator's float64 reference rounded once to bfloat16 (checked against exact rounding in tests/client)."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton

from client.json_values import BFLOAT16, encode_values
from service.operators import parse_operator
from tests.helpers import ulp_distance
from tests.service.helpers import binary_request, request_body
from tests.service.test_v2 import address
from tests.service.test_v2_errors import assert_error, assert_still_serving

VALUES = [1.5, -2.0, "NaN", "Infinity", "-Infinity", -0.0, 3.3895313892515355e38, 9.18e-41, 1e-3,
          1.00390625,             # 1 + 2^-8: a tie between 1 and 1 + 2^-7, to even: 1
          1.0039062500000002,     # just above it: 1 + 2^-7
          -3.3961775292304293e38]  # rounds to -(largest finite), not to -inf (just under half-way)
ROUNDED = ["1.5", "-2.0", "NaN", "Infinity", "-Infinity", "-0.0", "3.3895313892515355e+38", "9.183549615799121e-41", "0.00099945068359375",
           "1.0", "1.0078125", "-3.3895313892515355e+38"]


def reference(kind: str, x: np.ndarray, **params) -> np.ndarray:
    op = parse_operator(request_body(kind, x, **params))
    return op.reference(x)


def as_text(values: list) -> list[str]:
    return [v if isinstance(v, str) else repr(float(v)) for v in values]


def test_json_numbers_round_to_nearest_even_bfloat16_and_come_back(http):
    body = {"inputs": [{"name": "InputTensor", "shape": [len(VALUES)], "datatype": "BF16", "data": VALUES}]}
    response = http.post("/v2/models/identity/infer", json=body)
    assert response.status_code == 200, response.text
    out = response.json()["outputs"][0]
    assert out["datatype"] == "BF16" and as_text(out["data"]) == ROUNDED


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "softmax1", "leaky_relu"])
def test_binary_and_json_agree_with_the_reference(http, kind):
    x = (np.random.default_rng(len(kind)).standard_normal((3, 50)) * 4).astype(BFLOAT16)
    want = reference(kind.upper().removesuffix("1") + ("1" if kind.endswith("1") else ""), x)
    body = {"inputs": [{"name": "InputTensor", "shape": [3, 50], "datatype": "BF16", "data": encode_values(x.reshape(-1))}],
            "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}
    response = http.post("/v2/models/" + kind + "/infer", json=body)
    n = int(response.headers["Inference-Header-Content-Length"])
    got = np.frombuffer(response.content[n:], BFLOAT16).reshape(3, 50)
    assert ulp_distance(got, want).max() <= 1  # within 1 bfloat16 ulp


def test_tritonclients_send_and_read_bf16(server):
    x = np.linspace(-4, 4, 24).reshape(4, 6).astype(BFLOAT16)
    want = reference("SIGMOID", x)
    with triton.InferenceServerClient(address(server)) as client:
        tensor = triton.InferInput("InputTensor", [4, 6], "BF16")
        tensor.set_data_from_numpy(x, binary_data=True)
        got = client.infer("sigmoid", [tensor]).as_numpy("OutputTensor")
    assert got.dtype == BFLOAT16 and ulp_distance(got, want).max() <= 1
    client = tg.InferenceServerClient(server.grpc)
    try:
        tensor = tg.InferInput("InputTensor", [4, 6], "BF16")
        tensor.set_data_from_numpy(x)
        got = client.infer("sigmoid", [tensor]).as_numpy("OutputTensor")
    finally:
        client.close()
    assert got.dtype == BFLOAT16 and ulp_distance(got, want).max() <= 1


def test_models_list_bf16_where_onnx_has_it(http):
    """Beside the 64-bit types: BF16 needs no device feature, so it is served wherever it is accepted,
    whichever 64-bit types the device refuses."""
    relu = http.get("/v2/models/relu").json()["parameters"]
    assert {"BF16", "FP32", "INT64"} <= set(relu["datatypes"].split(","))
    assert "BF16" not in relu.get("datatypes_refused", "")
    assert "BF16" not in http.get("/v2/models/shrink").json()["parameters"]["datatypes"].split(",")
    body = {"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "BF16", "data": [1, 2]}]}
    assert_error(http.post("/v2/models/shrink/infer", json=body), 400, "does not take BF16; it takes FP32, FP16, FP64, INT8")
    catalog = {op["name"]: op for op in http.get("/v1/operators").json()["operators"]}
    assert "VKACT_TENSOR_DATA_TYPE_BFLOAT16" in catalog["softmax"]["data_types_on_device"]
    assert "VKACT_TENSOR_DATA_TYPE_BFLOAT16" not in [t["data_type"] for t in catalog["softmax"]["data_types_without_kernel"]]


def test_a_finite_number_past_bf16s_range_is_a_400(http):
    body = {"inputs": [{"name": "InputTensor", "shape": [2], "datatype": "BF16", "data": [1.0, 3.4e38]}]}
    assert_error(http.post("/v2/models/relu/infer", json=body), 400, "inputs[0].data", "element 1 is 3.4e+38, which overflows BF16")
    assert_still_serving(http)


@pytest.mark.parametrize("encoding", ["json", "base64", "binary"])
def test_v1_names_it_vkact_tensor_data_type_bfloat16(http, encoding):
    x = np.array([1.5, -2.0, np.nan, -0.0, 100.0, -1e-3], BFLOAT16)
    operator = request_body("ELU", x, Alpha=0.5)
    assert operator["InputTensor"]["DataType"] == "VKACT_TENSOR_DATA_TYPE_BFLOAT16"
    want = reference("ELU", x, Alpha=0.5)
    buffer = x.view(np.uint8)
    if encoding == "binary":
        body, headers = binary_request(operator, buffer)
        response = http.post("/v1/execute", content=body, headers=headers)
        n = int(response.headers["Inference-Header-Content-Length"])
        got = np.frombuffer(response.content[n:], BFLOAT16)[: x.size]
    else:
        data = encode_values(x) if encoding == "json" else {"base64": base64.b64encode(buffer.tobytes()).decode()}
        response = http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": data}})
        out = response.json()["Output"]
        got = (np.array([float(v.replace("Infinity", "inf")) if isinstance(v, str) else v for v in out], np.float64)
               if encoding == "json" else np.frombuffer(base64.b64decode(out["base64"]), BFLOAT16).astype(np.float64))[: x.size]
        got = got.astype(np.float32).astype(BFLOAT16)  # exact: the answer's values are bfloat16 values
    assert response.status_code == 200, response.text
    assert ulp_distance(got, want).max() <= 1


# -- the Python client ------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["json", "base64", "binary"])
def test_the_client_sends_ml_dtypes_bfloat16_arrays(server, encoding):
    from client import Client

    x = (np.random.default_rng(9).standard_normal((5, 7)) * 4).astype(BFLOAT16)[:, ::2]  # strided too
    with Client(server.url, encoding=encoding) as vk:
        y = vk.sigmoid(x)
    assert y.dtype == BFLOAT16 and y.shape == x.shape
    assert ulp_distance(y, reference("SIGMOID", np.ascontiguousarray(x))).max() <= 1


RAW_BITS_SCRIPT = """
import sys
sys.modules["ml_dtypes"] = None  # as where ml_dtypes is not installed
import numpy as np
from client import Client
bits = np.array([0x3FC0, 0xBFC0, 0x7FC1, 0x0001, 0x8000, 0x7F80, 0xFF80, 0x4049], np.uint16)
want = [0x3FC0, 0x0000, 0x7FC1, 0x0001, 0x0000, 0x7F80, 0x0000, 0x4049]  # relu: negatives (and -0) to +0
for encoding in ("json", "base64", "binary"):
    with Client(sys.argv[1], encoding=encoding) as vk:
        y = vk.execute("relu", bits, data_type="bfloat16")
    got = y.tolist()
    assert got[2] & 0x7FC0 == 0x7FC0, hex(got[2])  # a quiet NaN (JSON's "NaN" carries no payload)
    assert got[3] in (0x0001, 0x0000), hex(got[3])  # a subnormal, or flushed (SwiftShader flushes it)
    assert y.dtype == np.uint16 and got[:2] + got[4:] == want[:2] + want[4:], (encoding, [hex(v) for v in got])
try:
    Client(sys.argv[1]).execute("relu", bits.astype(np.int32), data_type="bfloat16")
except TypeError as exc:
    assert "raw bits as uint16" in str(exc)
else:
    raise AssertionError("int32 bits taken as bfloat16")
print("ok")
"""


def test_without_ml_dtypes_the_client_sends_raw_uint16_bits(server):
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", RAW_BITS_SCRIPT, server.url], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_client_reads_64_bit_integers_exactly():
    """The answer's JSON integers beyond 2^53 (INT64/UINT64 outputs, once those kernels exist) become the
    exact elements: the client decodes them with the service's decoder."""
    from client import codec

    for dtype, values in (("<i8", [2**63 - 1, -(2**63), 2**53 + 1]), ("<u8", [2**64 - 1, 2**53 + 1, 0])):
        text = b'{"Output": [' + ",".join(map(str, values)).encode() + b"]}"
        data = codec.parse_header(memoryview(text))["Output"]
        got = codec.decode_data(data, np.dtype(dtype), 24, 24, "Output")
        assert got.view(dtype).tolist() == values
