"""JSON that parses into something the service cannot hold or quote back: a 5,000-digit integer
(beyond Python's int_max_str_digits), a lone surrogate escape (not a Unicode character: no answer
could quote it), nesting 100,000 deep (beyond any recursive parser), on /v1 and /v2, as a JSON body
and as the JSON header of a binary frame. Each is a 4xx with the service's error body, never a 500,
and the service answers the next request correctly."""
from __future__ import annotations

import json

import numpy as np
import pytest

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH
from tests.service.helpers import decode_response, request_body

X = np.array([-2.0, -0.25, 0.0, 3.5], np.float32)
HUGE = "9" * 5000
MARK = 7654321  # replaced in the JSON text by a 5,000-digit integer
DEEP = "[" * 100_000 + "]" * 100_000


def v1_header(data: object = None) -> dict:
    return {"Operator": request_body("RELU", X), "Inputs": {"InputTensor": X.tolist() if data is None else data}}


def v2_header(data: object = None) -> dict:
    return {"inputs": [{"name": "InputTensor", "shape": [4], "datatype": "FP32", "data": X.tolist() if data is None else data}]}


def odd_texts(header: dict, key_path: list[str]) -> dict[str, str]:
    """The odd variants of a valid header's JSON text: ``key_path`` names a dict whose new key is odd."""
    def with_key(key_text: str) -> str:
        target = header
        for part in key_path:
            target = target[part]
        target["__KEY__"] = 1
        text = json.dumps(header).replace('"__KEY__"', key_text)
        del target["__KEY__"]
        return text

    marked = json.loads(json.dumps(header))
    marked["Extra" if "Operator" in marked else "id"] = MARK
    return {
        "huge integer field": json.dumps(marked).replace(str(MARK), HUGE),
        "huge integer in the data": json.dumps(header).replace("-2.0", HUGE, 1),
        "lone surrogate key": with_key('"\\ud800"'),
        "lone low surrogate key": with_key('"x\\udc00y"'),
        "deep nesting in the data": json.dumps(header).replace("[-2.0, -0.25, 0.0, 3.5]", DEEP, 1),
        "deep nesting at the top": DEEP,
    }


def post_variants(http, path: str, text: str) -> list:
    """``text`` as a JSON body and as a binary frame's header (followed by 4 bytes no input names)."""
    body = text.encode()
    return [
        http.post(path, content=body, headers={"Content-Type": "application/json"}),
        http.post(path, content=body + b"\0\0\0\0", headers={HEADER_LENGTH: str(len(body)), "Content-Type": BINARY_CONTENT_TYPE}),
    ]


def assert_4xx(response, what: str) -> None:
    assert 400 <= response.status_code < 500, (what, response.status_code, response.text)
    assert response.json()["error"], (what, response.text)


@pytest.mark.parametrize("case", list(odd_texts(v1_header(), ["Inputs"])))
def test_odd_json_on_v1_is_a_4xx(http, case):
    text = odd_texts(v1_header(), ["Inputs"])[case]
    for response in post_variants(http, "/v1/execute", text):
        assert_4xx(response, case)
        assert set(response.json()) == {"error", "field"}
    np.testing.assert_array_equal(decode_response(http.post("/v1/execute", json=v1_header()), np.float32), np.maximum(X, 0))


@pytest.mark.parametrize("where", ["parameters", "inputs[0].parameters", "id"])
@pytest.mark.parametrize("case", list(odd_texts(v2_header(), [])))
def test_odd_json_on_v2_is_a_4xx(http, case, where):
    header = v2_header()
    if where == "parameters":
        header["parameters"] = {"Threshold": 1.0}
        texts = odd_texts(header, ["parameters"])
    elif where == "inputs[0].parameters":
        header["inputs"][0]["parameters"] = {}
        texts = odd_texts(header, ["inputs", 0])  # a key beside the input's fields
    else:
        texts = odd_texts(header, [])
        texts["lone surrogate key"] = json.dumps(header).replace("{", '{"id": "\\ud800", ', 1)  # the request's id
    for response in post_variants(http, "/v2/models/relu/infer", texts[case]):
        assert_4xx(response, f"{case} in {where}")
        assert set(response.json()) == {"error"}
    assert http.post("/v2/models/relu/infer", json=v2_header()).json()["outputs"][0]["data"] == np.maximum(X, 0).tolist()


@pytest.mark.parametrize("text", [DEEP, '{"ready": ' + DEEP + "}", '{"ready": true, "n": ' + HUGE + "}", '{"\\udfff": true}'],
                         ids=["deep", "deep value", "huge integer", "lone surrogate key"])
def test_odd_json_on_the_repository_index_is_a_400(http, text):
    assert_4xx(http.post("/v2/repository/index", content=text.encode()), text[:20])
    assert [m["state"] for m in http.post("/v2/repository/index", json={"ready": True}).json()][:1] == ["READY"]


def test_an_error_message_quoting_text_that_is_not_unicode_is_still_written():
    """The second line of defence: should any message quote a lone surrogate, its body is written
    (escaped), not a failure of the error handler itself."""
    from service.api.errors import error_response

    body = error_response(400, "no input '\ud800x' (µ)", "Inputs.\ud800x").body
    assert json.loads(body) == {"error": "no input '\ud800x' (µ)", "field": "Inputs.\ud800x"}


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/systemsharedmemory/region/big/register"])
def test_a_control_request_with_a_megabyte_body_is_a_413(http, path):
    """Control bodies are a few bytes; they are read whole before parsing, so they are bounded (64 KiB)."""
    body = b'{"key": "' + b"k" * (1 << 20) + b'", "byte_size": 1}'
    response = http.post(path, content=body)
    assert response.status_code == 413 and response.json()["error"], response.text[:200]
    assert http.get("/v2/systemsharedmemory/status").status_code == 200
