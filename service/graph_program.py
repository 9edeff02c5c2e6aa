"""What a compiled graph is: the steps the engine runs (service/engine_graph.py), in the order it runs them.

The HTTP side makes these (service/graph_compiler.py, over the graph's validated descriptor) and pickles a
``GraphPlan`` to the device worker, which needs nothing of the compiler to run it. Each kind of step is
described in graph_compiler's docstring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .descriptors.graph import GraphDesc

#: A tensor of the graph: ("input", graph input index) or ("node", node index: its output).
Value = tuple[str, int]


@dataclass(frozen=True)
class FusedStep:
    nodes: tuple[int, ...]          # graph node indices, in evaluation order
    reads: tuple[Value, ...]        # bindings 1.. (binding 0: the parameter words)
    writes: tuple[Value, ...]       # after the reads
    count: int                      # elements
    spirv: bytes

    @property
    def produced(self) -> tuple[Value, ...]:
        return self.writes


@dataclass(frozen=True)
class NodeStep:
    node: int
    reads: tuple[Value, ...]        # the node's inputs, in order

    @property
    def produced(self) -> tuple[Value, ...]:
        return (("node", self.node),)


@dataclass(frozen=True)
class ReductionStep:
    """A softmax-family node with the elementwise nodes after it fused into its stores (epilogue)."""

    node: int
    reads: tuple[Value, ...]        # the reduction's input, or the prologue's inputs (bindings 0, then after the parameters)
    epilogue: tuple[int, ...]       # graph node indices, in evaluation order; the last one is written
    spirv: tuple[tuple[int, bytes], ...]   # (UNROLL, SPIR-V): the engine picks its device's unroll
    prologue: tuple[int, ...] = ()  # graph node indices, in evaluation order; the last one is the reduction's input

    @property
    def produced(self) -> tuple[Value, ...]:
        return (("node", self.epilogue[-1] if self.epilogue else self.node),)

    @property
    def fused_nodes(self) -> tuple[int, ...]:
        """The elementwise nodes whose scalars the parameter buffer holds, in its order."""
        return (*self.prologue, *self.epilogue)


Step = Union[FusedStep, NodeStep, ReductionStep]


@dataclass(frozen=True)
class GraphProgram:
    """What a graph's structure compiles to; shared by every graph of that structure."""

    key: str
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]        # graph output j is node outputs[j]'s value
    notes: tuple[str, ...]          # why nodes run unfused, or a group apart from a reduction it could have joined
    lone: tuple[int, ...] = ()      # elementwise nodes (with elements) that run with their own kernel

    @property
    def dispatches(self) -> int:
        return len(self.steps)

    @property
    def fused(self) -> bool:
        """True when no elementwise node had to run on its own (the notes say why one did)."""
        return not self.lone


@dataclass(frozen=True)
class GraphPlan:
    """A compiled graph: its program and the graph itself (whose scalars the engine reads). What the
    front-ends report: ``fused``, ``notes``, ``dispatches``."""

    graph: GraphDesc
    program: GraphProgram

    @property
    def fused(self) -> bool:
        return self.program.fused

    @property
    def notes(self) -> tuple[str, ...]:
        return self.program.notes

    @property
    def dispatches(self) -> int:
        return self.program.dispatches
