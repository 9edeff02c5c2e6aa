"""A /v2 inference sent as JSON whose structure repeats, for the direct HTTP path (service/http_direct.py).

A JSON request's text differs from the last one's in its tensors' values (and its ``id``) alone, so the
header cache that serves binary frames (v2.routes._seen) never matches it, and each one went through the
whole route: pydantic's envelope, the descriptor, the output plans, the answer's dict, Starlette's request
and response. Here the request's JSON is parsed as the route parses it (json_text.load_header: the same
bounds), and its structure, the text of everything but each input's ``data`` and the ``id``, is the key of
what the route decided for it: the descriptor, which input is which, the answer's text around the
output's values (or, for an output asked as binary data, the answer's JSON header). Each request's values
are still decoded and checked by the route's own functions (v2.codec.json_tensor: every element exact in
its datatype or a 400), and the answer's values written as the route writes them (json_text.json_values).

Only the plain case comes this way: every input as JSON ``data`` and no parameters of its own, one output
answered as JSON or as binary data (not in shared memory), an ``id`` that is a string or null, a body
within the direct path's 64 KiB, an output of at most LARGE bytes (INLINE_BYTES as JSON). Anything else,
and any request whose values the checks refuse, goes to the route, which answers it (its error included)
as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np
import orjson

from ...dataplane import descriptor_key, ready_device
from ...dataplane.metrics import MODEL_VERSION
from ...dataplane.models import DML_TO_V2, MODELS, find_model
from ...descriptors.tensor import TensorDesc
from ...jobs import LARGE, Result
from ...limits import INLINE_BYTES
from ...operators import OperatorDesc
from ..execution import frame_headers
from ..header_cache import HeaderCache
from ..json_text import check_answer_values, dumps, json_values, load_header
from ..runtime import Runtime
from .codec import build_operator, envelope, json_tensor, padded
from .outputs import output_bytes, plan_outputs

_DATA_END = b"[]}]}"  # how the answer's text ends with an empty output: its values' text goes where the [] is
_ROUTE = object()  # the cache's entry for a structure that is the route's (not the plain case)


@dataclass
class JsonParsed:
    """What a JSON request's structure decides: ``op``, and for each of its inputs in the descriptor's order
    (index in the request's ``inputs``, its descriptor, its datatype as sent); the answer: its output's entry
    (without the values), and its text without an ``id``: before the values (``binary`` False) or the
    binary frame's JSON header (``binary`` True)."""

    op: OperatorDesc
    key: bytes
    inputs: list[tuple[int, TensorDesc, str]]
    model: str
    entry: dict[str, Any]
    binary: bool
    text: bytes
    in_place = False  # an inference never runs in place

    def decode(self, header: dict) -> memoryview:
        """The input tensors of a request of this structure, each padded to its descriptor's bytes, back to
        back in the descriptor's order (where ``spans`` says); raises the route's 400 for a value its datatype
        does not hold exactly, or a count that is not the shape's."""
        tensors = header["inputs"]
        parts = [padded(json_tensor(tensors[i]["data"], desc.DataType.info.numpy, prod(desc.Sizes), f"inputs[{i}].data", datatype),
                        desc.total_bytes) for i, desc, datatype in self.inputs]
        return memoryview(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def spans(self) -> list[tuple[int, int, int]]:
        """(offset, bytes, the buffer's bytes) of each input in ``decode``'s tensors."""
        spans, offset = [], 0
        for _, desc, _ in self.inputs:
            spans.append((offset, desc.total_bytes, desc.total_bytes))
            offset += desc.total_bytes
        return spans

    def buffers(self, tail: memoryview) -> list[np.ndarray]:
        return [np.frombuffer(tail[o : o + n], np.uint8) for o, n, _ in self.spans()]

    def answer(self, result: Result, request_id: str | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The answer's body and HTTP headers, as the route writes them (v2.outputs.encode_outputs and its
        Response), the output read from ``result``'s slot."""
        text = self.text if request_id is None else _text(self.model, request_id, self.entry, self.binary)
        nbytes = output_bytes(self.op)
        if self.binary:
            body = b"".join((text, result.output[:nbytes]))
            return body, [(b"vary", b"Accept-Encoding"), *frame_headers(len(text), len(body))]
        body = b"".join((text, dumps(json_values(np.frombuffer(result.output, np.uint8, nbytes), self.op.output.DataType.info.numpy)), b"}]}"))
        return body, [(b"vary", b"Accept-Encoding"), (b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]


def _text(model: str, request_id: str | None, entry: dict[str, Any], binary: bool) -> bytes:
    """The answer's JSON as encode_outputs writes it: whole (its binary frame's header), or up to the
    output's values."""
    head: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if request_id is not None:
        head["id"] = request_id
    head["outputs"] = [entry if binary else {**entry, "data": []}]
    text = dumps(head)
    if binary:
        return text
    assert text.endswith(_DATA_END)
    return text[: -len(_DATA_END)]


def structure(header: dict) -> bytes | None:
    """The text of ``header`` without its inputs' values and its ``id``: what decides a JSON request but its
    tensors. None where the request is not the plain case (an ``id`` that is not a string or null, an input
    that is not an object with ``data``), or where the text would not tell it apart from another (a null
    in it: see below)."""
    tensors = header.get("inputs")
    if type(tensors) is not list or not tensors or type(header.get("id", "")) not in (str, type(None)):
        return None
    stripped = []
    for tensor in tensors:
        if type(tensor) is not dict or "data" not in tensor or "parameters" in tensor:
            return None
        stripped.append({k: v for k, v in tensor.items() if k != "data"})
    try:
        text = orjson.dumps({**{k: v for k, v in header.items() if k != "id"}, "inputs": stripped})
    except orjson.JSONEncodeError:  # an integer past 64 bits (the json module parsed it): the route decides
        return None
    # orjson writes a non-finite float (a bare NaN or Infinity, which the json module parses) as null: such a
    # text would be the key of the same request with null there, which the route may answer otherwise
    return None if b"null" in text else text


def repeated_json(state: Runtime, model: str, version: str | None, body: memoryview) -> tuple[JsonParsed, memoryview, str | None] | None:
    """A plain JSON request (see the module): its structure's decision, its decoded tensors and its ``id``,
    for the direct HTTP path; None for any other request and for any refused (the route answers it, its
    error included)."""
    if model not in MODELS or len(body) > INLINE_BYTES:
        return None
    try:
        model_class = find_model(model, version)
        max_tensor_bytes = ready_device(state.worker)["max_tensor_bytes"]
        max_values = state.settings.max_json_values
        header = load_header(body, max_values, False)
        shape = structure(header)
        if shape is None:
            return None
        cache: HeaderCache[JsonParsed | object] = state.v2_json
        key = cache.key(shape, model, model_class, max_tensor_bytes, max_values)
        parsed = cache.get(key)
        if parsed is None:
            parsed = _decide(model, model_class, header, max_tensor_bytes, max_values)
            cache.put(key, parsed)
        if not isinstance(parsed, JsonParsed):
            return None
        return parsed, parsed.decode(header), header.get("id")
    except Exception:  # noqa: BLE001 - the route parses it again and answers it, its error included
        return None


def _decide(model: str, model_class: type[OperatorDesc], header: dict, max_tensor_bytes: int, max_values: int) -> JsonParsed | object:
    """What the route decides for ``header``'s structure (its errors raised: nothing is kept for them), or
    _ROUTE where its answer is not the plain one: an output in shared memory, more than one, a large one."""
    req = envelope(header)
    op = build_operator(model_class, req, max_tensor_bytes)

    def no_region(name: str) -> Any:
        raise LookupError(name)

    try:
        plans = plan_outputs(op, req, no_region)  # type: ignore[arg-type]
    except LookupError:  # an output in shared memory
        return _ROUTE
    nbytes = output_bytes(op)
    if len(plans) != 1 or plans[0].region is not None or nbytes > (LARGE if plans[0].binary else min(LARGE, INLINE_BYTES)):
        return _ROUTE
    binary = plans[0].binary
    if not binary:
        check_answer_values(nbytes // op.output.DataType.info.size, max_values, "outputs", "ask for binary_data_output")
    where = {tensor.name: i for i, tensor in enumerate(req.inputs)}
    inputs = [(where[name], getattr(op, name), req.inputs[where[name]].datatype) for name in op.input_fields]
    out = op.output
    entry: dict[str, Any] = {"name": plans[0].name, "datatype": DML_TO_V2[out.DataType], "shape": list(out.Sizes)}
    if binary:
        entry["parameters"] = {"binary_data_size": nbytes}
    return JsonParsed(op, descriptor_key(op), inputs, model, entry, binary, _text(model, None, entry, binary))
