"""Building DML_GRAPH_DESC dicts in tests, and the oracle: a graph's nodes run one by one through
``Engine.execute`` (no graph code involved), each node's output bytes handed to its readers."""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from service.descriptors.graph import GraphDesc
from service.engine import Engine
from service.descriptors.graph import parse_graph
from tests.helpers import tensor

SIZES = (3, 5, 337)   # not a multiple of a 16-byte unit: the packed kernels' ragged tail


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


def _sources(graph: GraphDesc) -> dict[tuple[int, int], tuple[str, int]]:
    """What feeds each node input: ("input", graph input) or ("node", the producing node)."""
    sources: dict[tuple[int, int], tuple[str, int]] = {}
    for e in graph.InputEdges:
        sources[(e.ToNodeIndex, e.ToNodeInputIndex)] = ("input", e.GraphInputIndex)
    for e in graph.IntermediateEdges:
        sources[(e.ToNodeIndex, e.ToNodeInputIndex)] = ("node", e.FromNodeIndex)
    return sources


def node_by_node(engine: Engine, graph: GraphDesc, inputs: list[bytes]) -> list[np.ndarray]:
    """The graph's outputs as its nodes give them one request at a time."""
    ops = graph.operators
    values: dict[tuple[str, int], np.ndarray] = {("input", i): np.frombuffer(b, np.uint8) for i, b in enumerate(inputs)}
    sources = _sources(graph)
    for n in graph.order:
        args = [values[sources[(n, slot)]] for slot in range(len(ops[n].input_fields))]
        values[("node", n)] = engine.execute(ops[n], args)
    ordered = sorted(graph.OutputEdges, key=lambda e: e.GraphOutputIndex)
    return [values[("node", e.FromNodeIndex)] for e in ordered]


async def node_by_node_async(run: Callable[[int, list[bytes]], Awaitable[bytes]], graph: GraphDesc, inputs: list[bytes]) -> dict[str, bytes]:
    """The graph's outputs by name as ``run(node index, its input buffers)`` gives each node's output
    buffer, one request at a time (a device worker job, a /v1 request): no graph code involved."""
    values: dict[tuple[str, int], bytes] = {("input", i): b for i, b in enumerate(inputs)}
    sources = _sources(graph)
    for n in graph.order:
        args = [values[sources[(n, slot)]] for slot in range(len(graph.operators[n].input_fields))]
        values[("node", n)] = await run(n, args)
    names = graph.output_names()
    return {names[e.GraphOutputIndex]: values[("node", e.FromNodeIndex)] for e in sorted(graph.OutputEdges, key=lambda e: e.GraphOutputIndex)}


def sample(dtype, sizes=SIZES, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(sizes) * 3).astype(dtype)
    flat = x.reshape(-1)
    flat[:8] = [np.nan, np.inf, -np.inf, -0.0, 0.0, np.finfo(dtype).tiny / 4, 0.4, -0.4]  # subnormal, edges
    return x


def linear_tanh_shrink(dtype, alpha=1.7) -> GraphDesc:
    return parse_graph(linear_tanh_shrink_dict(dtype, alpha))


def linear_tanh_shrink_dict(dtype, alpha=1.7) -> dict:
    return chain([
        activation("LINEAR", dtype, SIZES, Alpha=alpha, Beta=-0.3),
        activation("SCALED_TANH", dtype, SIZES, Alpha=1.3, Beta=0.9),
        activation("SHRINK", dtype, SIZES, Bias=0.1, Threshold=0.4),
    ])


def shared_intermediate(dtype, sizes=SIZES) -> GraphDesc:
    return parse_graph(shared_intermediate_dict(dtype, sizes))


def shared_intermediate_dict(dtype, sizes=SIZES) -> dict:
    """x -> LINEAR (n0); n0 -> SIGMOID (n1) -> output "s"; PARAMETERIZED_RELU(n0, n1) (n2) -> output "p";
    n0 is also output "l": one value read by two nodes and leaving the graph."""
    return {
        "InputCount": 1, "OutputCount": 3,
        "Nodes": [
            {"Operator": activation("LINEAR", dtype, sizes, Alpha=-1.25, Beta=0.5)},
            {"Operator": activation("SIGMOID", dtype, sizes)},
            {"Operator": activation("PARAMETERIZED_RELU", dtype, sizes, ("InputTensor", "SlopeTensor"))},
        ],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}],
        "IntermediateEdges": [
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0},
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 0},
            {"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 1},
        ],
        "OutputEdges": [
            {"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "s"},
            {"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "GraphOutputIndex": 1, "Name": "p"},
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "GraphOutputIndex": 2, "Name": "l"},
        ],
    }


def prelu_softmax(dtype, sizes=(2, 3, 64), axes=(1, 2)) -> dict:
    """x, slope -> PARAMETERIZED_RELU -> SOFTMAX1 (Axes) -> y."""
    return {
        "InputCount": 2, "OutputCount": 1,
        "Nodes": [
            {"Operator": activation("PARAMETERIZED_RELU", dtype, sizes, ("InputTensor", "SlopeTensor"))},
            {"Operator": activation("SOFTMAX1", dtype, sizes, Axes=list(axes))},
        ],
        "InputEdges": [
            {"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"},
            {"GraphInputIndex": 1, "ToNodeIndex": 0, "ToNodeInputIndex": 1, "Name": "slope"},
        ],
        "IntermediateEdges": [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0}],
        "OutputEdges": [{"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"}],
    }


def broadcast_prelu(dtype, sizes=(6, 40)) -> dict:
    """x -> TANH -> PARAMETERIZED_RELU (its SlopeTensor a row broadcast over the rows: strides (0, 1),
    so no fused kernel takes it) -> RELU -> y: a graph that runs node by node, and says why."""
    prelu = activation("PARAMETERIZED_RELU", dtype, sizes, ("InputTensor",))
    prelu["SlopeTensor"] = tensor(dtype, sizes, (0, 1))
    return {
        "InputCount": 2, "OutputCount": 1,
        "Nodes": [{"Operator": activation("TANH", dtype, sizes)}, {"Operator": prelu}, {"Operator": activation("RELU", dtype, sizes)}],
        "InputEdges": [
            {"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"},
            {"GraphInputIndex": 1, "ToNodeIndex": 1, "ToNodeInputIndex": 1, "Name": "slope"},
        ],
        "IntermediateEdges": [
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0},
            {"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 0},
        ],
        "OutputEdges": [{"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"}],
    }
