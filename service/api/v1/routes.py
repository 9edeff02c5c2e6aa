"""/v1: execute one operator, the operator catalog, the device report."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, ValidationError

from client.codec import (
    HEADER_LENGTH,
    CodecError,
    Encoding,
    binary_slices,
    decode_data,
    encode_data,
    encoding_of,
    frame_parts,
)

from ...config import Settings
from ...descriptors import IMPLEMENTED_LEVEL, DataType, TensorDesc
from ...descriptors import FeatureLevel as Level
from ...errors import DescriptorError, VkactError
from ...operators import OPERATORS, OperatorDesc, descriptor_error, parse_operator
from ...dataplane import descriptor_key, device_report, ready_device
from ...jobs import LARGE, Result
from ...worker import DeviceWorker
from .catalog import catalog
from .graphs import GraphBody, execute_graph
from ...dataplane.models import kernel_features
from ..execution import FrameResponse, answered, binary_frame, count_against, frame_headers, request_body, run_on_device, within_budget
from ..header_cache import HeaderCache
from ...limits import INLINE_BYTES
from ..json_text import check_answer_values, dumps, in_json_thread, load_header
from ..runtime import Runtime, device_worker, runtime

router = APIRouter(prefix="/v1", tags=["v1"])


# async: FastAPI runs a plain def dependency in its thread pool, two thread hops per request.
async def _worker(request: Request) -> DeviceWorker:
    return device_worker(request)


async def _settings(request: Request) -> Settings:
    return runtime(request).settings


WorkerDep = Annotated[DeviceWorker, Depends(_worker)]
SettingsDep = Annotated[Settings, Depends(_settings)]


class ExecuteRequest(BaseModel):
    """The envelope of POST /v1/execute (see client.codec for the data encodings)."""

    model_config = ConfigDict(extra="forbid")

    Operator: dict[str, Any]
    Inputs: dict[str, Any]
    InPlace: bool = False
    FeatureLevel: Level | None = None
    ResponseEncoding: Encoding | None = None


@dataclass
class Parsed:
    """What a request's JSON header decides, before any tensor bytes are read."""

    req: ExecuteRequest
    op: OperatorDesc
    key: bytes                            # the descriptor pickled: how the device worker knows it
    encoding: Encoding                    # of the response
    binary: list[tuple[int, int]] | None  # every input travels binary: (offset, size) after the header
    head: bytes | None = None             # the binary response's JSON header, once built
    frame_headers: list[tuple[bytes, bytes]] | None = None  # and its HTTP headers

    def buffers(self, tail: memoryview) -> list[np.ndarray]:
        """The inputs of a binary frame with this header (and a tail of the length it was parsed with)."""
        assert self.binary is not None
        return [np.frombuffer(tail[o : o + n], np.uint8) for o, n in self.binary]

    def spans(self) -> list[tuple[int, int, int]]:
        """Where ``buffers`` cuts the tail: (offset, bytes, the buffer's bytes) of each input."""
        assert self.binary is not None
        return [(o, n, n) for o, n in self.binary]

    @property
    def in_place(self) -> bool:
        return self.req.InPlace

    def output(self, result: Result) -> np.ndarray:
        """A binary answer's output bytes in ``result``'s slot; its JSON header and HTTP headers built the first time."""
        return np.frombuffer(self.output_view(result), np.uint8)

    def output_view(self, result: Result) -> memoryview:
        """``output`` as a memoryview (no numpy: the direct HTTP path copies it into its answer)."""
        out = result.output
        if self.head is None or self.frame_headers is None:
            self.head = dumps(_head(self.op, {"binary_data_size": out.nbytes}))
            self.frame_headers = frame_headers(len(self.head), len(self.head) + out.nbytes)
        return out


def repeated(state: Runtime, header_length: str, body: memoryview) -> tuple[Parsed, memoryview] | None:
    """A repeated binary frame answered in binary whose header was seen before, its output at most LARGE
    bytes: its parse and tensor bytes, for the direct HTTP path (service/http_direct.py; the caller
    checks the request carries no Content-Encoding). None for any other request, which ``execute``
    decides (every error included)."""
    try:
        max_tensor_bytes = ready_device(state.worker)["max_tensor_bytes"]
        raw, tail = frame_parts(body, header_length)
    except (VkactError, CodecError):
        return None
    cache: HeaderCache[Parsed] = state.v1_headers
    parsed = cache.get(cache.key(raw, len(tail), max_tensor_bytes)) if len(tail) else None
    if parsed is None or parsed.encoding is not Encoding.BINARY or parsed.op.output.total_bytes > LARGE:
        return None
    return parsed, tail


def parse_request(header: dict, tail: memoryview, max_tensor_bytes: int) -> tuple[Parsed, list[np.ndarray]]:
    """Every 4xx is decided here, before any device work."""
    req = ExecuteRequest.model_validate(header)
    try:
        op = parse_operator(req.Operator)
    except ValidationError as exc:
        raise descriptor_error(exc, ("Operator",)) from None
    if req.FeatureLevel is not None:
        op.check_feature_level(req.FeatureLevel)
    for name in req.Inputs:
        if name not in op.input_fields:
            raise DescriptorError(f"Inputs.{name}", f"{op.type_name()} has no input tensor {name!r}; its inputs are {', '.join(op.input_fields)}")
    for name in op.input_fields:
        if name not in req.Inputs:
            raise DescriptorError(f"Inputs.{name}", f"data for {name} is missing")
    op.check_execution(req.InPlace, max_tensor_bytes)
    _check_output_bounded(op)
    entries = [(f"Inputs.{name}", data) for name, data in req.Inputs.items()]  # binary bytes come in this order
    slices = binary_slices(entries, tail)
    dtype = op.data_type.info.numpy
    buffers = []
    for name, desc in zip(op.input_fields, op.inputs):
        field = f"Inputs.{name}"
        _check_covered(req.Inputs[name], desc, name)
        buffers.append(decode_data(req.Inputs[name], dtype, desc.total_bytes, desc.span_bytes(), field, slices.get(field), op.data_type.value))
    encoding = req.ResponseEncoding or (Encoding.BINARY if len(tail) or slices else encoding_of(entries[0][1], entries[0][0]))
    binary = None
    if len(slices) == len(entries):  # where binary_slices cut each input, in the descriptor's order
        where, offset = {}, 0
        for field, _ in entries:
            where[field] = (offset, len(slices[field]))
            offset += len(slices[field])
        binary = [where[f"Inputs.{name}"] for name in op.input_fields]
    return Parsed(req, op, descriptor_key(op), encoding, binary), buffers


def _check_covered(data: Any, desc: TensorDesc, name: str) -> None:
    """JSON values must fill the buffer the descriptor declares (up to its rounding to 4 bytes): a
    larger TotalTensorSizeInBytes would make the service compute and return bytes nobody sent.
    (Binary and base64 data must be exactly TotalTensorSizeInBytes long: decode_data checks that.)"""
    if not isinstance(data, list):
        return
    sent = len(data) * desc.DataType.info.size
    if sent >= desc.span_bytes() and -(-sent // 4) * 4 < desc.total_bytes:
        raise DescriptorError(
            f"Operator.{name}.TotalTensorSizeInBytes",
            f"TotalTensorSizeInBytes is {desc.total_bytes}, but the {len(data)} values sent for {name} fill {sent} bytes: "
            "send data for the whole buffer, or declare it smaller",
        )


def _check_output_bounded(op: OperatorDesc) -> None:
    """The output buffer may be declared larger than it needs (DirectML allows it) only as far as the
    data sent: up to the largest input buffer, which the inputs' data must fill."""
    largest_input = max(desc.total_bytes for desc in op.inputs)
    if op.output.total_bytes > max(op.output.min_bytes, largest_input):
        raise DescriptorError(
            f"{op.output_field}.TotalTensorSizeInBytes",
            f"{op.output_field} declares {op.output.total_bytes} bytes, more than it needs ({op.output.min_bytes}) "
            f"and than the largest input buffer ({largest_input}): an output may not be larger than the data sent",
        )


def parse_body(raw: memoryview, tail: memoryview, max_tensor_bytes: int, max_json_values: int, framed: bool) -> tuple[Parsed | GraphBody, list[np.ndarray]]:
    header = load_header(raw, max_json_values, framed)
    if "Graph" in header:  # the Graph form: v1/graphs.py reads it
        return GraphBody(header, tail, len(raw)), []
    parsed, buffers = parse_request(header, tail, max_tensor_bytes)
    if parsed.encoding is Encoding.JSON:
        check_answer_values(parsed.op.output.total_bytes // parsed.op.data_type.info.size, max_json_values,
                            "ResponseEncoding", "ask for binary or base64")
    return parsed, buffers


@router.post("/execute", summary="Run one DirectML activation operator, or a graph of them (DML_GRAPH_DESC), on the device")
@within_budget
async def execute(request: Request) -> Response:
    # The state is read directly, not through Depends: FastAPI's dependency solving is about a sixth
    # of this route's own time for a small request (measured in-process).
    started = time.perf_counter()
    state = runtime(request)
    worker = device_worker(request)
    limit = state.settings.max_body_bytes
    # Content-Encoding as /v2 takes it (gzip, deflate; 415 for others), not read as UTF-8 JSON
    body = await request_body(request, limit)
    header_length = request.headers.get(HEADER_LENGTH)
    raw, tail = frame_parts(body, header_length)
    max_tensor_bytes = ready_device(worker)["max_tensor_bytes"]
    cache: HeaderCache[Parsed] = state.v1_headers
    key = cache.key(raw, len(tail), max_tensor_bytes) if len(tail) else None
    parsed = cache.get(key)
    if parsed is not None:
        buffers = parsed.buffers(tail)
    else:
        args = (raw, tail, max_tensor_bytes, state.settings.max_json_values, header_length is not None)
        # A long JSON text (numbers, base64) is parsed and decoded in a thread, so probes and other
        # requests are answered meanwhile.
        parsed, buffers = await in_json_thread(parse_body, *args) if len(raw) > INLINE_BYTES else parse_body(*args)
        if isinstance(parsed, GraphBody):
            return await execute_graph(request, parsed, started)
        if parsed.binary is not None:
            cache.put(key, parsed)
    op = parsed.op
    count_against(request, op.type_name())  # failures from here on count against the operator

    result = await run_on_device(request, op, buffers, parsed.req.InPlace, parsed.key)
    if result is None:  # the client left
        return Response(status_code=499)
    out = None
    try:
        if parsed.encoding is Encoding.BINARY:
            out = parsed.output(result)
            assert parsed.head is not None and parsed.frame_headers is not None
            response: Response = FrameResponse(await binary_frame(parsed.head, [out]), parsed.frame_headers)
        else:
            out = np.frombuffer(result.output, np.uint8)
            # a large answer is written in a thread (its values as Python objects, or base64): the loop stays free
            args = (op, out, parsed.encoding)
            response = Response(await in_json_thread(_text, *args) if out.nbytes > INLINE_BYTES else _text(*args), media_type="application/json")
    finally:
        del out
        result.release()

    return answered(response, request, op, started, result, sum(b.nbytes for b in buffers), op.output.total_bytes)


def _text(op: OperatorDesc, out: np.ndarray, encoding: Encoding) -> bytes:
    """The JSON answer with the output as JSON numbers or base64."""
    return dumps(_head(op, encode_data(out, op.data_type.info.numpy, op.output.span_bytes(), encoding)))


def _head(op: OperatorDesc, output: Any) -> dict[str, Any]:
    return {"Operator": op.type_name(), "OutputTensor": op.output.model_dump(mode="json"), "Output": output}


@router.get("/operators", summary="The operator catalog")
async def operators(worker: WorkerDep) -> dict[str, Any]:
    return catalog(kernel_features(worker.info))


@router.get("/device", summary="The Vulkan device in use and its limits")
async def device(worker: WorkerDep, settings: SettingsDep) -> dict[str, Any]:
    info = device_report(worker)
    dev = info["device"]
    return {
        "name": dev["name"],
        "type": dev["type"],
        "cpu": dev["type"] == "cpu",
        "driver": {"name": dev["driver_name"], "info": dev["driver_info"]},
        "vulkan_api_version": dev["api_version"],
        "vendor_id": dev["vendor_id"],
        "device_id": dev["device_id"],
        "limits": {
            "max_workgroup_count": info["max_workgroup_count"],
            "max_buffer_bytes": dev["max_storage_buffer_range"],
            "max_tensor_bytes": info["max_tensor_bytes"],
            "max_push_constants_size": dev["max_push_constants_size"],
            "max_body_bytes": settings.max_body_bytes,
        },
        "memory": info["memory"],
        "workgroup_size": info["local_size"],
        "feature_level": IMPLEMENTED_LEVEL.value,
        # the device features the patched kp enabled, and those the kernels use (VKACT_NATIVE_64BIT)
        "features": {"enabled": info.get("features_enabled", []), "used_by_kernels": info.get("kernel_features", []),
                     "reported": dev.get("features", [])},
        # float widths whose NaN, Inf and -0 the kernels ask the device's compiler to keep (service/spirv_float_controls.py)
        "nan_preserving_widths": info.get("nan_preserving_widths", []),
        "data_types_64bit": _data_types(kernel_features(info)),
        "queue_size": settings.queue_size,
        "max_batch": worker.max_batch,
        "worker_restarts": worker.restarts,
        "pinned_cpu": info.get("pinned_cpu"),  # the event loop's and the job thread's CPU (VKACT_PIN_CPU)
        "small_dispatch_engine": info.get("small_dispatch_engine", False),  # llvmpipe: one-workgroup dispatches without its compute pool
        # a job from this many bytes runs on its request's shared-memory slot itself (engine_direct); None: never
        "slot_import_bytes": info.get("slot_import_bytes"),
    }


def _data_types(features: frozenset[str] | None) -> dict[str, Any]:
    """Per 64-bit data type: whether this device runs its native kernels, the feature they need, and
    the operators served by their emulated kernels there (the others refuse the type with a 422)."""
    out: dict[str, Any] = {}
    for t in DataType:
        if t.info.feature is None:
            continue
        native = features is not None and t.info.feature in features
        emulated = [] if native else [op.type_name() for op in OPERATORS.values() if t in op.emulated_types & op.accepted_types()]
        out[t.value] = {"native": native, "needs_feature": t.info.feature, "emulated_for": emulated}
    return out
