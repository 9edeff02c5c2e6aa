"""gRPC's ModelInfer on /v2's path: the protobuf request becomes /v2's InferenceRequest (raw inputs as
binary tensors after it, typed contents as JSON data), then the same functions decide everything
(v2.codec.build_operator and decode_inputs, v2.outputs.plan_outputs, execution.execute) and the
answer carries one raw_output_contents entry per output, as Triton answers (empty for an output
written to shared memory).

A serving client repeats one request with new tensor bytes: what the request decides without its raw
bytes and id (the descriptor, its pickled form that lets the device worker replay the job, the output
plan) is kept by those fields' serialized bytes (Runtime.grpc_requests, as /v2 keeps binary headers),
for requests whose inputs are all raw and that use no shared memory."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from ...dataplane import descriptor_key, ready_device
from ...errors import InvalidRequest, PayloadTooLarge
from ...operators import OperatorDesc
from ...shared_memory import Region
from ...dataplane.execution import execute, record_success
from .messages import pb
from ..header_cache import HeaderCache
from ...dataplane.metrics import MODEL_VERSION
from ..runtime import Runtime
from ..v2.routes import Regions
from ..v2.codec import InferenceRequest, build_operator, decode_inputs, envelope, padded
from ...dataplane.models import DML_TO_V2
from ..v2.outputs import OutputPlan, OutputTensor, output_bytes, plan_outputs

#: InferTensorContents' field for each datatype; FP16 and BF16 travel as raw bytes only.
CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def parameters(params: Any) -> dict[str, Any] | None:
    """A map<string, InferParameter> as /v2's JSON parameters (bool, int, str or float values)."""
    out = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, kind) if kind is not None else None
    return out or None


def inference_request(msg: Any, raw: list[bytes], request_id: str, max_values: int) -> tuple[InferenceRequest, memoryview]:
    """/v2's request and the bytes its binary inputs point into. Raw entries go, in order, to the inputs
    not read from shared memory (as Triton consumes them); no input may then carry typed contents.
    Typed contents are values as JSON's are, bounded alike (VKACT_MAX_JSON_VALUES), counted before
    each becomes a Python object."""
    inputs: list[dict[str, Any]] = []
    values = 0
    chunks: list[bytes] = []
    for i, tensor in enumerate(msg.inputs):
        params = parameters(tensor.parameters) or {}
        entry: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.shape), "datatype": tensor.datatype}
        if "shared_memory_region" in params:
            pass
        elif raw:
            if tensor.HasField("contents"):
                raise InvalidRequest("contents must be empty when raw_input_contents is used", f"inputs[{i}].contents")
            if len(chunks) == len(raw):
                raise InvalidRequest(f"raw_input_contents has {len(raw)} entries, fewer than the inputs that need one", "raw_input_contents")
            chunks.append(raw[len(chunks)])
            params["binary_data_size"] = len(chunks[-1])
        elif tensor.HasField("contents"):
            field = CONTENTS.get(tensor.datatype)
            if field is None:
                raise InvalidRequest(f"{tensor.datatype} tensors travel in raw_input_contents only", f"inputs[{i}].contents")
            contents = getattr(tensor.contents, field)
            values += len(contents)
            if values > max_values:
                raise PayloadTooLarge(f"the request's typed contents hold more than {max_values} values (VKACT_MAX_JSON_VALUES); "
                                      "send large tensors in raw_input_contents", f"inputs[{i}].contents")
            entry["data"] = list(contents)
        entry["parameters"] = params or None
        inputs.append(entry)
    if len(chunks) != len(raw):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries; {len(chunks)} inputs take one", "raw_input_contents")
    outputs = [{"name": out.name, "parameters": parameters(out.parameters)} for out in msg.outputs]
    req = envelope({"id": request_id or None, "parameters": parameters(msg.parameters), "inputs": inputs, "outputs": outputs or None})
    return req, memoryview(chunks[0] if len(chunks) == 1 else b"".join(chunks))


@dataclass
class _Decided:
    """What a repeated all-raw request without shared memory decides (see the module's docstring)."""

    op: OperatorDesc
    key: bytes                  # descriptor_key(op)
    plans: list[OutputPlan]
    sizes: list[int]            # each raw entry's byte count, in descriptor order
    order: list[int]            # for each descriptor input, its raw entry

    @staticmethod
    def of(req: InferenceRequest, op: OperatorDesc, plans: list[OutputPlan]) -> _Decided | None:
        if any(p.region is not None for p in plans) or any(t.data is not None or "shared_memory_region" in (t.parameters or {}) for t in req.inputs):
            return None
        position = {t.name: i for i, t in enumerate(req.inputs)}
        order = [position[name] for name in op.input_fields]
        sizes = [prod(desc.Sizes) * desc.DataType.info.size for desc in op.inputs]
        return _Decided(op, descriptor_key(op), plans, sizes, order)

    def buffers(self, raw: list[bytes]) -> list[np.ndarray] | None:
        """The inputs' buffers, or None when the entries' sizes differ from the shapes (then the whole
        request is decided afresh, which names the error)."""
        if len(raw) != len(self.order) or any(len(raw[i]) != n for i, n in zip(self.order, self.sizes)):
            return None
        return [padded(memoryview(raw[i]), desc.total_bytes) for i, desc in zip(self.order, self.op.inputs)]


async def model_infer(state: Runtime, model: type[OperatorDesc], msg: Any, started: float) -> Any:
    max_tensor_bytes = ready_device(state.worker)["max_tensor_bytes"]
    raw, request_id = list(msg.raw_input_contents), msg.id
    cache: HeaderCache[_Decided] = state.grpc_requests
    key = decided = buffers = None
    if raw:
        msg.ClearField("raw_input_contents")
        msg.id = ""
        key = cache.key(msg.SerializeToString(deterministic=True), max_tensor_bytes)
        decided = cache.get(key)
        buffers = decided.buffers(raw) if decided is not None else None
    with Regions(state.shared_memory) as region:
        if decided is not None and buffers is not None:
            op, plans = decided.op, decided.plans
        else:
            req, tail = inference_request(msg, raw, request_id, state.settings.max_json_values)
            op = build_operator(model, req, max_tensor_bytes)
            buffers = await decode_inputs(op, req, tail, region)
            plans = plan_outputs(op, req, region)
            if key is not None and (decided := _Decided.of(req, op, plans)) is not None:
                cache.put(key, decided)
        bytes_in = sum(b.nbytes for b in buffers)
        result = await execute(state, op, buffers, key=decided.key if decided is not None else None)
        del buffers
        assert result is not None  # no departure watch: grpcio cancels this task when the client leaves
        try:
            nbytes = output_bytes(op)
            data = np.frombuffer(result.output, np.uint8, nbytes)
            head = pb.ModelInferResponse(model_name=msg.model_name, model_version=MODEL_VERSION, id=request_id)
            raws: list[bytes | memoryview] = []
            for plan in plans:  # inline, not raw_outputs: ~2.6 us less a request on this path (measured)
                head.outputs.add(name=plan.name, datatype=DML_TO_V2[op.output.DataType], shape=op.output.Sizes)
                if plan.region is not None:
                    await region(plan.region).write(plan.offset, data, plan.field)
                    raws.append(b"")
                else:
                    raws.append(data.data)
            response = serialized(head, raws)
            del data, raws
        finally:
            result.release()
    record_success(state, op, started, result, bytes_in, op.output.total_bytes)
    return response


async def raw_outputs(head: Any, plans: list[OutputPlan], tensors: Mapping[str, OutputTensor], region: Callable[[str], Region]) -> list[bytes | memoryview]:
    """Each planned output described in ``head`` (a ModelInferResponse) and its raw_output_contents entry,
    in the plans' order: its bytes, or none when it was written into a shared memory region. (An
    operator model's answer, one output, does this inline: see model_infer.)"""
    raws: list[bytes | memoryview] = []
    for plan in plans:
        tensor = tensors[plan.name]
        head.outputs.add(name=plan.name, datatype=tensor.datatype, shape=tensor.shape)
        if plan.region is not None:
            await region(plan.region).write(plan.offset, tensor.data, plan.field)
            raws.append(b"")
        else:
            raws.append(tensor.data.data)
    return raws


def serialized(head: Any, raw_outputs: list[bytes | memoryview]) -> bytes:
    """ModelInferResponse's wire bytes: ``head`` (no raw contents) followed by each raw_output_contents
    entry (field 6, length-delimited), the output copied once, straight from the slot. Protobuf would
    copy it three times (into bytes, into the message, into its serialization: ~30 ms for 16 MiB)."""
    parts: list[bytes | memoryview] = [head.SerializeToString()]
    for raw in raw_outputs:
        parts += [RAW_OUTPUT_TAG, _varint(len(raw)), raw]
    return b"".join(parts)


RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents = 6, wire type 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)
