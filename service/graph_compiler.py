"""The graph compiler: a validated DML_GRAPH_DESC becomes a plan of dispatches.

Steps, in an order that respects the graph's edges:
- ``FusedStep``: a group of elementwise nodes whose tensors are all packed (contiguous, no
  broadcast) with one element count and data type: one generated shader (service/graph_glsl.py),
  one read of each tensor it needs, one write of each value used outside it; every value rounded to
  its data type where the node-by-node run stores it, so the answer is bit-identical to that run.
- ``NodeStep``: one node with its operator's own kernel (the engine's elementwise or reduction
  contract): a softmax-family node, an elementwise node with strided or broadcast tensors, or the
  nodes of a group whose shader would exceed ``Settings.max_fused_shader_bytes`` (or that glslang
  refuses): those run node by node, and ``GraphPlan.notes`` says why.
  A group whose step would bind more storage buffers than the device allows in one shader
  (maxPerStageDescriptorStorageBuffers; the parameter buffer, each read, each write) runs as smaller
  groups, greedily, or node by node, and the notes say so; likewise a prologue that would take a
  reduction past the limit stays a dispatch of its own. An operator's own kernel binds what it binds.
- ``ReductionStep``: a softmax-family node with the fused group before it in its loads (a
  prologue) and/or the fused group after it in its stores (an epilogue).
  Prologue: where the group writes one value, its last node's, which only the reduction reads (the
  reduction's input then never exists in memory): every word the reduction loads (both of its
  sweeps, every load path of glsl/common/reduction.glsl) is computed from the group's inputs at the
  same place, rounded to its type as the node-by-node run stores it; recomputed at each read, so
  exact. A group whose other values are needed elsewhere (a graph output, another node's input)
  stays a dispatch of its own, and the plan's notes say so.
  Epilogue: where the group reads only the reduction's (packed) output, which nothing else reads,
  and writes one value. Each result is rounded to its type before the epilogue, as the node-by-node
  run stores it.

Grouping is greedy in topological order: an elementwise node joins the group emitted last when its
element count and type agree, else starts a step of its own; a group is thus always after every step
it reads.

Programs (steps, SPIR-V) are cached by the graph's structure and types, not its scalars: a graph that
differs only in Alpha gets the same ``GraphProgram`` (and the engine its pipelines); the scalars travel
in a parameter buffer (fused steps) or the push constants (node steps).
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from .config import Settings
from .descriptors.graph import GraphDesc
from .errors import ShaderCompileError
from .descriptors import DataType, packed_strides
from .graph_glsl import FusedKernel, FusedNode, Prologue, generate, generate_reduction
from .graph_program import FusedStep, GraphPlan, GraphProgram, NodeStep, ReductionStep, Step, Value
from .graph_spirv import generated_cache_dir, generated_spirv
from .layout import coalesce, row_layout
from .operators import OperatorDesc
from .operators.reduction import ReductionDesc
from .shaders import REDUCTION_UNROLLS
from .vulkan_probe import MIN_PER_STAGE_STORAGE_BUFFERS

from .limits import MAX_FUSED_NODES, MAX_PROGRAMS


def structure_key(graph: GraphDesc) -> str:
    """The graph less its scalars (float fields), plus each node's kernel (which a scalar may pick)."""
    nodes = []
    for op in graph.operators:
        data = op.model_dump(mode="json", exclude=set(op.scalar_fields()))
        nodes.append((data, op.kernel(), len(op.shader_params())))
    edges = graph.model_dump(mode="json", exclude={"Nodes"})
    return hashlib.sha256(json.dumps([nodes, edges], sort_keys=True).encode()).hexdigest()


#: The data types the generator rounds intermediates of (graph_glsl): other types' nodes run with their
#: own kernels, whose variant follows the device's features (64-bit: native or emulated).
FUSED_TYPES = frozenset({DataType.FLOAT32, DataType.FLOAT16})


def unfused_reason(op: OperatorDesc) -> str | None:
    """Why an elementwise node with elements runs with its own kernel; None where it can fuse."""
    if op.data_type not in FUSED_TYPES:
        return f"is {op.data_type.short}, which fused kernels do not generate"
    if not coalesce((*op.inputs, op.output)).packed:
        return "has strided or broadcast tensors"
    return None


def fusable(op: OperatorDesc) -> bool:
    return op.kind == "elementwise" and op.output.element_count > 0 and unfused_reason(op) is None


class GraphCompiler:
    """Compiles graphs into plans. Thread-safe: the HTTP side compiles in threads (glslang takes
    tens of milliseconds), off the event loop and off the device worker's job thread; a lock keeps
    two compilations of one structure from both running glslang."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings = settings or Settings()
        self.glsl_dir = settings.glsl_dir
        self._programs: OrderedDict[str, GraphProgram] = OrderedDict()
        self._cache_dir: Path | None = None
        self.compiled = 0   # shaders glslang compiled (not found in the cache)
        self._lock = threading.Lock()

    def compile(self, graph: GraphDesc, fuse: bool = True, storage_buffers: int | None = None) -> GraphPlan:
        """The plan of ``graph``; ``fuse=False`` gives the node-by-node plan (the oracle, and the
        bench's baseline). ``storage_buffers``: the device's maxPerStageDescriptorStorageBuffers (None:
        not known, no limit); ``Settings.graph_max_storage_buffers`` lowers it."""
        limit = self.binding_limit(storage_buffers)
        key = structure_key(graph) + ("" if fuse else "-unfused") + (f"-b{limit[0]}" if limit else "")
        with self._lock:
            program = self._programs.get(key)
            if program is None:
                program = self._programs[key] = self._build(graph, key, fuse, limit)
                while len(self._programs) > MAX_PROGRAMS:
                    self._programs.popitem(last=False)
            else:
                self._programs.move_to_end(key)
        return GraphPlan(graph, program)

    def binding_limit(self, storage_buffers: int | None) -> _Limit | None:
        """(storage buffers a generated step may bind, and where that number comes from), or None; at
        least the Vulkan minimum (4), which every generated step of one node fits."""
        if storage_buffers is not None:
            storage_buffers = max(storage_buffers, MIN_PER_STAGE_STORAGE_BUFFERS)
        forced = max(self.settings.graph_max_storage_buffers, MIN_PER_STAGE_STORAGE_BUFFERS) if self.settings.graph_max_storage_buffers else 0
        if forced and (storage_buffers is None or forced < storage_buffers):
            return forced, "VKACT_GRAPH_MAX_STORAGE_BUFFERS"
        return (storage_buffers, "the device's maxPerStageDescriptorStorageBuffers") if storage_buffers is not None else None

    # -- planning ---------------------------------------------------------------------------------

    def _build(self, graph: GraphDesc, key: str, fuse: bool, limit: _Limit | None = None) -> GraphProgram:
        ops = graph.operators
        reads: dict[int, list[Value]] = {n: [("input", 0)] * len(op.input_fields) for n, op in enumerate(ops)}
        for e in graph.InputEdges:
            reads[e.ToNodeIndex][e.ToNodeInputIndex] = ("input", e.GraphInputIndex)
        for e in graph.IntermediateEdges:
            reads[e.ToNodeIndex][e.ToNodeInputIndex] = ("node", e.FromNodeIndex)
        outputs = tuple(e.FromNodeIndex for e in sorted(graph.OutputEdges, key=lambda e: e.GraphOutputIndex))

        groups: list[list[int]] = []     # node groups in order; a NodeStep is a group of one non-fusable node
        for n in graph.order:
            last = groups[-1] if groups else None
            if fuse and fusable(ops[n]) and last and fusable(ops[last[0]]) and _agree(ops[last[0]], ops[n]) \
                    and len(last) < MAX_FUSED_NODES:
                last.append(n)
            else:
                groups.append([n])

        steps: list[Step] = []
        notes: list[str] = []
        for group in groups:
            if not fuse or not fusable(ops[group[0]]):
                steps.append(NodeStep(group[0], tuple(reads[group[0]])))
                if fuse and ops[group[0]].kind == "elementwise" and ops[group[0]].output.element_count:
                    notes.append(f"Nodes[{group[0]}] ({ops[group[0]].type_name()}) {unfused_reason(ops[group[0]])}: it runs with its own kernel")
                continue
            parts = self._within(graph, group, reads, outputs, limit, notes)
            for part in parts:
                try:
                    steps.append(self._fuse(graph, part, reads, outputs))
                except (ShaderCompileError, _TooLarge) as exc:
                    notes.append(f"Nodes{part} run node by node: {exc}")
                    steps += [NodeStep(n, tuple(reads[n])) for n in part]
        if fuse:
            steps = self._epilogues(graph, steps, outputs, notes)
            steps = self._prologues(graph, steps, reads, outputs, notes, limit)
        lone = tuple(s.node for s in steps if isinstance(s, NodeStep) and ops[s.node].kind == "elementwise" and ops[s.node].output.element_count)
        return GraphProgram(key, tuple(steps), outputs, tuple(notes), lone if fuse else ())

    def _bindings(self, graph: GraphDesc, group: list[int], reads: dict[int, list[Value]], outputs: tuple[int, ...]) -> int:
        """Storage buffers a FusedStep of ``group`` binds: its parameters, each read, each write."""
        _nodes, read_values, write_values = self._values(graph, group, reads, outputs)
        return 1 + len(read_values) + len(write_values)

    def _within(self, graph: GraphDesc, group: list[int], reads: dict[int, list[Value]], outputs: tuple[int, ...],
                limit: _Limit | None, notes: list[str]) -> list[list[int]]:
        """``group`` cut greedily, in its order, into parts whose steps bind at most ``limit`` storage
        buffers (one node binds at most 4: parameters, two inputs, its output)."""
        if limit is None or self._bindings(graph, group, reads, outputs) <= limit[0]:
            return [group]
        parts: list[list[int]] = []
        for n in group:
            if parts and self._bindings(graph, [*parts[-1], n], reads, outputs) <= limit[0]:
                parts[-1].append(n)
            else:
                parts.append([n])
        notes.append(f"Nodes{group} run as {len(parts)} steps: one step would bind {self._bindings(graph, group, reads, outputs)} "
                     f"storage buffers, beyond {limit[1]} ({limit[0]})")
        return parts

    @staticmethod
    def _merge_pairs(steps: list[Step], merge: Callable[[Step, Step], Step | None]) -> list[Step]:
        """``steps`` with each adjacent pair that ``merge`` makes one step replaced by that step."""
        out: list[Step] = []
        i = 0
        while i < len(steps):
            merged = merge(steps[i], steps[i + 1]) if i + 1 < len(steps) else None
            out.append(steps[i] if merged is None else merged)
            i += 1 if merged is None else 2
        return out

    def _epilogues(self, graph: GraphDesc, steps: list[Step], outputs: tuple[int, ...], notes: list[str]) -> list[Step]:
        """A reduction node step followed by a fused step that reads only the reduction's output,
        which nothing else reads, and writes one value: one ReductionStep, the fused nodes applied to
        each result before it is stored (where the reduction's output is packed, as the fused nodes'
        tensors are)."""
        ops = graph.operators

        def merge(step: Step, nxt: Step) -> Step | None:
            if not (
                isinstance(step, NodeStep) and isinstance(nxt, FusedStep) and ops[step.node].kind == "reduction"
                and nxt.reads == (("node", step.node),) and len(nxt.writes) == 1 and nxt.writes[0] == ("node", nxt.nodes[-1])
                and step.node not in outputs
                and not any(("node", step.node) in s.reads for s in steps if s is not nxt)
                and ops[step.node].output.strides == packed_strides(ops[step.node].output.Sizes)
            ):
                return None
            try:
                return self._reduction_epilogue(graph, step, nxt)
            except (ShaderCompileError, _TooLarge) as exc:
                notes.append(f"Nodes{list(nxt.nodes)} run after Nodes[{step.node}], not in its stores: {exc}")
                return None

        return self._merge_pairs(steps, merge)

    def _prologues(self, graph: GraphDesc, steps: list[Step], reads: dict[int, list[Value]], outputs: tuple[int, ...],
                   notes: list[str], limit: _Limit | None = None) -> list[Step]:
        """A fused step followed by a reduction (node step, or reduction step with an epilogue) that
        reads its one written value, its last node's, which nothing else needs: one ReductionStep,
        the fused nodes applied in the reduction's loads."""
        ops = graph.operators

        def needed(v: Value, reducer: Step) -> bool:
            return v[1] in outputs or any(v in s.reads for s in steps if s is not reducer)

        def merge(step: Step, nxt: Step) -> Step | None:
            if not (
                isinstance(step, FusedStep) and isinstance(nxt, (NodeStep, ReductionStep))
                and ops[nxt.node].kind == "reduction" and not (isinstance(nxt, ReductionStep) and nxt.prologue)
                and nxt.reads == (("node", step.nodes[-1]),)
            ):
                return None
            last = ("node", step.nodes[-1])
            if step.writes != (last,) or needed(last, nxt):
                why = f"{', '.join(f'Nodes[{v[1]}]' for v in step.writes if v != last or needed(v, nxt))} must exist in memory (read by another step or a graph output)"
            elif ops[nxt.node].data_type != ops[step.nodes[0]].data_type:
                why = "its data type differs from the reduction's"
            else:
                try:
                    bare = nxt if isinstance(nxt, ReductionStep) else ReductionStep(nxt.node, nxt.reads, (), ())
                    return self._reduction(graph, bare, step, reads, limit=limit)
                except (ShaderCompileError, _TooLarge) as exc:
                    why = str(exc)
            notes.append(f"Nodes{list(step.nodes)} run before Nodes[{nxt.node}], not in its loads: {why}")
            return None

        return self._merge_pairs(steps, merge)

    def _reduction_epilogue(self, graph: GraphDesc, step: NodeStep, fused: FusedStep) -> ReductionStep:
        return self._reduction(graph, ReductionStep(step.node, step.reads, (), ()), None, {}, epilogue=fused)

    def _reduction(self, graph: GraphDesc, step: ReductionStep, prologue: FusedStep | None, reads: dict[int, list[Value]],
                   epilogue: FusedStep | None = None, limit: _Limit | None = None) -> ReductionStep:
        """``step`` (a reduction, perhaps with an epilogue already) with ``prologue`` in its loads or
        ``epilogue`` in its stores: its shader generated for every unroll."""
        op = graph.operators[step.node]
        assert isinstance(op, ReductionDesc)
        sources = {(e.ToNodeIndex, e.ToNodeInputIndex): e.FromNodeIndex for e in graph.IntermediateEdges}
        after = epilogue.nodes if epilogue else step.epilogue
        inside_after = set(after)

        def after_name(n: int, slot: int) -> str:
            source = sources[(n, slot)]
            return f"v{source}" if source in inside_after else "x0"

        after_nodes = tuple(
            FusedNode(graph.operators[n].kernel(), tuple(after_name(n, s) for s in range(len(graph.operators[n].input_fields))), f"v{n}")
            for n in after
        )
        before = prologue.nodes if prologue else step.prologue
        step_reads = step.reads
        glsl_prologue = None
        if prologue is not None:
            nodes, read_values = self._named_nodes(graph, list(prologue.nodes), reads)
            glsl_prologue, step_reads = Prologue(len(read_values), nodes), tuple(read_values)
        layout = row_layout((*op.inputs, op.output), op.reduced_axes()).kind
        # engine_graph binds: input, output, the strided layouts' table, parameters, the other prologue reads
        bindings = 2 + (layout == "STRIDED") + 1 + len(step_reads) - 1
        if limit is not None and bindings > limit[0]:
            raise _TooLarge(f"it would bind {bindings} storage buffers, beyond {limit[1]} ({limit[0]})")
        dtype = op.data_type.info.shader or ""
        spirv = []
        for unroll in REDUCTION_UNROLLS:
            source = generate_reduction(op.kernel(), dtype, layout, unroll, glsl_prologue, after_nodes, self.glsl_dir)
            limit = self.settings.max_fused_shader_bytes
            if len(source) > limit:
                raise _TooLarge(f"its generated shader is {len(source)} bytes, beyond max_fused_shader_bytes ({limit})")
            spirv.append((unroll, self._spirv(source)))
        return ReductionStep(step.node, step_reads, tuple(after), tuple(spirv), tuple(before))

    def _values(self, graph: GraphDesc, group: list[int], reads: dict[int, list[Value]],
                outputs: tuple[int, ...]) -> tuple[tuple[FusedNode, ...], list[Value], list[Value]]:
        """A group's named nodes, the tensors it reads and the values it writes (those used outside it)."""
        inside = set(group)
        nodes, read_values = self._named_nodes(graph, group, reads)
        used_outside = {v for m, vs in reads.items() if m not in inside for v in vs} | {("node", n) for n in outputs}
        return nodes, read_values, [("node", n) for n in group if ("node", n) in used_outside]

    @staticmethod
    def _named_nodes(graph: GraphDesc, group: list[int], reads: dict[int, list[Value]]) -> tuple[tuple[FusedNode, ...], list[Value]]:
        """A group's nodes as the generator names them ("x<i>": the i-th tensor it reads, "v<n>": node
        n's value), and the tensors it reads, in order."""
        inside = set(group)
        read_values: list[Value] = []
        for n in group:
            for v in reads[n]:
                if not (v[0] == "node" and v[1] in inside) and v not in read_values:
                    read_values.append(v)

        def name(v: Value) -> str:
            return f"v{v[1]}" if v[0] == "node" and v[1] in inside else f"x{read_values.index(v)}"

        nodes = tuple(FusedNode(graph.operators[n].kernel(), tuple(name(v) for v in reads[n]), f"v{n}") for n in group)
        return nodes, read_values

    def _fuse(self, graph: GraphDesc, group: list[int], reads: dict[int, list[Value]], outputs: tuple[int, ...]) -> FusedStep:
        ops = graph.operators
        nodes, read_values, write_values = self._values(graph, group, reads, outputs)
        kernel = FusedKernel(ops[group[0]].data_type.info.shader or "", len(read_values), nodes, tuple(f"v{v[1]}" for v in write_values))
        source = generate(kernel, self.glsl_dir)
        limit = self.settings.max_fused_shader_bytes
        if len(source) > limit:
            raise _TooLarge(f"its generated shader is {len(source)} bytes, beyond max_fused_shader_bytes ({limit})")
        return FusedStep(tuple(group), tuple(read_values), tuple(write_values), ops[group[0]].output.element_count, self._spirv(source))

    def _spirv(self, source: str) -> bytes:
        if self._cache_dir is None:
            self._cache_dir = generated_cache_dir(self.settings)
        spirv, compiled = generated_spirv(source, self.glsl_dir, self._cache_dir, self.settings.glslang)
        self.compiled += compiled
        return spirv


class _TooLarge(Exception):
    pass


#: A binding limit: (storage buffers one generated step may bind, where that number comes from).
_Limit = tuple[int, str]


def _agree(a: OperatorDesc, b: OperatorDesc) -> bool:
    return a.data_type == b.data_type and a.output.element_count == b.output.element_count

