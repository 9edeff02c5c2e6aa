"""/v2 inference of a graph model (dataplane.graph_models): the request's tensors are the graph's inputs,
named by its input edges, each of exactly its descriptor's datatype and shape, in any of /v2's forms
(JSON data, binary after the header, a raw binary body for a one-input graph, system shared memory);
the answer holds the requested outputs (every output when none is named), named by the output edges,
in the forms asked for. The graph runs through the data plane (dataplane.graphs.run_graph), which
checks the device's limits and counts the graph model's statistics; gRPC's ModelInfer of a graph
model takes the same checks (grpc.graph_infer)."""
from __future__ import annotations

import time

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH

from ...dataplane import graphs, ready_device
from ...dataplane.graph_models import GraphModel, GraphTensor
from ...errors import InvalidRequest
from ...limits import INLINE_BYTES
from ..execution import count_against, departure, request_body, within_budget
from ..json_text import check_answer_values, in_json_thread
from ..runtime import runtime
from .codec import RESERVED, InferenceRequest, RequestInput, decode_tensors, json_length, json_tensor_input, parse_frame
from .encoding import choose_encoding, compress
from .outputs import OutputPlan, OutputTensor, encode_outputs, plan_named_outputs
from .routes import Regions


def check_request_inputs(model: GraphModel, req: InferenceRequest) -> None:
    """Every input of the graph given once, by its edge's name, with its datatype and shape (a graph's
    tensors are fixed: its descriptors), and no operator parameter (a graph's scalars are in the graph:
    one sent would be ignored, a wrong answer in the making); 400 naming the request's field."""
    for key, value in (req.parameters or {}).items():
        protocol = key in RESERVED or key.startswith("triton_") or key.startswith("vkact_") or (key == "sequence_id" and value in (0, ""))
        if not protocol:
            raise InvalidRequest(f"graph model {model.name!r} takes no parameter {key!r}: its nodes' fields are in the graph "
                                 "(load it again to change them)", f"parameters.{key}")
    specs = {t.name: t for t in model.inputs}
    seen: set[str] = set()
    for i, tensor in enumerate(req.inputs):
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidRequest(f"unexpected input {tensor.name!r}; graph model {model.name!r} takes {', '.join(specs)}", f"inputs[{i}].name")
        if tensor.name in seen:
            raise InvalidRequest(f"input {tensor.name!r} is given twice", f"inputs[{i}].name")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidRequest(f"input {tensor.name!r} is {tensor.datatype}; graph model {model.name!r} takes {spec.datatype}", f"inputs[{i}].datatype")
        if tensor.shape != spec.shape:
            raise InvalidRequest(f"unexpected shape for input {tensor.name!r} of graph model {model.name!r}: expected {spec.shape}, got {tensor.shape}",
                                 f"inputs[{i}].shape")
    for name in specs:
        if name not in seen:
            raise InvalidRequest(f"input {name!r} is missing", "inputs")


def plan_graph_outputs(model: GraphModel, req: InferenceRequest, region) -> list[OutputPlan]:
    return plan_named_outputs({t.name: t.nbytes for t in model.outputs}, req, region)


def answered_tensors(model: GraphModel, outputs: dict[str, memoryview], plans: list[OutputPlan]) -> dict[str, OutputTensor]:
    """Each planned output with its packed bytes (a view of the slot: read before the answer's release)."""
    specs = {t.name: t for t in model.outputs}
    return {p.name: _answered(specs[p.name], outputs[p.name]) for p in plans}


def _answered(spec: GraphTensor, buffer: memoryview) -> OutputTensor:
    return OutputTensor(spec.datatype, spec.shape, spec.desc.DataType.info.numpy, np.frombuffer(buffer, np.uint8, spec.nbytes))


def _parse(body: memoryview, header_length: str | None, model: GraphModel, max_json_values: int) -> tuple[InferenceRequest, memoryview]:
    """The envelope and the bytes after it; a raw binary body (Inference-Header-Content-Length 0) is a
    one-input graph's input, binary outputs."""
    try:
        raw_binary = header_length is not None and int(header_length) == 0
    except ValueError:
        raw_binary = False  # parse_frame names the bad header
    if not raw_binary:
        return parse_frame(body, header_length, None, max_json_values)  # type: ignore[arg-type] # a model only for a raw body
    if len(model.inputs) != 1:
        raise InvalidRequest(f"a raw binary request needs a model with one input; graph model {model.name!r} has {len(model.inputs)}", HEADER_LENGTH)
    spec = model.inputs[0]
    raw = RequestInput(name=spec.name, shape=spec.shape, datatype=spec.datatype, parameters={"binary_data_size": len(body)})
    return InferenceRequest(inputs=[raw], parameters={"binary_data_output": True}), body


def _json_inputs(model: GraphModel, req: InferenceRequest) -> dict[str, np.ndarray]:
    descs = model.compiled.inputs
    return {t.name: json_tensor_input(descs[t.name], t, i) for i, t in enumerate(req.inputs) if t.data is not None}


@within_budget
async def infer_graph(request: Request, model: GraphModel) -> Response:
    started = time.perf_counter()
    count_against(request, model.label)  # failures from here on count against the graph model
    state = runtime(request)
    ready_device(state.worker)
    body = await request_body(request, state.settings.max_body_bytes)
    header_length = request.headers.get(HEADER_LENGTH)
    large = json_length(body, header_length) > INLINE_BYTES  # parsed and decoded in a thread: the loop stays free
    args = (body, header_length, model, state.settings.max_json_values)
    req, tail = await in_json_thread(_parse, *args) if large else _parse(*args)
    check_request_inputs(model, req)
    request_id = req.id if req.id is not None else getattr(request.state, "client_request_id", None)
    with Regions(state.shared_memory) as region:
        decoded = await in_json_thread(_json_inputs, model, req) if large else None
        buffers = await decode_tensors(model.compiled.inputs, req, tail, region, decoded)
        plans = plan_graph_outputs(model, req, region)
        sizes = {t.name: t.nbytes // t.desc.DataType.info.size for t in model.outputs}
        check_answer_values(sum(sizes[p.name] for p in plans if not p.binary and p.region is None), state.settings.max_json_values,
                            "outputs", "ask for binary_data_output")
        answer = await graphs.run_graph(state, model.compiled, buffers, field="inputs", stats=model.stats, departure=departure(request))
        del buffers
        if answer is None:  # the client left
            return Response(status_code=499)
        try:
            tensors = answered_tensors(model, answer.outputs, plans)
            content, header_length = await encode_outputs(model.name, request_id, plans, tensors, region)
            del tensors
            graphs.record_graph_success(state, started, answer, stats=model.stats)
        finally:
            answer.release()
    headers = {"Vary": "Accept-Encoding"}
    media_type = "application/json"
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)
        media_type = BINARY_CONTENT_TYPE
    coding = choose_encoding(request.headers.get("accept-encoding"))
    if coding is not None:
        content = await compress(content, coding)
        headers["Content-Encoding"] = coding
    return Response(content, media_type=media_type, headers=headers)
