"""Raw /v1 requests for the service tests (the client library is tested on its own as well)."""
from __future__ import annotations

import numpy as np

from client.buffers import view
from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH, encode_frame  # noqa: F401 (re-exported for tests)
from tests.helpers import tensor


def request_body(kind: str, x: np.ndarray, strides=None, **params) -> dict:
    return {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", "InputTensor": tensor(x.dtype, x.shape, strides), **params}


def binary_request(operator: dict, buffer: np.ndarray, **extra) -> tuple[bytes, dict]:
    header = {"Operator": operator, "Inputs": {"InputTensor": {"binary_data_size": int(buffer.nbytes)}}, **extra}
    parts, n = encode_frame(header, [buffer.tobytes()])
    return b"".join(parts), {HEADER_LENGTH: str(n), "Content-Type": BINARY_CONTENT_TYPE}


def decode_response(response, dtype) -> np.ndarray:
    """The output tensor of a 200 response, in any encoding."""
    assert response.status_code == 200, response.text
    import base64
    import json

    if HEADER_LENGTH in response.headers:
        n = int(response.headers[HEADER_LENGTH])
        head, raw = json.loads(response.content[:n]), np.frombuffer(response.content[n:], np.uint8)
        assert head["Output"] == {"binary_data_size": raw.nbytes}
    else:
        head = response.json()
        data = head["Output"]
        if isinstance(data, dict):
            raw = np.frombuffer(base64.b64decode(data["base64"]), np.uint8)
        else:
            # JSON integers as they are (exact at 64 bits; float() would round past 2^53)
            values = np.array([v if not isinstance(v, str) else float(v.replace("Infinity", "inf")) for v in data], dtype)
            raw = np.zeros(head["OutputTensor"]["TotalTensorSizeInBytes"], np.uint8)
            raw[: values.nbytes] = values.view(np.uint8)
    desc = head["OutputTensor"]
    return np.array(view(raw, dtype, tuple(desc["Sizes"]), tuple(desc["Strides"]) if desc["Strides"] else None))
