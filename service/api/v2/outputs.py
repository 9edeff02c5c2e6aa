"""The /v2 inference response: which outputs, and in which form (JSON data, binary after the JSON header,
or written into a shared memory region)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, NamedTuple

import numpy as np


from ...errors import InvalidRequest
from ...operators import OperatorDesc
from ...shared_memory import Region
from ...jobs import Result
from ..execution import binary_frame
from ...limits import INLINE_BYTES
from ..json_text import dumps, in_json_thread, json_values
from ...dataplane.metrics import MODEL_VERSION
from .codec import InferenceRequest
from ...dataplane.models import DML_TO_V2



@dataclass(frozen=True)
class OutputPlan:
    name: str
    binary: bool
    region: str | None = None
    offset: int = 0
    byte_size: int = 0
    field: str | None = None  # the request's field that names the region


def _flag(params: dict, key: str, default: bool, field: str) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be true or false", f"{field}.{key}")
    return value


def plan_outputs(op: OperatorDesc, req: InferenceRequest, region: Callable[[str], Region]) -> list[OutputPlan]:
    """The outputs to return (all of them when the request names none), checked before any device work,
    shared memory regions included: each must hold the whole output."""
    return plan_named_outputs({op.output_field: output_bytes(op)}, req, region)


def plan_named_outputs(sizes: dict[str, int], req: InferenceRequest, region: Callable[[str], Region]) -> list[OutputPlan]:
    """As plan_outputs, for a model whose outputs are ``sizes`` (name -> the protocol's bytes), in order."""
    binary = _flag(req.parameters or {}, "binary_data_output", False, "parameters")
    if not req.outputs:  # omitted (or empty, which tritonclient never sends): every output
        return [OutputPlan(name, binary) for name in sizes]
    plans: list[OutputPlan] = []
    for i, out in enumerate(req.outputs):
        field = f"outputs[{i}]"
        nbytes = sizes.get(out.name)
        if nbytes is None:
            raise InvalidRequest(f"unknown output {out.name!r}; the outputs are {', '.join(sizes)}", f"{field}.name")
        if any(p.name == out.name for p in plans):
            raise InvalidRequest(f"output {out.name!r} is requested twice", f"{field}.name")
        params = out.parameters or {}
        if "classification" in params:
            raise InvalidRequest("the classification extension is not supported", f"{field}.parameters.classification")
        name = params.get("shared_memory_region")
        if name is None:
            plans.append(OutputPlan(out.name, _flag(params, "binary_data", binary, f"{field}.parameters")))
            continue
        size, offset = params.get("shared_memory_byte_size"), params.get("shared_memory_offset", 0)
        for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidRequest(f"{key} must be a non-negative integer", f"{field}.parameters.{key}")
        if not isinstance(name, str):
            raise InvalidRequest("shared_memory_region must be a region name", f"{field}.parameters.shared_memory_region")
        memory = region(name)
        if offset + size > memory.nbytes:
            raise InvalidRequest(f"offset {offset} + byte size {size} runs past region {name!r} ({memory.nbytes} bytes)", field)
        if size < nbytes:
            raise InvalidRequest(f"shared_memory_byte_size {size} is smaller than output {out.name!r} ({nbytes} bytes)", field)
        plans.append(OutputPlan(out.name, False, name, offset, size, f"{field}.parameters.shared_memory_region"))
    return plans


def output_bytes(op: OperatorDesc) -> int:
    """The protocol's output size: its elements, without the descriptor's rounding to 4 bytes."""
    return prod(op.output.Sizes) * op.output.DataType.info.size


class OutputTensor(NamedTuple):  # a tuple: made for every gRPC answer, where a frozen dataclass costs ~1 us
    """An output's answer: its packed bytes (a view of the slot) and what the protocol says of them."""

    datatype: str
    shape: Sequence[int]
    dtype: np.dtype
    data: np.ndarray   # uint8, exactly the elements' bytes


async def encode_response(
    model: str, op: OperatorDesc, req: InferenceRequest, request_id: str | None, plans: list[OutputPlan], result: Result, region: Callable[[str], Region]
) -> tuple[bytes | memoryview, int | None]:
    """The response body and, when some output is binary, the JSON header's length. Reads the result's
    slot, so it runs before the result is released."""
    data = np.frombuffer(result.output, np.uint8, output_bytes(op))  # packed: the output descriptor is the inputs' layout
    tensor = OutputTensor(DML_TO_V2[op.output.DataType], list(op.output.Sizes), op.output.DataType.info.numpy, data)
    return await encode_outputs(model, request_id, plans, {plan.name: tensor for plan in plans}, region)


async def encode_outputs(model: str, request_id: str | None, plans: list[OutputPlan], tensors: dict[str, OutputTensor],
                         region: Callable[[str], Region]) -> tuple[bytes | memoryview, int | None]:
    """As encode_response, for each planned output of ``tensors`` (by name)."""
    outputs: list[dict[str, Any]] = []
    binaries: list[np.ndarray] = []
    json_bytes = 0
    for plan in plans:
        tensor = tensors[plan.name]
        data, nbytes = tensor.data, tensor.data.nbytes
        entry: dict[str, Any] = {"name": plan.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if plan.region is not None:
            # No parameters, as Triton answers: its C++ client (perf_analyzer) reads any output's
            # parameters as a binary tensor's and stops on the missing binary_data_size.
            await region(plan.region).write(plan.offset, data, plan.field)
        elif plan.binary:
            entry["parameters"] = {"binary_data_size": nbytes}
            binaries.append(data)
        else:  # non-finite values as "NaN", "Infinity", "-Infinity", as /v1 writes them: plain JSON stays valid
            entry["data"] = await in_json_thread(json_values, data, tensor.dtype) if nbytes > INLINE_BYTES else json_values(data, tensor.dtype)
            json_bytes += nbytes
        outputs.append(entry)
    head: dict[str, Any] = {"model_name": model, "model_version": MODEL_VERSION}
    if request_id is not None:
        head["id"] = request_id
    head["outputs"] = outputs
    large_text = json_bytes > INLINE_BYTES
    head_bytes = await in_json_thread(dumps, head) if large_text else dumps(head)  # large: off the loop
    if not binaries:
        return head_bytes, None
    return await binary_frame(head_bytes, binaries), len(head_bytes)
