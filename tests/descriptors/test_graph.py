"""DML_GRAPH_DESC validation: each broken rule is a DescriptorError (422) naming its field from
``Graph``; a valid graph parses, with its names and evaluation order."""
from __future__ import annotations

import copy

import pytest

from service.descriptors.graph import parse_graph
from service.errors import DescriptorError
from tests.graph_helpers import activation, chain

SIZES = (2, 8)


def three() -> dict:
    return chain([activation("LINEAR", "float32", SIZES), activation("TANH", "float32", SIZES), activation("RELU", "float32", SIZES)])


def prelu_graph() -> dict:
    return {
        "InputCount": 2, "OutputCount": 1,
        "Nodes": [{"Operator": activation("PARAMETERIZED_RELU", "float32", SIZES, ("InputTensor", "SlopeTensor"))}],
        "InputEdges": [
            {"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"},
            {"GraphInputIndex": 1, "ToNodeIndex": 0, "ToNodeInputIndex": 1, "Name": "slope"},
        ],
        "OutputEdges": [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "y"}],
    }


def test_a_valid_graph_parses():
    g = parse_graph(three())
    assert g.order == (0, 1, 2) and g.input_names() == ("x",) and g.output_names() == ("y",)
    assert g.input_desc(0).Sizes == SIZES and g.output_desc(0).DataType.value == "DML_TENSOR_DATA_TYPE_FLOAT32"


def edit(base, change):
    data = copy.deepcopy(base())
    change(data)
    return data


def _set(path, value):
    def change(data):
        target = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    return change


CASES = {
    "intermediate node out of range": (three, _set(("IntermediateEdges", 1, "ToNodeIndex"), 7), "Graph.IntermediateEdges[1].ToNodeIndex"),
    "input index beyond InputCount": (three, _set(("InputEdges", 0, "GraphInputIndex"), 1), "Graph.InputEdges[0].GraphInputIndex"),
    "node input index beyond its inputs": (three, _set(("IntermediateEdges", 0, "ToNodeInputIndex"), 1), "Graph.IntermediateEdges[0].ToNodeInputIndex"),
    "second output of an activation": (three, _set(("OutputEdges", 0, "FromNodeOutputIndex"), 1), "Graph.OutputEdges[0].FromNodeOutputIndex"),
    "node input bound twice": (
        three,
        lambda d: d["InputEdges"].append({"GraphInputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0, "Name": "x"}),
        "Graph.IntermediateEdges[0].ToNodeInputIndex",
    ),
    "node input unbound": (prelu_graph, lambda d: (d["InputEdges"].pop(), d.update(InputCount=1)), "Graph.Nodes[0].Operator.SlopeTensor"),
    "graph output produced twice": (
        three,
        lambda d: d["OutputEdges"].append({"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0}),
        "Graph.OutputEdges[1].GraphOutputIndex",
    ),
    "graph output never produced": (three, _set(("OutputCount",), 2), "Graph.OutputCount"),
    "graph input unused": (three, _set(("InputCount",), 2), "Graph.InputCount"),
    "node output unused": (three, lambda d: d["OutputEdges"].__setitem__(0, {**d["OutputEdges"][0], "FromNodeIndex": 1}), "Graph.Nodes[2]"),
    "cycle": (
        three,
        lambda d: d["IntermediateEdges"].append({"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0})
        or d["InputEdges"].clear() or d.update(InputCount=1) or d["InputEdges"].append(
            {"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}),
        "Graph.IntermediateEdges[2].ToNodeInputIndex",   # node 0's input bound twice: found before the cycle
    ),
    "types disagree along an edge": (
        three, _set(("Nodes", 1, "Operator", "InputTensor", "DataType"), "DML_TENSOR_DATA_TYPE_FLOAT16"), "Graph.IntermediateEdges[0].ToNodeInputIndex",
    ),
    "sizes disagree along an edge": (
        three,
        lambda d: [d["Nodes"][i]["Operator"]["InputTensor"].__setitem__("Sizes", [4, 4]) for i in (1, 2)],
        "Graph.IntermediateEdges[0].ToNodeInputIndex",
    ),
    "one graph input, two descriptors": (
        prelu_graph,
        lambda d: (d["InputEdges"][1].update(GraphInputIndex=0, Name="x"), d.update(InputCount=1),
                   d["Nodes"][0]["Operator"]["SlopeTensor"].update(Strides=[0, 1])),
        "Graph.InputEdges[1].ToNodeInputIndex",
    ),
    "one graph input, two names": (
        prelu_graph, lambda d: (d["InputEdges"][1].update(GraphInputIndex=0, Name="z"), d.update(InputCount=1)), "Graph.InputEdges[1].Name",
    ),
    "two outputs, one name": (
        three,
        lambda d: (d["OutputEdges"].append({"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 1, "Name": "y"}), d.update(OutputCount=2)),
        "Graph.OutputEdges[1].Name",
    ),
    "a node's own field": (three, _set(("Nodes", 0, "Operator", "Alpha"), "nan"), "Graph.Nodes[0].Operator.Alpha"),
    "an unknown operator": (three, _set(("Nodes", 2, "Operator", "Type"), "DML_OPERATOR_GEMM"), "Graph.Nodes[2].Operator.Type"),
    "no nodes": (three, _set(("Nodes",), []), "Graph.Nodes"),
    "an unknown field": (three, _set(("Extra",), 1), "Graph.Extra"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_broken_rules_name_their_field(case):
    base, change, field = CASES[case]
    with pytest.raises(DescriptorError) as err:
        parse_graph(edit(base, change))
    assert err.value.status == 422
    if field is not None:
        assert err.value.field == field, err.value.message
    else:
        assert err.value.field.startswith("Graph.")


def test_a_pure_cycle_is_named():
    """Two nodes reading each other (their inputs bound once each, by intermediate edges)."""
    data = {
        "InputCount": 1, "OutputCount": 1,
        "Nodes": [{"Operator": activation("PARAMETERIZED_RELU", "float32", SIZES, ("InputTensor", "SlopeTensor"))},
                  {"Operator": activation("RELU", "float32", SIZES)}],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0}],
        "IntermediateEdges": [
            {"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 1},
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0},
        ],
        "OutputEdges": [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0}],
    }
    with pytest.raises(DescriptorError) as err:
        parse_graph(data)
    assert err.value.field == "Graph.IntermediateEdges[0]" and "cycle" in err.value.message


def test_too_many_nodes_before_parsing():
    data = chain([activation("RELU", "float32", SIZES)] * 5)
    with pytest.raises(DescriptorError) as err:
        parse_graph(data, max_nodes=4)
    assert err.value.field == "Graph.Nodes" and "VKACT_MAX_GRAPH_NODES" in err.value.message
    assert len(parse_graph(data, max_nodes=5).Nodes) == 5
