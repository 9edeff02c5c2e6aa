"""A stand-in for POST /v1/execute for client tests: decodes the request with client.codec and
client.buffers (not client.tensors, which is under test), negates the input and answers in the
request's ResponseEncoding with the layout the real service would use."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from client import codec
from client.buffers import min_buffer_bytes, to_buffer, view
from client.codec import HEADER_LENGTH, Encoding

DTYPES = {"DML_TENSOR_DATA_TYPE_FLOAT32": np.dtype("<f4"), "DML_TENSOR_DATA_TYPE_FLOAT16": np.dtype("<f2")}


def span(itemsize: int, sizes: list[int], strides: list[int] | None) -> int:
    if 0 in sizes:
        return 0
    if strides is None:
        return int(np.prod(sizes)) * itemsize
    return (sum((s - 1) * st for s, st in zip(sizes, strides)) + 1) * itemsize


def decode_tensor(desc: dict[str, Any], data: Any, binary: memoryview | None) -> np.ndarray:
    dtype = DTYPES[desc["DataType"]]
    strides = desc.get("Strides")
    buffer = codec.decode_data(data, dtype, desc["TotalTensorSizeInBytes"], span(dtype.itemsize, desc["Sizes"], strides), "x", binary)
    return view(buffer, dtype, tuple(desc["Sizes"]), None if strides is None else tuple(strides)).copy()


def response(header: dict[str, Any], buffers: list[np.ndarray], encoding: Encoding, status: int = 200) -> httpx.Response:
    if encoding is Encoding.BINARY:
        parts, n = codec.encode_frame(header, buffers)
        return httpx.Response(status, content=b"".join(parts), headers={"Content-Type": codec.BINARY_CONTENT_TYPE, HEADER_LENGTH: str(n)})
    return httpx.Response(status, content=json.dumps(header).encode(), headers={"Content-Type": "application/json"})


def output_response(op_type: str, desc: dict[str, Any], result: np.ndarray, encoding: Encoding) -> httpx.Response:
    strides = desc.get("Strides")
    strides = None if strides is None else tuple(strides)
    total = desc.get("TotalTensorSizeInBytes", min_buffer_bytes(result.itemsize, result.shape, strides))
    buffer = to_buffer(result, strides, total)
    data = codec.encode_data(buffer, result.dtype, span(result.itemsize, list(result.shape), desc.get("Strides")), encoding)
    header = {"Operator": op_type, "OutputTensor": desc, "Output": data}
    return response(header, [buffer] if encoding is Encoding.BINARY else [], encoding)


@dataclass
class FakeServer:
    """The MockTransport handler; keeps every request for the test to inspect."""

    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert request.url.path == "/v1/execute", request.url
        header, tail = codec.split_frame(request.content, request.headers.get(HEADER_LENGTH))
        op, inputs = header["Operator"], header["Inputs"]
        slices = codec.binary_slices(list(inputs.items()), tail)
        x = decode_tensor(op["InputTensor"], inputs["InputTensor"], slices.get("InputTensor"))
        # Like the service: the output defaults to the input's descriptor.
        out_desc = op.get("OutputTensor", op["InputTensor"])
        return output_response(op["Type"], out_desc, -x, Encoding(header.get("ResponseEncoding", "binary")))

    @property
    def last(self) -> tuple[dict[str, Any], memoryview]:
        request = self.requests[-1]
        return codec.split_frame(request.content, request.headers.get(HEADER_LENGTH))
