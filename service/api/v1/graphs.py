"""/v1/execute's Graph form: ``"Graph": {<DML_GRAPH_DESC>}`` in place of ``"Operator"``, ``Inputs`` keyed by
the input edges' names, and an answer whose ``Outputs`` are keyed by the output edges' names, each in the
request's encoding as ``Output`` is for one operator; ``Compiled`` says how the graph ran (fused, its
dispatches, and why any part runs node by node). The wire format only: parsing, limits, compilation,
the device and the bookkeeping are the data plane's (service/dataplane/graphs.py).

A binary answer's JSON header lists ``Outputs`` in graph output order, each ``{"binary_data_size": n}``;
their bytes follow in that order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from client.codec import Encoding, binary_slices, decode_data, encode_data, encoding_of

from ...config import Settings
from ...dataplane import graphs, ready_device
from ...descriptors import FeatureLevel as Level
from ...descriptors import TensorDesc
from ...errors import DescriptorError
from ...limits import INLINE_BYTES
from ..execution import FrameResponse, binary_frame, count_against, departure, frame_headers
from ..json_text import check_answer_values, dumps, in_json_thread
from ..runtime import runtime


class ExecuteGraphRequest(BaseModel):
    """The envelope of POST /v1/execute with a graph (see client.codec for the data encodings)."""

    model_config = ConfigDict(extra="forbid")

    Graph: dict[str, Any]
    Inputs: dict[str, Any]
    FeatureLevel: Level | None = None
    ResponseEncoding: Encoding | None = None


@dataclass
class GraphBody:
    """A /v1/execute body whose header holds a Graph: parsed by this module, not by routes.parse_request."""

    header: dict
    tail: memoryview
    text_bytes: int   # the JSON header's length: a long one is parsed and decoded in a JSON thread


@dataclass
class _Decided:
    graph: Any                      # GraphDesc
    buffers: dict[str, np.ndarray]  # by input name
    encoding: Encoding


def _decide(body: GraphBody, settings: Settings, max_tensor_bytes: int) -> _Decided:
    """Every 4xx, before any device work: the graph (422 naming its field), its limits, the inputs' names
    and data (each error naming ``Inputs.<name>``), and the answer's size as JSON."""
    if "Operator" in body.header:
        raise DescriptorError("Graph", "give Operator (one operator) or Graph (a DML_GRAPH_DESC), not both")
    req = ExecuteGraphRequest.model_validate(body.header)
    graph = graphs.parse(req.Graph, settings)
    if req.FeatureLevel is not None:
        for n, op in enumerate(graph.operators):
            try:
                op.check_feature_level(req.FeatureLevel)
            except DescriptorError as exc:
                raise DescriptorError(f"Graph.Nodes[{n}].Operator.{exc.field}" if exc.field != "FeatureLevel" else "FeatureLevel",
                                      f"Nodes[{n}]: {exc.message}") from None
    graphs.check_limits(graph, max_tensor_bytes, settings.pool_bytes)
    graphs.check_names(graph, req.Inputs)
    names = graph.input_names()
    entries = [(f"Inputs.{name}", data) for name, data in req.Inputs.items()]   # binary bytes come in this order
    slices = binary_slices(entries, body.tail)
    buffers = {}
    for i, name in enumerate(names):
        desc, field, data = graph.input_desc(i), f"Inputs.{name}", req.Inputs[name]
        _check_covered(data, desc, field)
        buffers[name] = decode_data(data, desc.DataType.info.numpy, desc.total_bytes, desc.span_bytes(), field, slices.get(field), desc.DataType.value)
    encoding = req.ResponseEncoding or (Encoding.BINARY if len(body.tail) or slices else encoding_of(entries[0][1], entries[0][0]))
    if encoding is Encoding.JSON:
        count = sum(graph.output_desc(j).total_bytes // graph.output_desc(j).DataType.info.size for j in range(graph.OutputCount))
        check_answer_values(count, settings.max_json_values, "ResponseEncoding", "ask for binary or base64")
    return _Decided(graph, buffers, encoding)


def _check_covered(data: Any, desc: TensorDesc, field: str) -> None:
    """JSON values must fill the buffer the descriptor declares (up to its rounding to 4 bytes), as for
    one operator: else the service would compute and return bytes nobody sent."""
    if not isinstance(data, list):
        return
    sent = len(data) * desc.DataType.info.size
    if sent >= desc.span_bytes() and -(-sent // 4) * 4 < desc.total_bytes:
        raise DescriptorError(field, f"the input's TotalTensorSizeInBytes is {desc.total_bytes}, but the {len(data)} values sent fill "
                              f"{sent} bytes: send data for the whole buffer, or declare it smaller")


async def execute_graph(request: Request, body: GraphBody, started: float) -> Response:
    """POST /v1/execute with a Graph (routes.execute hands it over once the header is read)."""
    state = runtime(request)
    count_against(request, graphs.GRAPH_LABEL)  # failures from here on count against graphs
    assert state.worker is not None
    info = ready_device(state.worker)
    args = (body, state.settings, info["max_tensor_bytes"])
    decided = await in_json_thread(_decide, *args) if body.text_bytes > INLINE_BYTES else _decide(*args)
    compiled = await graphs.compile_graph(state.settings, decided.graph, graphs.device_storage_buffers(info))
    answer = await graphs.run_graph(state, compiled, decided.buffers, departure=departure(request))
    if answer is None:  # the client left
        return Response(status_code=499)
    try:
        outputs = {name: np.frombuffer(view, np.uint8) for name, view in answer.outputs.items()}
        if decided.encoding is Encoding.BINARY:
            head = dumps(_head(compiled, {name: {"binary_data_size": out.nbytes} for name, out in outputs.items()}))
            frame = await binary_frame(head, list(outputs.values()))
            response: Response = FrameResponse(frame, frame_headers(len(head), len(frame)))
        else:
            text_args = (compiled, outputs, decided.encoding)
            size = sum(out.nbytes for out in outputs.values())
            response = Response(await in_json_thread(_text, *text_args) if size > INLINE_BYTES else _text(*text_args), media_type="application/json")
    finally:
        outputs = {}
        answer.release()
    response.background = _Record(request, started, answer)  # type: ignore[assignment]
    return response


def _text(compiled: graphs.CompiledGraph, outputs: dict[str, np.ndarray], encoding: Encoding) -> bytes:
    data = {}
    for name, out in outputs.items():
        desc = compiled.outputs[name]
        data[name] = encode_data(out, desc.DataType.info.numpy, desc.span_bytes(), encoding)
    return dumps(_head(compiled, data))


def _head(compiled: graphs.CompiledGraph, outputs: dict[str, Any]) -> dict[str, Any]:
    report = compiled.report
    return {
        "Compiled": {"Fused": report.fused, "Dispatches": report.dispatches, "Nodes": report.nodes, "Notes": list(report.notes)},
        "OutputTensors": {name: desc.model_dump(mode="json") for name, desc in compiled.outputs.items()},
        "Outputs": outputs,
    }


class _Record:
    """The answer's bookkeeping, once it has been sent (Starlette awaits a response's background)."""

    __slots__ = ("args",)

    def __init__(self, *args: Any) -> None:
        self.args = args

    async def __call__(self) -> None:
        request, started, answer = self.args
        graphs.record_graph_success(runtime(request), started, answer)

