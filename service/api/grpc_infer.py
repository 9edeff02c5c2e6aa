"""gRPC's ModelInfer on /v2's path: the protobuf request becomes /v2's InferenceRequest (raw inputs as
binary tensors after it, typed contents as JSON data), then the same functions decide everything
(v2_codec.build_operator and decode_inputs, v2_outputs.plan_outputs, execution.execute) and the
answer carries one raw_output_contents entry per output, as Triton answers (empty for an output
written to shared memory)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidRequest, NotReady
from ..operators import OperatorDesc
from ..worker import copy_into
from .execution import execute, record_success
from .grpc_messages import pb
from .metrics import MODEL_VERSION
from .runtime import Runtime
from .v2 import Regions
from .v2_codec import InferenceRequest, build_operator, decode_inputs, envelope
from .v2_models import DML_TO_V2
from .v2_outputs import output_bytes, plan_outputs

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


def inference_request(msg: Any) -> tuple[InferenceRequest, memoryview]:
    """/v2's request and the bytes its binary inputs point into. Raw entries go, in order, to the inputs
    not read from shared memory (as Triton consumes them); no input may then carry typed contents."""
    raw = msg.raw_input_contents
    inputs: list[dict[str, Any]] = []
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
            entry["data"] = list(getattr(tensor.contents, field))
        entry["parameters"] = params or None
        inputs.append(entry)
    if len(chunks) != len(raw):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries; {len(chunks)} inputs take one", "raw_input_contents")
    outputs = [{"name": out.name, "parameters": parameters(out.parameters)} for out in msg.outputs]
    req = envelope({"id": msg.id or None, "parameters": parameters(msg.parameters), "inputs": inputs, "outputs": outputs or None})
    return req, memoryview(chunks[0] if len(chunks) == 1 else b"".join(chunks))


async def model_infer(state: Runtime, model: type[OperatorDesc], msg: Any, started: float) -> Any:
    worker = state.worker
    if worker is None or not worker.ready or worker.info is None:
        raise NotReady("the device is not ready yet")
    req, tail = inference_request(msg)
    op = build_operator(model, req, worker.info["max_tensor_bytes"])
    with Regions(state.shared_memory) as region:
        buffers = decode_inputs(op, req, tail, region)
        plans = plan_outputs(op, req, region)
        bytes_in = sum(b.nbytes for b in buffers)
        result = await execute(state, op, buffers)
        del buffers
        assert result is not None  # no departure watch: grpcio cancels this task when the client leaves
        try:
            nbytes = output_bytes(op)
            data = np.frombuffer(result.output, np.uint8, nbytes)
            response = pb.ModelInferResponse(model_name=msg.model_name, model_version=MODEL_VERSION, id=msg.id)
            for plan in plans:
                response.outputs.add(name=plan.name, datatype=DML_TO_V2[op.output.DataType], shape=op.output.Sizes)
                if plan.region is not None:
                    await copy_into(region(plan.region)[plan.offset : plan.offset + nbytes], data)
                    response.raw_output_contents.append(b"")
                else:
                    response.raw_output_contents.append(data.tobytes())
            del data
        finally:
            result.release()
    record_success(state, op, started, result, bytes_in, op.output.total_bytes)
    return response
