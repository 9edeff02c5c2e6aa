"""Graph execution, whichever front-end asked: the one place where a DML_GRAPH_DESC is parsed, compiled
and run (/v1's ``"Graph"``, and /v2's and gRPC's graph models alike).

A front-end hands it a graph (JSON-like data, or a GraphDesc it parsed) and the graph's inputs by their
input edges' names, each as the buffer its descriptor declares (TotalTensorSizeInBytes bytes) or a
shared-memory ``Source`` that writes them into the job's slot; it gets the outputs back by their output
edges' names. In between, everything that is not wire format:

- ``parse``: DirectML's rules (descriptors/graph.py), at most ``Settings.max_graph_nodes`` nodes; a
  422 whose field is a path from ``Graph``;
- ``compile_graph``: the plan (graph_compiler.py) compiled in a thread (glslang runs there), off the
  event loop; the compiler caches programs by structure, and this module the compiled graphs (plan
  and its bytes for the worker) by the whole graph, so a repeated graph is neither compiled nor pickled;
- ``check_inputs``: names (missing, unknown) and sizes, each error naming the input;
- ``run_graph``: the limits a graph must meet before any device work (per tensor, the device's binding
  limit; outputs no larger than the data sent; the buffer pool), then the job on the device worker
  under the request timeout, dropped if the client leaves while it is queued (execution.watched, as
  an operator's);
- ``record_graph_success``: vkact's series (``label``) and, for a graph model, Triton's per-model
  statistics, counted once;
- ``GraphReport``: whether it fused, its dispatches and why any part runs node by node.
"""
from __future__ import annotations

import asyncio
import pickle
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from .. import framing
from ..config import Settings
from ..descriptors.graph import GraphDesc, parse_graph
from ..descriptors.tensor import TensorDesc
from ..errors import DescriptorError, InvalidRequest, PayloadTooLarge, UnsupportedOnDevice
from ..graph_compiler import GraphCompiler
from ..graph_program import GraphPlan
from ..jobs import GraphResult, Source
from .execution import watched
from .readiness import ready_device

if TYPE_CHECKING:
    from ..api.runtime import Runtime

#: vkact's series (vkact_requests{operator=...}) of graphs run without a model name (/v1's "Graph").
GRAPH_LABEL = "graph"
#: Compiled graphs kept by their whole descriptor (scalars included), least recently used out.
COMPILED_GRAPHS = 64

Input = Union[np.ndarray, Source]


@dataclass(frozen=True)
class GraphReport:
    """How a graph runs: ``fused`` is False when some elementwise node runs with its own kernel for a
    reason ``notes`` gives (one per part); ``dispatches`` is the plan's dispatch count."""

    fused: bool
    dispatches: int
    nodes: int
    notes: tuple[str, ...]

    def parameters(self) -> dict[str, str]:
        """As string parameters (/v2's model metadata, gRPC's config): ``graph_fused`` etc."""
        return {"graph_fused": "true" if self.fused else "false", "graph_dispatches": str(self.dispatches),
                "graph_nodes": str(self.nodes), "graph_notes": "; ".join(self.notes)}


@dataclass(frozen=True, eq=False)
class CompiledGraph:
    """A graph with its plan: what a graph model keeps from its load, and /v1 from a repeated graph."""

    plan: GraphPlan
    storage_buffers: int | None = None   # the device's maxPerStageDescriptorStorageBuffers it was compiled for

    @property
    def graph(self) -> GraphDesc:
        return self.plan.graph

    @cached_property
    def key(self) -> bytes:
        """The plan pickled: how it crosses to the device worker, which keeps it unpickled by these bytes."""
        return pickle.dumps(self.plan, framing.PROTOCOL)

    @cached_property
    def input_names(self) -> tuple[str, ...]:
        return self.graph.input_names()

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return self.graph.output_names()

    @cached_property
    def inputs(self) -> dict[str, TensorDesc]:
        """Each graph input's descriptor by its name, in graph input index order."""
        return {name: self.graph.input_desc(i) for i, name in enumerate(self.input_names)}

    @cached_property
    def outputs(self) -> dict[str, TensorDesc]:
        """Each graph output's descriptor by its name, in graph output index order."""
        return {name: self.graph.output_desc(j) for j, name in enumerate(self.output_names)}

    @cached_property
    def report(self) -> GraphReport:
        return GraphReport(self.plan.fused, self.plan.dispatches, len(self.graph.Nodes), self.plan.notes)


@dataclass
class GraphAnswer:
    """A graph's answer: each output's buffer (TotalTensorSizeInBytes bytes, laid out as its descriptor
    says) by its output edge's name, inside the job's slot: valid until ``release()``."""

    compiled: CompiledGraph
    outputs: dict[str, memoryview]
    kernel_seconds: float       # the command buffer's (every dispatch of the plan)
    queue_seconds: float
    bytes_in: int
    bytes_out: int
    _result: GraphResult = field(repr=False)

    @property
    def report(self) -> GraphReport:
        return self.compiled.report

    def release(self) -> None:
        """Hand the slot back once the outputs have been read."""
        self.outputs.clear()
        self._result.release()


# -- parse and compile -----------------------------------------------------------------------------

def parse(data: Any, settings: Settings) -> GraphDesc:
    """A graph from JSON-like data: DescriptorError (422) with a field from ``Graph``, beyond
    ``settings.max_graph_nodes`` nodes included (checked before the nodes are parsed)."""
    if not isinstance(data, dict):
        raise DescriptorError("Graph", "a graph is a DML_GRAPH_DESC object (InputCount, OutputCount, Nodes, the edges)")
    return parse_graph(data, settings.max_graph_nodes)


class _Compiled:
    """One process's compiler per settings that shape code, and its compiled graphs by descriptor."""

    def __init__(self, settings: Settings) -> None:
        self.compiler = GraphCompiler(settings)
        self.graphs: OrderedDict[bytes, CompiledGraph] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, graph_key: bytes) -> CompiledGraph | None:
        with self.lock:
            found = self.graphs.get(graph_key)
            if found is not None:
                self.graphs.move_to_end(graph_key)
            return found

    def put(self, graph_key: bytes, compiled: CompiledGraph) -> None:
        with self.lock:
            self.graphs[graph_key] = compiled
            while len(self.graphs) > COMPILED_GRAPHS:
                self.graphs.popitem(last=False)


_compilers: dict[tuple, _Compiled] = {}
_compilers_lock = threading.Lock()


def _shared(settings: Settings) -> _Compiled:
    shape = (settings.glsl_dir, settings.glslang, settings.max_fused_shader_bytes, settings.graph_max_storage_buffers,
             settings.spirv_cache, settings.generated_shader_cache)
    with _compilers_lock:
        found = _compilers.get(shape)
        if found is None:
            found = _compilers[shape] = _Compiled(settings)
        return found


def compiler_for(settings: Settings) -> GraphCompiler:
    """The process's GraphCompiler for these settings (shared, so programs compile once whoever asks)."""
    return _shared(settings).compiler


def device_storage_buffers(info: Mapping[str, Any]) -> int | None:
    """The ready worker's report's maxPerStageDescriptorStorageBuffers (what a compiled graph's steps may bind)."""
    return info["device"].get("max_per_stage_storage_buffers")


def _compile(shared: _Compiled, graph: GraphDesc, graph_key: bytes, storage_buffers: int | None) -> CompiledGraph:
    compiled = CompiledGraph(shared.compiler.compile(graph, storage_buffers=storage_buffers), storage_buffers)
    compiled.key  # noqa: B018 - pickled here, in the thread, not on the event loop
    shared.put(graph_key, compiled)
    return compiled


async def compile_graph(settings: Settings, graph: GraphDesc, storage_buffers: int | None = None) -> CompiledGraph:
    """``graph`` compiled (the same object again for an equal graph compiled before) for a device that
    allows ``storage_buffers`` per shader (``device_storage_buffers``; None: not known yet, and
    GraphModels.find compiles a model again once for the device); a new structure compiles in a thread, off the
    event loop: glslang runs there."""
    shared = _shared(settings)
    graph.order  # noqa: B018 - a cached property, pickled once read: read it first, so equal graphs give equal bytes
    graph_key = pickle.dumps((storage_buffers, graph), framing.PROTOCOL)
    found = shared.get(graph_key)
    if found is not None:
        return found
    return await asyncio.to_thread(_compile, shared, graph, graph_key, storage_buffers)


# -- inputs and limits -----------------------------------------------------------------------------

def check_names(graph: GraphDesc, given: Iterable[str], field: str = "Inputs") -> None:
    """InvalidRequest (400) naming ``{field}.{name}`` for an input the graph does not have, or one it
    has that ``given`` lacks (a front-end may check names before it decodes any data)."""
    names = graph.input_names()
    given = list(given)
    for name in given:
        if name not in names:
            raise InvalidRequest(f"the graph has no input {name!r}; its inputs are {', '.join(names)}", f"{field}.{name}")
    for name in names:
        if name not in given:
            raise InvalidRequest(f"data for the graph input {name!r} is missing", f"{field}.{name}")


def check_inputs(compiled: CompiledGraph, inputs: Mapping[str, Input], field: str = "Inputs") -> list[Input]:
    """The inputs in graph input index order; InvalidRequest (400) naming ``{field}.{name}`` for an
    unknown or missing input (``check_names``), or one whose buffer is not its TotalTensorSizeInBytes."""
    check_names(compiled.graph, inputs, field)
    ordered = []
    for name, desc in compiled.inputs.items():
        data = inputs[name]
        if data.nbytes != desc.total_bytes:
            raise InvalidRequest(f"{data.nbytes} bytes for the graph input {name!r}; its TotalTensorSizeInBytes is {desc.total_bytes}", f"{field}.{name}")
        ordered.append(data)
    return ordered


def check_limits(graph: GraphDesc | CompiledGraph, max_tensor_bytes: int, pool_bytes: int) -> None:
    """What a graph must meet before any device work: every tensor within the device's binding limit
    (422), no node output declared larger than it needs and than its largest input (the first nodes'
    inputs are the data sent: an output may not be larger than that, as /v1's may not), and its tensors
    within the buffer pool (413)."""
    if isinstance(graph, CompiledGraph):
        graph = graph.graph
    total = sum(graph.input_desc(i).total_bytes for i in range(graph.InputCount))
    for n, op in enumerate(graph.operators):
        prefix = f"Graph.Nodes[{n}].Operator"
        try:
            op.check_execution(False, max_tensor_bytes)
        except UnsupportedOnDevice as exc:
            raise UnsupportedOnDevice(exc.message, f"{prefix}.{exc.field}") from None
        out, largest = op.output, max(d.total_bytes for d in op.inputs)
        if out.total_bytes > max(out.min_bytes, largest):
            raise DescriptorError(
                f"{prefix}.{op.output_field}.TotalTensorSizeInBytes",
                f"Nodes[{n}]'s {op.output_field} declares {out.total_bytes} bytes, more than it needs ({out.min_bytes}) "
                f"and than its largest input buffer ({largest})",
            )
        total += out.total_bytes
    if total > pool_bytes:
        raise PayloadTooLarge(f"the graph's tensors need {total} bytes of device memory; the buffer pool holds at most "
                              f"{pool_bytes} (VKACT_POOL_BYTES)", "Graph")


# -- running ---------------------------------------------------------------------------------------

async def run_graph(
    state: Runtime, compiled: CompiledGraph | GraphPlan, inputs: Mapping[str, Input], *, field: str = "Inputs",
    stats: Any = None, departure: Callable[[], Awaitable[object]] | None = None,
) -> GraphAnswer | None:
    """Run a compiled graph on ``inputs`` (by input edge name; see ``check_inputs``, whose errors name
    ``{field}.{name}``) on the device worker. The limits (``check_limits``; a front-end may check them
    before it decodes the inputs too) are checked first, then the inputs; then the job runs under the
    request timeout (Timeout, 504) and the client's departure, as an operator's (execution.watched).
    None means the client left while the job was queued (the caller answers 499; ``departure()``
    returns when it has gone); ``stats`` (a graph model's Triton statistics) then counts a failure.
    Busy (queue full) propagates."""
    worker = state.worker
    assert worker is not None
    info = ready_device(worker)
    if isinstance(compiled, GraphPlan):
        compiled = CompiledGraph(compiled)   # a plan given as it is (tests)
    elif compiled.storage_buffers != device_storage_buffers(info):   # looked up just before the device reported: GraphModels.find keeps the next one
        compiled = await compile_graph(state.settings, compiled.graph, device_storage_buffers(info))
    check_limits(compiled, info["max_tensor_bytes"], state.settings.pool_bytes)
    ordered = check_inputs(compiled, inputs, field)
    result = await watched(state, worker.run_graph(compiled.plan, ordered, compiled.key), ordered, departure, stats)
    if result is None:
        return None
    bytes_in = sum(b.nbytes for b in ordered)
    outputs = dict(zip(compiled.output_names, result.outputs))
    return GraphAnswer(compiled, outputs, result.kernel_seconds, result.queue_seconds, bytes_in, sum(v.nbytes for v in outputs.values()), result)


def record_graph_success(state: Runtime, started: float, answer: GraphAnswer, label: str = GRAPH_LABEL, stats: Any = None) -> None:
    """The bookkeeping of one answered graph, whichever protocol carried it: vkact's series under
    ``label``; with ``stats`` (a graph model's), Triton's success and its one execution."""
    metrics = state.metrics
    elapsed = time.perf_counter() - started
    metrics.operator(label).record(elapsed, answer.queue_seconds, answer.kernel_seconds, answer.bytes_in, answer.bytes_out)
    if stats is not None:
        metrics.triton.success(stats, elapsed, answer.queue_seconds, answer.kernel_seconds)
        metrics.triton.execution(stats, 1, answer.kernel_seconds)
