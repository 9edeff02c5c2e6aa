"""/v1: execute one operator, the operator catalog, the device report."""
from __future__ import annotations

import json
import time
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError

from client.codec import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    Encoding,
    binary_slices,
    decode_data,
    encode_data,
    encoding_of,
    split_frame,
)

from ..config import Settings
from ..descriptors import IMPLEMENTED_LEVEL
from ..descriptors import FeatureLevel as Level
from ..errors import DescriptorError, NotReady
from ..operators import OperatorDesc, descriptor_error, parse_operator
from ..worker import DeviceWorker
from .catalog import catalog
from .execution import binary_frame, read_body, record_success, run_on_device

router = APIRouter(prefix="/v1", tags=["v1"])


# async: FastAPI runs a plain def dependency in its thread pool, two thread hops per request.
async def _worker(request: Request) -> DeviceWorker:
    return request.app.state.worker


async def _settings(request: Request) -> Settings:
    return request.app.state.settings


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


def parse_request(header: dict, tail: memoryview, max_tensor_bytes: int) -> tuple[ExecuteRequest, OperatorDesc, list, Encoding]:
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
    entries = [(f"Inputs.{name}", data) for name, data in req.Inputs.items()]
    slices = binary_slices(entries, tail)
    dtype = op.data_type.info.numpy
    buffers = []
    for name, desc in zip(op.input_fields, op.inputs):
        field = f"Inputs.{name}"
        buffers.append(decode_data(req.Inputs[name], dtype, desc.total_bytes, desc.span_bytes(), field, slices.get(field)))
    encoding = req.ResponseEncoding or (Encoding.BINARY if len(tail) or slices else encoding_of(entries[0][1], entries[0][0]))
    return req, op, buffers, encoding


@router.post("/execute", summary="Run one DirectML activation operator on the device")
async def execute(request: Request) -> Response:
    # The state is read directly, not through Depends: FastAPI's dependency solving is about a sixth
    # of this route's own time for a small request (measured in-process).
    started = time.perf_counter()
    worker: DeviceWorker = request.app.state.worker
    settings: Settings = request.app.state.settings
    body = await read_body(request, settings.max_body_bytes)
    header, tail = split_frame(body, request.headers.get(HEADER_LENGTH))
    if not worker.ready or worker.info is None:
        raise NotReady("the device is not ready yet")
    req, op, buffers, encoding = parse_request(header, tail, worker.info["max_tensor_bytes"])
    name = request.state.operator = op.type_name()

    result = await run_on_device(request, op, buffers, req.InPlace)
    if result is None:  # the client left
        return Response(status_code=499)
    try:
        out = np.frombuffer(result.output, np.uint8)
        head = {
            "Operator": name,
            "OutputTensor": op.output.model_dump(mode="json"),
            "Output": encode_data(out, op.data_type.info.numpy, op.output.span_bytes(), encoding),
        }
        if encoding is Encoding.BINARY:
            head_bytes = json.dumps(head, separators=(",", ":")).encode()
            response: Response = Response(
                await binary_frame(head_bytes, [out]), media_type=BINARY_CONTENT_TYPE, headers={HEADER_LENGTH: str(len(head_bytes))}
            )
        else:
            response = JSONResponse(head)
    finally:
        del out
        result.release()

    record_success(request, op, started, result, sum(b.nbytes for b in buffers), op.output.total_bytes)
    return response


@router.get("/operators", summary="The operator catalog")
async def operators() -> dict[str, Any]:
    return catalog()


@router.get("/device", summary="The Vulkan device in use and its limits")
async def device(worker: WorkerDep, settings: SettingsDep) -> dict[str, Any]:
    if worker.info is None:
        raise NotReady("the device is not ready yet")
    info = worker.info
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
        "queue_size": settings.queue_size,
        "worker_restarts": worker.restarts,
    }
