"""Building DML_GRAPH_DESC dicts in tests, and the oracle: a graph's nodes run one by one through
``Engine.execute`` (no graph code involved), each node's output bytes handed to its readers."""
from __future__ import annotations

from typing import Any

import numpy as np

from service.descriptors.graph import GraphDesc
from service.engine import Engine
from tests.helpers import tensor


def activation(kind: str, dtype: Any, sizes: tuple[int, ...], inputs: tuple[str, ...] = ("InputTensor",), **params: Any) -> dict:
    return {"Type": f"DML_OPERATOR_ACTIVATION_{kind}", **{name: tensor(dtype, sizes) for name in inputs}, **params}


def chain(operators: list[dict], names: tuple[str, str] = ("x", "y")) -> dict:
    """A graph that runs ``operators`` one after the other on one input (each single-input)."""
    n = len(operators)
    return {
        "InputCount": 1,
        "OutputCount": 1,
        "Nodes": [{"Operator": op, "Name": f"n{i}"} for i, op in enumerate(operators)],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": names[0]}],
        "IntermediateEdges": [
            {"FromNodeIndex": i, "FromNodeOutputIndex": 0, "ToNodeIndex": i + 1, "ToNodeInputIndex": 0} for i in range(n - 1)
        ],
        "OutputEdges": [{"FromNodeIndex": n - 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": names[1]}],
    }


def node_by_node(engine: Engine, graph: GraphDesc, inputs: list[bytes]) -> list[np.ndarray]:
    """The graph's outputs as its nodes give them one request at a time."""
    ops = graph.operators
    values: dict[tuple[str, int], np.ndarray] = {("input", i): np.frombuffer(b, np.uint8) for i, b in enumerate(inputs)}
    sources: dict[tuple[int, int], tuple[str, int]] = {}
    for e in graph.InputEdges:
        sources[(e.ToNodeIndex, e.ToNodeInputIndex)] = ("input", e.GraphInputIndex)
    for e in graph.IntermediateEdges:
        sources[(e.ToNodeIndex, e.ToNodeInputIndex)] = ("node", e.FromNodeIndex)
    for n in graph.order:
        args = [values[sources[(n, slot)]] for slot in range(len(ops[n].input_fields))]
        values[("node", n)] = engine.execute(ops[n], args)
    ordered = sorted(graph.OutputEdges, key=lambda e: e.GraphOutputIndex)
    return [values[("node", e.FromNodeIndex)] for e in ordered]
