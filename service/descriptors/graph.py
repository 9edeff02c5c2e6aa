"""DML_GRAPH_DESC as pydantic models, validated as DirectML's CompileGraph validates a graph.

A graph is operator nodes (each an operator descriptor as /v1 takes it) joined by edges: input edges
bind a graph input to a node's input, intermediate edges a node's output to another node's input,
output edges a node's output to a graph output. The rules (each error names its field, e.g.
``IntermediateEdges[1].ToNodeIndex``; ``parse_graph`` prefixes ``Graph.``):

- indices in range: graph inputs < InputCount, graph outputs < OutputCount, nodes < len(Nodes), a
  node's input index below its operator's input count, its output index 0 (activations have one);
- every node input bound exactly once (by one input or intermediate edge); every graph input bound to
  some node input, and every graph output produced exactly once; every node's output used;
- acyclic;
- tensor descriptors agree along each edge: the producer's OutputTensor is the consumer's input
  (DataType, Sizes, Strides, TotalTensorSizeInBytes), and the node inputs bound to one graph input
  have one descriptor (the input is one buffer);
- in place: graph inputs are read-only (DirectML binds them so; the compiler never writes them), and a
  node never runs in place on a value that another node still reads (the compiler gives every
  intermediate its own buffer).

Names: graph inputs and outputs are named by their edges' ``Name`` (the front-ends key tensors by
them); every edge of one graph input carries the same name, and distinct inputs (outputs) have
distinct names. Unnamed ones are ``input<i>`` / ``output<i>``.
"""
from __future__ import annotations

from functools import cached_property
from typing import Any, Optional

from pydantic import ConfigDict, Field, ValidationError, model_validator

from ..errors import DescriptorError
from ..operators import OperatorDesc, OperatorDescriptor, descriptor_error
from .canonical import CanonicalModel
from .tensor import UINT32, TensorDesc

NodeInput = tuple[int, int]        # (node index, the node's input index)


class _Frozen(CanonicalModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OperatorNode(_Frozen):
    """DML_OPERATOR_GRAPH_NODE_DESC: one operator and an optional name."""

    Operator: OperatorDescriptor   # type: ignore[valid-type]
    Name: Optional[str] = None


class InputEdge(_Frozen):
    """DML_INPUT_GRAPH_EDGE_DESC."""

    GraphInputIndex: UINT32
    ToNodeIndex: UINT32
    ToNodeInputIndex: UINT32
    Name: Optional[str] = None


class OutputEdge(_Frozen):
    """DML_OUTPUT_GRAPH_EDGE_DESC."""

    FromNodeIndex: UINT32
    FromNodeOutputIndex: UINT32
    GraphOutputIndex: UINT32
    Name: Optional[str] = None


class IntermediateEdge(_Frozen):
    """DML_INTERMEDIATE_GRAPH_EDGE_DESC."""

    FromNodeIndex: UINT32
    FromNodeOutputIndex: UINT32
    ToNodeIndex: UINT32
    ToNodeInputIndex: UINT32
    Name: Optional[str] = None


class GraphDesc(_Frozen):
    """DML_GRAPH_DESC (InputCount, OutputCount, Nodes and the three edge lists; the edge counts are
    the lists' lengths)."""

    InputCount: int = Field(ge=1, le=2**32 - 1)
    OutputCount: int = Field(ge=1, le=2**32 - 1)
    Nodes: tuple[OperatorNode, ...] = Field(min_length=1)
    InputEdges: tuple[InputEdge, ...] = ()
    OutputEdges: tuple[OutputEdge, ...] = ()
    IntermediateEdges: tuple[IntermediateEdge, ...] = ()

    # -- what the compiler and the front-ends read ---------------------------------------------------

    @property
    def operators(self) -> tuple[OperatorDesc, ...]:
        return tuple(n.Operator for n in self.Nodes)

    @cached_property
    def order(self) -> tuple[int, ...]:
        """The nodes in an order where every node comes after the nodes it reads (set by validation)."""
        return _topological_order(self)

    def input_names(self) -> tuple[str, ...]:
        names = {e.GraphInputIndex: e.Name for e in self.InputEdges}
        return tuple(names.get(i) or f"input{i}" for i in range(self.InputCount))

    def output_names(self) -> tuple[str, ...]:
        names = {e.GraphOutputIndex: e.Name for e in self.OutputEdges}
        return tuple(names.get(i) or f"output{i}" for i in range(self.OutputCount))

    def input_desc(self, index: int) -> TensorDesc:
        edge = next(e for e in self.InputEdges if e.GraphInputIndex == index)
        return self.operators[edge.ToNodeIndex].inputs[edge.ToNodeInputIndex]

    def output_desc(self, index: int) -> TensorDesc:
        edge = next(e for e in self.OutputEdges if e.GraphOutputIndex == index)
        return self.operators[edge.FromNodeIndex].output

    # -- DirectML's rules --------------------------------------------------------------------------

    @model_validator(mode="after")
    def _graph_rules(self) -> GraphDesc:
        ops = self.operators
        bound: dict[NodeInput, str] = {}

        def node_index(field: str, value: int) -> None:
            if value >= len(ops):
                raise DescriptorError(field, f"{field} is {value}; the graph has {len(ops)} node(s)")

        def bind(field: str, node: int, slot: int) -> None:
            node_index(f"{field}.ToNodeIndex", node)
            count = len(ops[node].input_fields)
            if slot >= count:
                raise DescriptorError(f"{field}.ToNodeInputIndex", f"{field}.ToNodeInputIndex is {slot}; Nodes[{node}] ({ops[node].type_name()}) has {count} input(s)")
            if (node, slot) in bound:
                raise DescriptorError(f"{field}.ToNodeInputIndex", f"Nodes[{node}] input {slot} is bound twice: by {bound[(node, slot)]} and {field}")
            bound[(node, slot)] = field

        def from_node(field: str, node: int, slot: int) -> None:
            node_index(f"{field}.FromNodeIndex", node)
            if slot != 0:
                raise DescriptorError(f"{field}.FromNodeOutputIndex", f"{field}.FromNodeOutputIndex is {slot}; {ops[node].type_name()} has one output (index 0)")

        input_edges: dict[int, InputEdge] = {}
        for i, e in enumerate(self.InputEdges):
            field = f"InputEdges[{i}]"
            if e.GraphInputIndex >= self.InputCount:
                raise DescriptorError(f"{field}.GraphInputIndex", f"{field}.GraphInputIndex is {e.GraphInputIndex}; InputCount is {self.InputCount}")
            bind(field, e.ToNodeIndex, e.ToNodeInputIndex)
            desc = ops[e.ToNodeIndex].inputs[e.ToNodeInputIndex]
            first = input_edges.setdefault(e.GraphInputIndex, e)
            if first is not e:
                if desc != ops[first.ToNodeIndex].inputs[first.ToNodeInputIndex]:
                    raise DescriptorError(f"{field}.ToNodeInputIndex", f"graph input {e.GraphInputIndex} is bound to node inputs with different tensor descriptors")
                if e.Name != first.Name:
                    raise DescriptorError(f"{field}.Name", f"graph input {e.GraphInputIndex} is named {first.Name!r} by another edge, {e.Name!r} here")
        for i, e in enumerate(self.IntermediateEdges):
            field = f"IntermediateEdges[{i}]"
            from_node(field, e.FromNodeIndex, e.FromNodeOutputIndex)
            bind(field, e.ToNodeIndex, e.ToNodeInputIndex)
            produced, consumed = ops[e.FromNodeIndex].output, ops[e.ToNodeIndex].inputs[e.ToNodeInputIndex]
            _check_agree(f"{field}.ToNodeInputIndex", produced, consumed, e)
        outputs: dict[int, str] = {}
        for i, e in enumerate(self.OutputEdges):
            field = f"OutputEdges[{i}]"
            from_node(field, e.FromNodeIndex, e.FromNodeOutputIndex)
            if e.GraphOutputIndex >= self.OutputCount:
                raise DescriptorError(f"{field}.GraphOutputIndex", f"{field}.GraphOutputIndex is {e.GraphOutputIndex}; OutputCount is {self.OutputCount}")
            if e.GraphOutputIndex in outputs:
                raise DescriptorError(f"{field}.GraphOutputIndex", f"graph output {e.GraphOutputIndex} is produced twice: by {outputs[e.GraphOutputIndex]} and {field}")
            outputs[e.GraphOutputIndex] = field

        for n, op in enumerate(ops):
            for slot, name in enumerate(op.input_fields):
                if (n, slot) not in bound:
                    raise DescriptorError(f"Nodes[{n}].Operator.{name}", f"Nodes[{n}] input {slot} ({name}) is bound by no edge")
        used = {e.FromNodeIndex for e in (*self.IntermediateEdges, *self.OutputEdges)}
        for n in range(len(ops)):
            if n not in used:
                raise DescriptorError(f"Nodes[{n}]", f"the output of Nodes[{n}] goes to no edge")
        for i in range(self.InputCount):
            if i not in input_edges:
                raise DescriptorError("InputCount", f"graph input {i} is bound to no node (InputCount is {self.InputCount})")
        for j in range(self.OutputCount):
            if j not in outputs:
                raise DescriptorError("OutputCount", f"graph output {j} is produced by no edge (OutputCount is {self.OutputCount})")
        _unique_names("InputEdges", [(i, e.GraphInputIndex, self.input_names()[e.GraphInputIndex]) for i, e in enumerate(self.InputEdges)])
        _unique_names("OutputEdges", [(i, e.GraphOutputIndex, self.output_names()[e.GraphOutputIndex]) for i, e in enumerate(self.OutputEdges)])
        _topological_order(self)  # raises on a cycle
        return self


def _check_agree(field: str, produced: TensorDesc, consumed: TensorDesc, e: IntermediateEdge) -> None:
    for name in ("DataType", "Sizes", "strides", "TotalTensorSizeInBytes"):
        a, b = getattr(produced, name), getattr(consumed, name)
        if a != b:
            label = "Strides" if name == "strides" else name
            raise DescriptorError(
                field,
                f"Nodes[{e.FromNodeIndex}]'s output and Nodes[{e.ToNodeIndex}]'s input {e.ToNodeInputIndex} "
                f"disagree on {label}: {a!s} against {b!s}",
            )


def _unique_names(field: str, entries: list[tuple[int, int, str]]) -> None:
    seen: dict[str, int] = {}
    for i, index, name in entries:
        if seen.setdefault(name, index) != index:
            raise DescriptorError(f"{field}[{i}].Name", f"the name {name!r} is given to two graph tensors")


def _topological_order(graph: GraphDesc) -> tuple[int, ...]:
    """Kahn's algorithm; the edge that closes a cycle is named."""
    n = len(graph.Nodes)
    waiting = [0] * n
    readers: list[list[int]] = [[] for _ in range(n)]
    for e in graph.IntermediateEdges:
        waiting[e.ToNodeIndex] += 1
        readers[e.FromNodeIndex].append(e.ToNodeIndex)
    ready = [i for i in range(n) if waiting[i] == 0]
    order: list[int] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for reader in readers[node]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    if len(order) < n:
        stuck = set(range(n)) - set(order)
        i = next(i for i, e in enumerate(graph.IntermediateEdges) if e.ToNodeIndex in stuck and e.FromNodeIndex in stuck)
        raise DescriptorError(f"IntermediateEdges[{i}]", f"the graph has a cycle through Nodes{sorted(stuck)}")
    return tuple(order)


def parse_graph(data: Any, max_nodes: int | None = None) -> GraphDesc:
    """Validate a JSON-like dict into a GraphDesc; raises DescriptorError (422) whose field is a path
    from ``Graph`` (``Graph.Nodes[2].Operator.Alpha``, ``Graph.IntermediateEdges[1].ToNodeIndex``).
    ``max_nodes`` (Settings.max_graph_nodes) is checked before the nodes are parsed."""
    if max_nodes is not None and isinstance(data, dict) and isinstance(data.get("Nodes"), list) and len(data["Nodes"]) > max_nodes:
        raise DescriptorError("Graph.Nodes", f"a graph may have at most {max_nodes} nodes (VKACT_MAX_GRAPH_NODES), got {len(data['Nodes'])}")
    try:
        return GraphDesc.model_validate(data)
    except ValidationError as exc:
        raise descriptor_error(exc, ("Graph",)) from None
