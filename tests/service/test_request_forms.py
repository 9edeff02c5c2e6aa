"""Request forms that Triton's and other servers' users send: Axes as a Triton scalar parameter, Axes given
to SOFTMAX (a SOFTMAX1 field), binary tensor bytes without Inference-Header-Content-Length, a compressed
/v1 body. Each is answered (or refused with a message that says what to do) as on the other route."""
from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest

from client.codec import HEADER_LENGTH
from tests.service.helpers import decode_response, request_body
from tests.service.test_errors import GOOD as V1_GOOD
from tests.service.test_errors import assert_still_serving as v1_still_serving
from tests.service.test_v2 import reference
from tests.service.test_v2_errors import GOOD as V2_GOOD
from tests.service.test_v2_errors import assert_error
from tests.service.test_v2_errors import assert_still_serving as v2_still_serving

X = np.random.default_rng(5).standard_normal((3, 4, 5)).astype(np.float32)


def v2_softmax(model: str, **parameters) -> dict:
    return {"inputs": [{"name": "InputTensor", "shape": list(X.shape), "datatype": "FP32", "data": X.ravel().tolist()}],
            "parameters": parameters}


@pytest.mark.parametrize("axes,reduced", [(1, (1,)), (0, (0,)), ("2", (2,)), ([0, 2], (0, 2))], ids=["int", "zero", "string", "list"])
def test_axes_as_a_triton_scalar_parameter(http, axes, reduced):
    response = http.post("/v2/models/softmax1/infer", json=v2_softmax("softmax1", Axes=axes))
    assert response.status_code == 200, response.text
    y = np.array(response.json()["outputs"][0]["data"], np.float32).reshape(X.shape)
    np.testing.assert_allclose(y, reference("softmax1", {"InputTensor": X}, Axes=list(reduced)), rtol=1e-5, atol=1e-6)
    e = np.exp(X.astype(np.float64) - X.max(axis=reduced, keepdims=True))  # float64 oracle beside the reference
    np.testing.assert_allclose(y, e / e.sum(axis=reduced, keepdims=True), rtol=1e-5, atol=1e-6)


def test_axes_out_of_range_as_an_integer_is_refused(http):
    assert_error(http.post("/v2/models/softmax1/infer", json=v2_softmax("softmax1", Axes=3)), 400, "parameters.Axes")
    assert_error(http.post("/v2/models/softmax1/infer", json=v2_softmax("softmax1", Axes=True)), 400, "parameters.Axes")
    v2_still_serving(http)


@pytest.mark.parametrize("model,field", [("softmax", "Axes"), ("log_softmax", "Axes"), ("hardmax", "AxisCount")])
def test_axes_on_a_last_axis_operator_points_to_its_successor_on_v2(http, model, field):
    response = http.post(f"/v2/models/{model}/infer", json=v2_softmax(model, **{field: 1}))
    assert_error(response, 400, f"parameters.{field}", f"DML_OPERATOR_ACTIVATION_{model.upper()}1", f"model {model}1")
    v2_still_serving(http)


@pytest.mark.parametrize("kind,field,value", [("SOFTMAX", "Axes", [1]), ("LOG_SOFTMAX", "AxisCount", 1), ("HARDMAX", "Axes", [0])])
def test_axes_on_a_last_axis_operator_points_to_its_successor_on_v1(http, kind, field, value):
    x = X[0]
    operator = {**request_body(kind, x), field: value}
    response = http.post("/v1/execute", json={"Operator": operator, "Inputs": {"InputTensor": x.ravel().tolist()}})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == f"Operator.{field}"
    assert f"DML_OPERATOR_ACTIVATION_{kind}1" in response.json()["error"]
    v1_still_serving(http)


def test_binary_bytes_without_the_header_length_get_a_hint(http):
    head = json.dumps({"inputs": [{"name": "InputTensor", "shape": [6], "datatype": "FP32", "parameters": {"binary_data_size": 24}}]}).encode()
    data = np.arange(6, dtype=np.float32).tobytes()
    for body in (head + data, data):  # a JSON header + binary tensors, and a raw binary body
        assert_error(http.post("/v2/models/relu/infer", content=body), 400, HEADER_LENGTH, "length in bytes", "set to 0")
    v2_still_serving(http)
    v1_head = json.dumps({"Operator": request_body("RELU", np.zeros(6, np.float32)), "Inputs": {"InputTensor": {"binary_data_size": 24}}}).encode()
    response = http.post("/v1/execute", content=v1_head + data)
    assert response.status_code == 400 and response.json()["field"] == HEADER_LENGTH
    assert "binary tensor bytes" in response.json()["error"]
    v1_still_serving(http)


@pytest.mark.parametrize("coding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_v1_body_is_decoded_as_on_v2(http, coding, compress):
    v1 = http.post("/v1/execute", content=compress(json.dumps(V1_GOOD).encode()), headers={"Content-Encoding": coding})
    np.testing.assert_array_equal(decode_response(v1, np.float32), [-3, -2, 0, 0, 0, 2])  # shrink, Threshold 1
    v2 = http.post("/v2/models/shrink/infer", content=compress(json.dumps(V2_GOOD).encode()), headers={"Content-Encoding": coding})
    assert v2.status_code == 200 and v2.json()["outputs"][0]["data"] == [-3, -2, 0, 0, 0, 2]


def test_unsupported_v1_content_encoding_is_v2s_415(http):
    body = json.dumps(V1_GOOD).encode()
    v1 = http.post("/v1/execute", content=body, headers={"Content-Encoding": "br"})
    v2 = http.post("/v2/models/shrink/infer", content=json.dumps(V2_GOOD).encode(), headers={"Content-Encoding": "br"})
    assert v1.status_code == v2.status_code == 415
    assert v1.headers["accept-encoding"] == v2.headers["accept-encoding"] == "gzip, deflate"
    assert v1.json()["field"] == "Content-Encoding" and "gzip" in v1.json()["error"]
    broken = http.post("/v1/execute", content=gzip.compress(body)[:-8], headers={"Content-Encoding": "gzip"})
    assert broken.status_code == 400 and broken.json()["field"] == "Content-Encoding"
    v1_still_serving(http)

