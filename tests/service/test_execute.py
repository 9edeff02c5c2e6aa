"""POST /v1/execute against a real server: every operator, every encoding, both float types, strided
input, in place; compared with the numpy reference."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from client.buffers import to_buffer
from service.operators import parse_operator
from service.vulkan_probe import physical_devices
from tests.engine.test_operators import CASES, max_ulp
from tests.helpers import assert_matches
from tests.service.helpers import binary_request, decode_response, request_body


def post(http, operator: dict, x: np.ndarray, encoding: str, strides=None, **extra):
    desc = parse_operator(operator)
    buffer = to_buffer(x, strides, desc.inputs[0].total_bytes)
    if encoding == "binary":
        body, headers = binary_request(operator, buffer, **extra)
        return desc, http.post("/v1/execute", content=body, headers=headers)
    if encoding == "base64":
        data = {"base64": base64.b64encode(buffer.tobytes()).decode()}
    else:
        values = buffer.view(x.dtype)
        data = [v if np.isfinite(v) else str(v).replace("inf", "Infinity").replace("nan", "NaN") for v in values.tolist()]
    return desc, http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": data}, **extra})


@pytest.mark.parametrize("encoding", ["binary", "json", "base64"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("kind,params", CASES)
def test_every_operator_in_every_encoding(http, kind, params, dtype, encoding):
    x = (np.random.default_rng(len(kind)).standard_normal((3, 5, 7)) * 3).astype(dtype)
    x.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -0.0]
    operator = request_body(kind, x, **params)
    desc, response = post(http, operator, x, encoding)
    assert response.headers["content-type"].startswith("application/octet-stream" if encoding == "binary" else "application/json")
    assert_matches(decode_response(response, dtype), desc.reference(x), max_ulp(kind, dtype))


@pytest.mark.parametrize("encoding", ["binary", "json"])
def test_strided_input_and_output(http, encoding):
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    operator = request_body("SCALED_TANH", x, strides=(1, 4))
    operator["OutputTensor"] = {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [4, 6], "Strides": [8, 1]}
    desc, response = post(http, operator, x, encoding, strides=(1, 4))
    assert_matches(decode_response(response, np.float32), desc.reference(x), 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_in_place(http, dtype):
    x = np.linspace(-3, 3, 99).astype(dtype).reshape(9, 11)
    desc, response = post(http, request_body("CELU", x, Alpha=0.5), x, "binary", InPlace=True)
    assert_matches(decode_response(response, dtype), desc.reference(x), max_ulp("CELU", dtype))


def test_response_encoding_can_differ_from_the_request(http):
    x = np.arange(-4, 4, dtype=np.float32)
    desc, response = post(http, request_body("SOFTSIGN", x), x, "binary", ResponseEncoding="json")
    assert response.headers["content-type"] == "application/json"
    np.testing.assert_array_equal(decode_response(response, np.float32), desc.reference(x))


def test_feature_level_pinning(http):
    x = np.ones((1, 2, 3, 4), np.float32)
    _, ok = post(http, request_body("SHRINK", x), x, "json", FeatureLevel="DML_FEATURE_LEVEL_2_0")
    assert ok.status_code == 200
    _, old = post(http, request_body("SHRINK", x), x, "json", FeatureLevel="DML_FEATURE_LEVEL_1_0")
    assert old.status_code == 422 and old.json()["field"] == "FeatureLevel"
    y = np.ones((2, 3), np.float32)
    _, dims = post(http, request_body("SOFTSIGN", y), y, "json", FeatureLevel="DML_FEATURE_LEVEL_2_0")
    assert dims.status_code == 422 and dims.json()["field"] == "InputTensor.DimensionCount"


def test_catalog_and_device(http):
    catalog = http.get("/v1/operators").json()
    by_name = {op["name"]: op for op in catalog["operators"]}
    assert set(by_name) >= {"shrink", "celu", "softsign", "scaled_tanh"}
    shrink = by_name["shrink"]
    assert shrink["type"] == "DML_OPERATOR_ACTIVATION_SHRINK" and shrink["introduced"] == "DML_FEATURE_LEVEL_2_0"
    assert shrink["fields"] == [{"name": "Bias", "type": "float", "default": 0.0}, {"name": "Threshold", "type": "float", "default": 0.5}]
    assert shrink["in_place"] and shrink["support"][-1]["dimension_counts"] == [1, 8]
    assert "DML_TENSOR_DATA_TYPE_UINT8" in shrink["data_types_on_device"]
    device = http.get("/v1/device").json()
    # ONNX Shrink's eleven types: each served here, or refused with a device feature the kernels lack
    used = set(device["features"]["used_by_kernels"])
    assert set(used) <= set(device["features"]["enabled"]) <= set(device["features"]["reported"])
    refused = {t["data_type"]: t["missing_feature"] for t in shrink["data_types_without_kernel"]}
    assert len(refused.keys() | set(shrink["data_types_on_device"])) == 11
    assert all(feature not in used for feature in refused.values()) and all("_64" in t for t in refused)
    probed = next(d for d in physical_devices() if d.name == device["name"])   # the loader's own answer
    assert device["cpu"] == (probed.type == "cpu") and device["limits"]["max_workgroup_count"] >= 65535
    limit = probed.max_storage_buffer_range
    assert device["limits"]["max_buffer_bytes"] == limit and device["limits"]["max_tensor_bytes"] == limit // 16 * 16 - 16
    assert device["feature_level"] == "DML_FEATURE_LEVEL_6_4"
    # NaN kept by request where the device offers it (all of lavapipe, SwiftShader and NVIDIA's do)
    assert device["nan_preserving_widths"] == (list(probed.nan_preserving_widths) if probed.preserves_nan else [])
    # large jobs on their slot's own pages: the device's measured size where it imports host memory (CPU), else
    # never, unless VKACT_SLOT_IMPORT says otherwise
    from service.config import Settings
    from service.device_tuning import slot_import_bytes, tuning_for
    assert device["slot_import_bytes"] == slot_import_bytes(tuning_for(probed), probed, Settings().slot_import)


@pytest.mark.parametrize("encoding", ["binary", "json"])
def test_two_input_operator(http, encoding):
    """PARAMETERIZED_RELU with a per-channel slope broadcast through zero strides; the binary frame
    carries both buffers in the order the Inputs entries appear."""
    from client.codec import encode_frame
    from tests.service.helpers import HEADER_LENGTH

    x = np.random.default_rng(2).standard_normal((2, 3, 4)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32)
    operator = {
        "Type": "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU",
        "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [2, 3, 4]},
        "SlopeTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [2, 3, 4], "Strides": [0, 1, 0]},
    }
    if encoding == "binary":
        header = {"Operator": operator, "Inputs": {"SlopeTensor": {"binary_data_size": 12}, "InputTensor": {"binary_data_size": 96}}}
        parts, n = encode_frame(header, [slope.tobytes(), x.tobytes()])
        response = http.post("/v1/execute", content=b"".join(parts), headers={HEADER_LENGTH: str(n)})
    else:
        response = http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": x.ravel().tolist(), "SlopeTensor": slope.tolist()}})
    expected = np.where(x >= 0, x, slope[None, :, None] * x)
    np.testing.assert_array_equal(decode_response(response, np.float32), expected)
