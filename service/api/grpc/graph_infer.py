"""gRPC's ModelInfer of a graph model: the protobuf request becomes /v2's InferenceRequest (grpc.infer),
takes /v2's checks of a graph model's inputs and outputs (v2.graph_infer), runs through the data plane
(dataplane.graphs.run_graph) and is answered with one raw_output_contents entry per requested output,
in the request's order (empty for one written to shared memory), as Triton answers."""
from __future__ import annotations

from typing import Any

from ...dataplane import graphs, ready_device
from ...dataplane.graph_models import GraphModel
from ...dataplane.metrics import MODEL_VERSION
from ..runtime import Runtime
from ..v2.codec import decode_tensors
from ..v2.graph_infer import answered_tensors, check_request_inputs, plan_graph_outputs
from ..v2.routes import Regions
from .infer import inference_request, raw_outputs, serialized
from .messages import pb


async def graph_model_infer(state: Runtime, model: GraphModel, msg: Any, started: float) -> bytes:
    ready_device(state.worker)
    req, tail = inference_request(msg, list(msg.raw_input_contents), msg.id, state.settings.max_json_values)
    check_request_inputs(model, req)
    with Regions(state.shared_memory) as region:
        buffers = await decode_tensors(model.compiled.inputs, req, tail, region)
        plans = plan_graph_outputs(model, req, region)
        answer = await graphs.run_graph(state, model.compiled, buffers, field="inputs", stats=model.stats)
        del buffers
        assert answer is not None  # no departure watch: the transport cancels this task when the client leaves
        try:
            head = pb.ModelInferResponse(model_name=msg.model_name, model_version=MODEL_VERSION, id=msg.id)
            response = serialized(head, await raw_outputs(head, plans, answered_tensors(model, answer.outputs, plans), region))
            graphs.record_graph_success(state, started, answer, stats=model.stats)
        finally:
            answer.release()
    return response
