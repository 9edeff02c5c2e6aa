"""The /v2 inference request: its frame (JSON, JSON + binary tensors, or the raw bytes of a single input),
its envelope, the DirectML descriptor it names and its input tensors' bytes (Content-Encoding is undone
before, in v2.encoding).

Every 4xx of an inference is decided here (or in v2.outputs), before any device work.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from math import prod
from typing import Annotated, Any, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from client.codec import HEADER_LENGTH, CodecError, frame_parts
from client.json_values import decode_values

from ...errors import InvalidRequest
from ...descriptors.tensor import TensorDesc
from ...operators import OperatorDesc, descriptor_error, parse_operator, short_name
from ...shared_memory import Region, RegionInput
from ..json_text import load_header
from ...dataplane.models import NOT_TENSOR_TYPES, V2_TO_DML, datatypes, is_array_param, param_fields

RESERVED = {"sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"}


Shape = list[Annotated[int, Field(strict=True, ge=0)]]


class RequestInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    shape: Shape
    datatype: str
    parameters: Optional[dict[str, Any]] = None
    data: Any = None


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    parameters: Optional[dict[str, Any]] = None


class InferenceRequest(BaseModel):
    """$inference_request; fields the protocol does not define (model_name, ...) are ignored."""

    model_config = ConfigDict(extra="ignore")

    id: Optional[str] = None
    parameters: Optional[dict[str, Any]] = None
    inputs: list[RequestInput]
    outputs: Optional[list[RequestOutput]] = None


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def json_length(body: memoryview, header_length: str | None) -> int:
    """How much of ``body`` is JSON text (what parse_frame will parse), as the headers say."""
    if header_length is None:
        return len(body)
    return min(int(header_length), len(body)) if header_length.isdigit() else 0


def parse_frame(body: memoryview, header_length: str | None, op: type[OperatorDesc], max_json_values: int) -> tuple[InferenceRequest, memoryview]:
    """The envelope and the bytes after it. An Inference-Header-Content-Length of 0 is Triton's raw binary
    request: no JSON at all, the body is the one input's bytes; vkact reads them as a 1-D tensor of the
    model's first data type (FP32) with default parameters, and answers with binary outputs."""
    try:
        raw_binary = header_length is not None and int(header_length) == 0
    except ValueError:
        raw_binary = False  # frame_parts names the bad header
    if raw_binary:
        if len(op.input_fields) != 1:
            raise InvalidRequest(f"a raw binary request needs a model with one input; this one has {len(op.input_fields)}", HEADER_LENGTH)
        datatype = datatypes(op)[0]
        size = V2_TO_DML[datatype].info.size
        if len(body) % size:
            raise InvalidRequest(f"a raw binary request's body holds {datatype} elements of {size} bytes; it is {len(body)} bytes", HEADER_LENGTH)
        raw = RequestInput(name=op.input_fields[0], shape=[len(body) // size], datatype=datatype, parameters={"binary_data_size": len(body)})
        return InferenceRequest(inputs=[raw], parameters={"binary_data_output": True}), body
    raw, tail = frame_parts(body, header_length)
    try:
        header = load_header(raw, max_json_values, header_length is not None)
    except CodecError as exc:
        if exc.field != HEADER_LENGTH or header_length is not None:
            raise
        raise CodecError(f"{exc.message}; a raw binary body (one input's bytes, no JSON) needs it set to 0", HEADER_LENGTH) from None
    return envelope(header), tail


def envelope(header: Any) -> InferenceRequest:
    """The inference request's envelope, from /v2's JSON header or the fields of a gRPC ModelInferRequest."""
    try:
        return InferenceRequest.model_validate(header)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise InvalidRequest(err["msg"], _path(err["loc"]) or None) from None


# -- the descriptor ----------------------------------------------------------------------------------


def build_operator(model: type[OperatorDesc], req: InferenceRequest, max_tensor_bytes: int) -> OperatorDesc:
    """The DML descriptor the request names: each input's datatype and shape is a packed TensorDesc, each
    parameter a field; validated by the same pydantic models as /v1."""
    by_name: dict[str, RequestInput] = {}
    for i, tensor in enumerate(req.inputs):
        if tensor.name not in model.input_fields:
            raise InvalidRequest(f"unexpected input {tensor.name!r}; the inputs are {', '.join(model.input_fields)}", f"inputs[{i}].name")
        if tensor.name in by_name:
            raise InvalidRequest(f"input {tensor.name!r} is given twice", f"inputs[{i}].name")
        by_name[tensor.name] = tensor
    desc: dict[str, Any] = {"Type": model.type_name()}
    for name in model.input_fields:
        tensor = by_name.get(name)
        if tensor is None:
            raise InvalidRequest(f"input {name!r} is missing", "inputs")
        dml = V2_TO_DML.get(tensor.datatype)
        if dml is None:
            known = "no DirectML tensor has" if tensor.datatype in NOT_TENSOR_TYPES else "unknown datatype"
            raise InvalidRequest(f"{known} {tensor.datatype!r}; {model.type_name()} takes {', '.join(datatypes(model))}", f"{name}.datatype")
        if dml not in model.accepted_types():  # said in the protocol's names, not the descriptor layer's
            raise InvalidRequest(f"{model.type_name()} does not take {tensor.datatype}; it takes {', '.join(datatypes(model))}", f"{name}.datatype")
        desc[name] = {"DataType": dml.value, "Sizes": tensor.shape}
    fields = param_fields(model)
    for key, value in (req.parameters or {}).items():
        if key == "sequence_id":
            if value not in (0, ""):
                raise InvalidRequest("vkact's models are stateless: a sequence_id is not accepted", "parameters.sequence_id")
        elif key in RESERVED or key.startswith("triton_") or key.startswith("vkact_"):
            continue  # protocol-level parameters with no bearing on the operator
        elif key not in fields:
            accepted = ", ".join(fields) or "none"
            elsewhere = getattr(model, "field_elsewhere", lambda _: None)(key)
            hint = f" ({elsewhere}: model {short_name(model)}1)" if elsewhere else ""
            raise InvalidRequest(f"{model.type_name()} has no parameter {key!r}; its parameters are {accepted}{hint}", f"parameters.{key}")
        elif is_array_param(model, key) and isinstance(value, str):
            desc[key] = [part.strip() for part in value.split(",") if part.strip()]  # "0,2" -> [0, 2]
        elif is_array_param(model, key) and isinstance(value, int) and not isinstance(value, bool):
            desc[key] = [value]  # a Triton scalar parameter: one axis
        else:
            desc[key] = value
    try:
        op = parse_operator(desc)
    except ValidationError as exc:
        err = descriptor_error(exc)
        if err.field and err.field.split(".")[0].split("[")[0] in fields:  # a parameter, not a tensor
            raise InvalidRequest(f"parameters.{err.message}", f"parameters.{err.field}") from None
        raise err from None
    op.check_execution(False, max_tensor_bytes)
    return op


# -- the input tensors -------------------------------------------------------------------------------


def json_tensor(data: Any, dtype: np.dtype, count: int, field: str, datatype: str) -> np.ndarray:
    """The elements of a JSON ``data`` value (flat or nested, row-major) as ``dtype``, each exact or a
    400 naming ``datatype`` (client.json_values)."""
    values = decode_values(data, dtype, field, datatype)
    if values.size != count:
        raise InvalidRequest(f"data holds {values.size} values; the shape holds {count}", field)
    return values


def padded(data: np.ndarray | memoryview, total_bytes: int) -> np.ndarray:
    """A descriptor's buffer is rounded up to 4 bytes (DMLCalcBufferTensorSize); the protocol's tensor is
    exactly its elements."""
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1).view(np.uint8)
    if raw.nbytes == total_bytes:
        return raw
    buffer = np.zeros(total_bytes, np.uint8)
    buffer[: raw.nbytes] = raw
    return buffer


def _int_param(params: dict, key: str, field: str, default: int | None = None) -> int:
    value = params.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"{key} must be a non-negative integer", f"{field}.parameters.{key}")
    return value


def json_input(op: OperatorDesc, tensor: RequestInput, i: int) -> np.ndarray:
    """The buffer of an input sent as JSON data (its name is one of the operator's: build_operator checked)."""
    return json_tensor_input(getattr(op, tensor.name), tensor, i)


def json_tensor_input(desc: TensorDesc, tensor: RequestInput, i: int) -> np.ndarray:
    """The buffer of ``desc`` from an input sent as JSON data."""
    return padded(json_tensor(tensor.data, desc.DataType.info.numpy, prod(desc.Sizes), f"inputs[{i}].data", tensor.datatype), desc.total_bytes)


def json_inputs(op: OperatorDesc, req: InferenceRequest) -> dict[str, np.ndarray]:
    """The buffers of every input sent as JSON data, by name."""
    return {tensor.name: json_input(op, tensor, i) for i, tensor in enumerate(req.inputs) if tensor.data is not None}


async def decode_inputs(op: OperatorDesc, req: InferenceRequest, tail: memoryview, region: Callable[[str], Region],
                        decoded: dict[str, np.ndarray] | None = None) -> list[np.ndarray | RegionInput]:
    """Each input's buffer, in the descriptor's order. ``region(name)`` opens a registered shared memory
    region; an input there stays there (a RegionInput) until the device worker reads it (pread, never
    mapped: see shared_memory) straight into its slot."""
    buffers = await decode_tensors({name: getattr(op, name) for name in op.input_fields}, req, tail, region, decoded)
    return [buffers[name] for name in op.input_fields]


async def decode_tensors(descs: Mapping[str, TensorDesc], req: InferenceRequest, tail: memoryview, region: Callable[[str], Region],
                         decoded: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray | RegionInput]:
    """Each input's buffer by its name, ``descs`` giving each named input's descriptor (the names
    checked before: an operator's fields, a graph model's input edges); see decode_inputs."""
    buffers: dict[str, np.ndarray | RegionInput] = {}
    offset = 0
    for i, tensor in enumerate(req.inputs):
        field = f"inputs[{i}]"
        desc = descs[tensor.name]
        dtype = desc.DataType.info.numpy
        count = prod(desc.Sizes)
        nbytes = count * dtype.itemsize
        params = tensor.parameters or {}
        sources = [s for s in ("binary_data_size", "shared_memory_region") if s in params] + (["data"] if tensor.data is not None else [])
        if len(sources) != 1:
            raise InvalidRequest(f"input {tensor.name!r} needs exactly one of data, parameters.binary_data_size, parameters.shared_memory_region; it has {len(sources)}", field)
        if sources[0] == "data":
            buffers[tensor.name] = decoded[tensor.name] if decoded is not None else json_tensor_input(desc, tensor, i)
            continue
        if sources[0] == "binary_data_size":
            size = _int_param(params, "binary_data_size", field)
            if len(tail) == 0 and size:
                raise InvalidRequest(f"binary_data_size {size} given, but no binary data follows the JSON (is {HEADER_LENGTH} set?)", field)
            if offset + size > len(tail):
                raise InvalidRequest(f"binary_data_size {size} runs past the body's end ({len(tail) - offset} bytes left)", field)
            data = tail[offset : offset + size]
            offset += size
        else:
            name = params["shared_memory_region"]
            if "shared_memory_byte_size" not in params:
                raise InvalidRequest("shared_memory_byte_size is required with shared_memory_region", f"{field}.parameters")
            size = _int_param(params, "shared_memory_byte_size", field)
            start = _int_param(params, "shared_memory_offset", field, 0)
            if not isinstance(name, str):
                raise InvalidRequest("shared_memory_region must be a region name", f"{field}.parameters.shared_memory_region")
            memory = region(name)
            if start + size > memory.nbytes:
                raise InvalidRequest(f"offset {start} + byte size {size} runs past region {name!r} ({memory.nbytes} bytes)", field)
            if size != nbytes:
                raise InvalidRequest(f"{size} bytes given for {tensor.name!r}; shape {list(desc.Sizes)} of {tensor.datatype} is {nbytes} bytes", field)
            memory.check_size(f"{field}.parameters.shared_memory_region")  # a 400 now, before a slot is taken
            buffers[tensor.name] = RegionInput(memory, start, size, desc.total_bytes, f"{field}.parameters.shared_memory_region")
            continue
        if size != nbytes:
            raise InvalidRequest(f"{size} bytes given for {tensor.name!r}; shape {list(desc.Sizes)} of {tensor.datatype} is {nbytes} bytes", field)
        buffers[tensor.name] = padded(data, desc.total_bytes)
    if offset != len(tail):
        raise InvalidRequest(f"{len(tail) - offset} bytes after the binary tensors belong to no input", HEADER_LENGTH)
    return buffers
