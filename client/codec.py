"""The /v1 wire format, shared by the client and the service (numpy only).

A request is one JSON object::

    {"Operator": {<DML_*_OPERATOR_DESC, DirectML field names>},
     "Inputs": {"InputTensor": <data>},          # one entry per input tensor field, in field order
     "InPlace": false, "FeatureLevel": "DML_FEATURE_LEVEL_5_1", "ResponseEncoding": "binary"}

and a response ``{"Operator": type, "OutputTensor": {<descriptor>}, "Output": <data>}``. ``<data>``
is a tensor's buffer (DML_BUFFER_TENSOR_DESC: TotalTensorSizeInBytes of little-endian elements laid
out by Strides) in one of three encodings:

- ``[1.5, -2, "NaN", "Infinity"]``: the buffer's elements as JSON numbers (non-finite values as
  strings); trailing elements that hold no tensor element (DWORD padding) may be left out;
- ``{"base64": "..."}``: the buffer's bytes, base64;
- ``{"binary_data_size": n}``: the bytes follow the JSON header in the HTTP body, in the order the
  tensors appear; the header's length is in the Inference-Header-Content-Length HTTP header
  (Triton's binary tensor data convention).

Responses use the request's encoding unless ResponseEncoding names another.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Sequence
from enum import Enum
from typing import Any, Union

import numpy as np

from .json_values import BeyondFloat64, CodecError, decode_values, encode_values

try:  # optional: the client needs only numpy and httpx
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_CONTENT_TYPE = "application/octet-stream"
Bytes = Union[bytes, bytearray, memoryview, np.ndarray]


class Encoding(str, Enum):
    JSON = "json"
    BASE64 = "base64"
    BINARY = "binary"


def encoding_of(data: Any, field: str) -> Encoding:
    if isinstance(data, list):
        return Encoding.JSON
    if isinstance(data, dict) and set(data) == {"base64"}:
        return Encoding.BASE64
    if isinstance(data, dict) and set(data) == {"binary_data_size"}:
        return Encoding.BINARY
    raise CodecError("tensor data must be a list of numbers, {\"base64\": ...} or {\"binary_data_size\": n}", field)


def decode_data(data: Any, dtype: np.dtype, total_bytes: int, span_bytes: int, field: str, binary: memoryview | None = None,
                type_name: str | None = None) -> np.ndarray:
    """The buffer (uint8, ``total_bytes`` long) that ``data`` encodes; ``binary`` holds the bytes of a
    ``binary_data_size`` entry. JSON numbers must be exact elements of the type (json_values), which
    errors name ``type_name``."""
    kind = encoding_of(data, field)
    if kind is Encoding.BINARY:
        if binary is None:
            raise CodecError("binary_data_size given, but the request is not a binary frame", field)
        raw = np.frombuffer(binary, np.uint8)
    elif kind is Encoding.BASE64:
        try:
            raw = np.frombuffer(base64.b64decode(data["base64"], validate=True), np.uint8)
        except (binascii.Error, TypeError, ValueError) as exc:
            raise CodecError(f"invalid base64: {exc}", field) from None
    else:
        values = decode_values(data, dtype, field, type_name or str(dtype), nested=False)
        count = len(values)
        lo, hi = -(-span_bytes // dtype.itemsize), total_bytes // dtype.itemsize
        if not lo <= count <= hi:
            want = str(hi) if lo == hi else f"{lo} to {hi}"
            raise CodecError(f"{count} values; the descriptor's buffer holds {want}", field)
        buffer = np.zeros(total_bytes, np.uint8)
        buffer[: count * dtype.itemsize] = values.view(np.uint8)
        return buffer
    if raw.nbytes != total_bytes:
        raise CodecError(f"{raw.nbytes} bytes; TotalTensorSizeInBytes is {total_bytes}", field)
    return raw


def encode_data(buffer: np.ndarray, dtype: np.dtype, span_bytes: int, encoding: Encoding) -> Any:
    """JSON value for an output buffer; BINARY gives only the size entry (the bytes travel after)."""
    if encoding is Encoding.BINARY:
        return {"binary_data_size": int(buffer.nbytes)}
    if encoding is Encoding.BASE64:
        return {"base64": base64.b64encode(memoryview(buffer)).decode("ascii")}
    return encode_values(np.frombuffer(buffer, np.uint8, span_bytes - span_bytes % dtype.itemsize).view(dtype))


def encode_frame(header: dict, buffers: Sequence[Bytes]) -> tuple[list[Bytes], int]:
    """Body parts of a binary frame (JSON header, then each buffer) and the header's length."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return [head, *buffers], len(head)


def split_frame(body: Bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """(header, the bytes after it) of a body; without a header length the whole body is JSON."""
    raw, tail = frame_parts(body, header_length)
    return parse_header(raw, header_length is not None), tail


def frame_parts(body: Bytes, header_length: str | None) -> tuple[memoryview, memoryview]:
    """(the JSON header's bytes, the bytes after it) of a body, not parsed yet."""
    view = memoryview(body).cast("B")
    if header_length is None:
        return view, view[len(view):]
    try:
        n = int(header_length)
    except ValueError:
        raise CodecError(f"{HEADER_LENGTH} must be an integer, got {header_length!r}", HEADER_LENGTH) from None
    if not 0 <= n <= len(view):
        raise CodecError(f"{HEADER_LENGTH} is {n}, but the body is {len(view)} bytes", HEADER_LENGTH)
    return view[:n], view[n:]


def _loads(raw: memoryview) -> Any:
    """JSON text as Python values: by orjson where it is installed (the service has it), else by the
    json module, which also takes over whatever orjson refuses (bare NaN and Infinity tokens, which
    json.dumps writes, integers beyond 64 bits, numbers out of range, invalid text), so the result
    and the errors are the json module's either way."""
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(bytes(raw), parse_float=_finite_float)


def _finite_float(text: str) -> float:
    """A JSON number as float64; one beyond float64's range (1e400, which orjson refuses) is the
    infinity the json module makes, marked as a ``BeyondFloat64`` so that tensor data (where an infinity
    is written "Infinity") refuses it (json_values) while other fields read it as the json module does."""
    value = float(text)
    return BeyondFloat64(value) if value in (math.inf, -math.inf) else value


NO_HEADER_HINT = (f"; without an {HEADER_LENGTH} header the whole body is read as JSON: binary tensor bytes "
                  f"after the JSON need {HEADER_LENGTH} set to the JSON's length in bytes")


def parse_header(raw: memoryview, framed: bool = True) -> dict:
    """A frame's JSON header (a JSON object), or a CodecError; ``framed``: the body gave its header's
    length (if not, binary bytes sent without it are the likely cause of a decoding error: say so)."""
    try:
        value = _loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer past int_max_str_digits
        if framed:
            raise CodecError(f"malformed JSON: {exc}") from None
        raise CodecError(f"malformed JSON: {exc}{NO_HEADER_HINT}", HEADER_LENGTH) from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise CodecError("malformed JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise CodecError("the JSON header must be an object")
    return value


def binary_slices(entries: Sequence[tuple[str, Any]], tail: memoryview) -> dict[str, memoryview]:
    """Cut the bytes after a frame's header among the entries whose data is ``binary_data_size``."""
    slices, offset = {}, 0
    for field, data in entries:
        if encoding_of(data, field) is not Encoding.BINARY:
            continue
        size = data["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise CodecError("binary_data_size must be a non-negative integer", field)
        if offset + size > len(tail):
            raise CodecError(f"binary_data_size {size} runs past the body's end ({len(tail) - offset} bytes left)", field)
        slices[field] = tail[offset : offset + size]
        offset += size
    if offset != len(tail):
        raise CodecError(f"{len(tail) - offset} bytes after the binary tensors belong to no tensor", HEADER_LENGTH)
    return slices
