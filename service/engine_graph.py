"""Running a compiled graph (service/graph_program.py, made by graph_compiler.py) on the engine: every
step's dispatch in one command buffer, one buffer per graph tensor that crosses a step.

A ``GraphRun`` belongs to one program on one engine and is kept (least recently used out, and freed by
``Engine.trim`` when idle) so that a graph of the same structure (a new Alpha) reuses its buffers,
pipelines and recorded command buffer: a fused step's scalars are words in its parameter buffer,
written before each run; a node step's are push constants, baked into the command buffer at record
time, so a change of those re-records it (no new pipeline).

Made in two steps: ``GraphRun(engine, plan)`` creates its buffers, pipelines and sequence and nothing
else (no submission, no engine table or counter touched), so the device worker makes it on a thread
beside its job thread (service/graph_builds.py: kp, as build-kp.sh patches it, builds a pipeline
without the GIL), which may also run it once there (``warm_up``: its own submissions, under kp's
submission lock); ``settle()``, on the engine's own thread, does the rest before its first run.

Memory: graph inputs and outputs live in the engine's memory mode (host: mapped; device: device-
local behind staging); intermediates only the steps read are kp ``storage`` tensors: device-local,
never mapped, never copied to the host. Dependent dispatches are ordered by the global barrier that
kp (as scripts/build-kp.sh patches it) records before each dispatch: shader writes before shader
reads and writes.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import kp
import numpy as np

from .buckets import bucket
from .descriptors import TensorDesc
from .dispatch_geometry import UNIT_BYTES, push_words
from .errors import InvalidRequest, PayloadTooLarge
from .graph_program import FusedStep, GraphPlan, NodeStep, ReductionStep, Value
from .graph_glsl import PARAM_WORDS
from .limits import MAX_GRAPH_PIPELINES, MAX_GRAPH_RUNS
from .operators import OperatorDesc

if TYPE_CHECKING:
    from .engine import Buffer, Engine


class BuildCancelled(Exception):
    """A run's build stopped between two pipelines (its ``cancelled`` said so): the worker is closing."""


class GraphRun:
    def __init__(self, engine: Engine, plan: GraphPlan, cancelled: Callable[[], bool] | None = None) -> None:
        """``cancelled``, asked before each pipeline's build: True stops the build (BuildCancelled). A
        build that raises destroys what it made."""
        self.engine = engine
        self._cancelled = cancelled
        self.program = program = plan.program
        graph = plan.graph
        ops = graph.operators
        self.used = engine.pool.epoch
        self._ops = ops
        self._uploads_once: list[kp.Tensor] = []   # meta tables: device memory needs them once
        self._tensors: list[kp.Tensor] = []
        self._algorithms: list[kp.Algorithm] = []
        self._settled = False
        outputs = {("node", n) for n in program.outputs}

        def desc(v: Value) -> TensorDesc:
            return graph.input_desc(v[1]) if v[0] == "input" else ops[v[1]].output

        values: list[Value] = [("input", i) for i in range(graph.InputCount)]
        for step in program.steps:
            values += [v for v in (*step.reads, *step.produced) if v not in values]
        needed = sum(self._capacity(desc(v)) for v in values)
        if needed > engine.settings.pool_bytes:  # declared buffer sizes, not data sent, decide this
            raise PayloadTooLarge(
                f"the graph's tensors need {needed} bytes of device memory; the buffer pool holds at most "
                f"{engine.settings.pool_bytes} (VKACT_POOL_BYTES)", "Graph")
        try:
            self._build(plan, values, desc, outputs)
        except BaseException:
            for made in (*self._algorithms, *self._tensors):
                made.destroy()
            raise

    def _build(self, plan: GraphPlan, values: list[Value], desc: Callable[[Value], TensorDesc], outputs: set[Value]) -> None:
        graph, program, ops = plan.graph, plan.program, plan.graph.operators
        engine = self.engine
        self.buffers: dict[Value, kp.Tensor] = {}
        self.views: dict[Value, np.ndarray] = {}
        for v in values:
            visible = v[0] == "input" or v in outputs
            self.buffers[v] = self._tensor(self._capacity(desc(v)), visible)
            if visible:
                self.views[v] = self.buffers[v].data().view(np.uint8)
        self.input_descs = [desc(("input", i)) for i in range(graph.InputCount)]
        self.output_descs = [ops[n].output for n in program.outputs]

        self.uploads = [self.buffers[("input", i)] for i in range(graph.InputCount)]
        self.downloads = list(dict.fromkeys(self.buffers[("node", n)] for n in program.outputs))
        self.dispatches: list[tuple[kp.Algorithm, object]] = []   # (algorithm, the step)
        self.params: list[tuple[np.ndarray, tuple[int, ...]]] = []  # fused steps' parameter words and nodes
        for step in program.steps:
            if isinstance(step, FusedStep):
                self._fused(step)
            else:
                self._node(step, ops[step.node])
        self._recorded_for: tuple | None = None
        self._seq = engine.sequence()

    def warm_up(self, plan: GraphPlan) -> None:
        """Run each kernel once, on the thread that made the run and without the GIL (kp patch 13), before
        the engine takes it: where a driver makes a pipeline's machine code at its first dispatch
        (``Tuning.first_dispatch_compiles``: lavapipe, seconds for a long new graph) that happens here and
        not in the job thread's first run of it. One dispatch per submission: the device's queue runs
        submissions in order, so a job the job thread submits meanwhile waits for one pipeline's code at
        most, not the whole graph's. On whatever the buffers hold (a run's own, written by nothing else
        yet; in device memory its meta tables uploaded first, as a strided kernel reads them); the next
        run records its transfers again."""
        seq = self._seq
        if self.engine.memory == "device" and self._uploads_once:
            seq.clear()
            seq.record(kp.OpTensorSyncDevice(self._uploads_once))
            seq.eval_released()
        for algorithm, push in self._dispatched(self._pushes(plan)):
            seq.clear()
            seq.record(kp.OpAlgoDispatch(algorithm, push))
            seq.eval_released()
        self._recorded_for = None

    def settle(self) -> None:
        """On the engine's thread, once, before the first run: what a run made elsewhere leaves to it (a
        submission to the engine's queue, its counters)."""
        if self._settled:
            return
        engine = self.engine
        if engine.memory == "device":  # zeros into device memory once: outputs' gaps are never written
            engine.sequence().eval(kp.OpTensorSyncDevice([*self.uploads, *self.downloads, *self._uploads_once]))
        self._settled = True
        engine.stats.buffers_allocated += len(self._tensors)
        engine.stats.pipelines_created += len(self._algorithms)

    # -- building -----------------------------------------------------------------------------------

    def _capacity(self, desc: TensorDesc) -> int:
        return min(bucket(desc.total_bytes + UNIT_BYTES), self.engine._max_binding)

    def _tensor(self, nbytes: int, visible: bool) -> kp.Tensor:
        kind = self.engine._tensor_type if visible else kp.TensorTypes.storage
        tensor = self.engine._mgr.tensor_t(np.zeros(max(nbytes, 16) // 4, np.uint32), kind)
        self._tensors.append(tensor)
        return tensor

    def _algorithm(self, tensors: list[kp.Tensor], spirv: bytes, groups: int, push_count: int) -> kp.Algorithm:
        if self._cancelled is not None and self._cancelled():
            raise BuildCancelled("the graph's build was stopped")
        algorithm = self.engine.algorithm(tensors, spirv, groups, push_count)
        self._algorithms.append(algorithm)
        return algorithm

    def _fused(self, step: FusedStep) -> None:
        engine = self.engine
        params = self._tensor(4 * PARAM_WORDS * len(step.nodes), True)
        self.uploads.append(params)
        self.params.append((params.data().view(np.uint32), step.nodes))
        tensors = [params, *(self.buffers[v] for v in step.reads), *(self.buffers[v] for v in step.writes)]
        first = self._ops[step.nodes[0]]
        units = -(-step.count * first.data_type.info.size // UNIT_BYTES)
        algorithm = self._algorithm(tensors, step.spirv, engine.workgroups(units), 2)
        self.dispatches.append((algorithm, step))

    def _node(self, step: NodeStep | ReductionStep, op: OperatorDesc) -> None:
        """A node with its operator's kernel, or (ReductionStep) its generated twin with a prologue and/or
        an epilogue, whose parameter buffer follows the kernel's own bindings, and the prologue's
        inputs but the first after that."""
        engine = self.engine
        variant, _push, meta, _clear, groups = engine.dispatch_shape(op)
        tensors = [self.buffers[step.reads[0]], self.buffers[step.produced[0]]] if isinstance(step, ReductionStep) else \
            [self.buffers[v] for v in step.reads] + [self.buffers[step.produced[0]]]
        if meta is not None:
            table = self._tensor(4 * len(meta), True)
            table.data().view(np.uint32)[: len(meta)] = meta
            self._uploads_once.append(table)
            tensors.append(table)
        spirv = engine.variant_spirv(variant) if isinstance(step, NodeStep) else dict(step.spirv)[variant.unroll]
        if isinstance(step, ReductionStep):
            params = self._tensor(4 * (PARAM_WORDS * len(step.fused_nodes) + 1), True)   # + the zero word
            self.uploads.append(params)
            self.params.append((params.data().view(np.uint32), step.fused_nodes))
            tensors += [params, *(self.buffers[v] for v in step.reads[1:])]
        if groups is None:  # elementwise: cover the largest buffer, as the engine's slots do
            unit = UNIT_BYTES if variant.layout == "PACKED" else op.data_type.info.size
            groups = engine.workgroups(max(self._capacity(d) for d in (*op.inputs, op.output)) // unit)
        algorithm = self._algorithm(tensors, spirv, groups, len(_push))
        self.dispatches.append((algorithm, step))

    # -- running ------------------------------------------------------------------------------------

    def run(self, plan: GraphPlan, inputs: Sequence[Buffer]) -> list[np.ndarray]:
        self.settle()  # made and run at once (a benchmark's own run): settled here
        graph = plan.graph
        ops = graph.operators
        if len(inputs) != graph.InputCount:
            raise InvalidRequest(f"the graph takes {graph.InputCount} input tensor(s), got {len(inputs)}")
        for i, (data, desc) in enumerate(zip(inputs, self.input_descs)):
            array = np.frombuffer(data, np.uint8)
            if array.nbytes != desc.total_bytes:
                raise InvalidRequest(f"graph input {i} is {array.nbytes} bytes; its TotalTensorSizeInBytes is {desc.total_bytes}", graph.input_names()[i])
            self.views[("input", i)][: array.nbytes] = array
        for words, nodes in self.params:
            for k, n in enumerate(nodes):
                words[k * PARAM_WORDS : (k + 1) * PARAM_WORDS] = push_words(ops[n].shader_params(), PARAM_WORDS)
        pushes = self._pushes(plan)
        signature = tuple(p.tobytes() for p in pushes)
        if signature != self._recorded_for:
            self._record(self._seq, pushes, transfers=True)
            self._recorded_for = signature
        started = time.perf_counter()
        self._seq.eval()
        seconds = time.perf_counter() - started
        results = []
        for n, desc in zip(self.program.outputs, self.output_descs):
            out = np.zeros(desc.total_bytes, np.uint8)
            span = desc.span_bytes()
            out[:span] = self.views[("node", n)][:span]
            results.append(out)
        stats = self.engine.stats
        stats.kernel_seconds += seconds
        stats.dispatches += len(self.dispatches)
        stats.bytes_in += sum(d.total_bytes for d in self.input_descs)
        stats.bytes_out += sum(d.total_bytes for d in self.output_descs)
        return results

    def _pushes(self, plan: GraphPlan) -> list[np.ndarray]:
        ops = plan.graph.operators
        return [
            np.array([step.count, 0], np.uint32) if isinstance(step, FusedStep) else self.engine.dispatch_shape(ops[step.node])[1]
            for _algorithm, step in self.dispatches
        ]

    def _dispatched(self, pushes: list[np.ndarray]) -> Iterator[tuple[kp.Algorithm, np.ndarray]]:
        """The (pipeline, push constants) of each dispatch a run makes, in order: a node step whose output
        holds no element makes none."""
        for (algorithm, step), push in zip(self.dispatches, pushes):
            if isinstance(step, FusedStep) or self._ops[step.node].output.element_count:
                yield algorithm, push

    def _record(self, seq: kp.Sequence, pushes: list[np.ndarray], transfers: bool) -> None:
        seq.clear()
        if transfers and self.engine.memory == "device":
            seq.record(kp.OpTensorSyncDevice(self.uploads))
        for algorithm, push in self._dispatched(pushes):
            seq.record(kp.OpAlgoDispatch(algorithm, push))
        if transfers:
            seq.record(kp.OpTensorSyncLocal(self.downloads))

    def kernels(self, plan: GraphPlan) -> kp.Sequence:
        """The plan's dispatches alone in one command buffer, on this run's buffers (the benchmark's
        kernel time: no uploads or downloads; run ``execute_graph`` first for the parameters)."""
        seq = self.engine.sequence()
        self._record(seq, self._pushes(plan), transfers=False)
        return seq

    def destroy(self) -> None:
        self._seq.destroy()
        for algorithm in self._algorithms:
            algorithm.destroy()
            if self._settled:  # counted as created
                self.engine.stats.pipelines_destroyed += 1
        for tensor in self._tensors:
            tensor.destroy()
        self.views.clear()
        self.params.clear()


def pipelines(runs: Iterable[GraphRun]) -> int:
    """The pipelines ``runs`` hold, which MAX_GRAPH_PIPELINES bounds (on lavapipe each holds about 8 MB of
    the process's memory, which its allocator keeps for reuse once the run goes)."""
    return sum(len(run.dispatches) for run in runs)


class GraphRuns:
    """An engine's graph runs by program (``GraphProgram.key``): at most MAX_GRAPH_RUNS of them, holding at
    most MAX_GRAPH_PIPELINES pipelines together, the least recently used let go first. Used on the
    engine's thread only."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, GraphRun] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._runs

    def __len__(self) -> int:
        return len(self._runs)

    @property
    def pipelines(self) -> int:
        return pipelines(self._runs.values())

    def take(self, engine: Engine, plan: GraphPlan, built: GraphRun | None) -> GraphRun:
        """``plan``'s run, made (or ``built`` taken in, made on another thread) and settled where its
        program has none yet; a ``built`` that comes second is destroyed (the one kept wins)."""
        key = plan.program.key
        run = self._runs.get(key)
        if run is None:
            run = built if built is not None else GraphRun(engine, plan)
            try:
                run.settle()
            except BaseException:
                run.destroy()
                raise
            while self._runs and (len(self._runs) >= MAX_GRAPH_RUNS or
                                  self.pipelines + len(run.dispatches) > MAX_GRAPH_PIPELINES):
                self._runs.popitem(last=False)[1].destroy()
            self._runs[key] = run
        else:
            if built is not None:
                built.destroy()
            self._runs.move_to_end(key)
        run.used = engine.pool.epoch
        return run

    def trim(self, epoch: int) -> None:
        """Destroy the runs unused since ``epoch``."""
        for key in [k for k, run in self._runs.items() if run.used < epoch]:
            self._runs.pop(key).destroy()

    def clear(self) -> None:
        while self._runs:
            self._runs.popitem()[1].destroy()
