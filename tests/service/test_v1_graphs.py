"""/v1/execute's Graph form against a real server on lavapipe. The oracle is independent of every graph
code path: each node sent as its own /v1/execute request, one by one, its output bytes handed to the
nodes that read it. Answers must be bit-identical, in every encoding; bad graphs and inputs are 4xx
naming their field, and the service serves on."""
from __future__ import annotations

import asyncio
import base64
import copy
import json

import numpy as np
import pytest

from client.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH, decode_data, encode_frame
from service.descriptors.graph import parse_graph
from tests.graph_helpers import (
    SIZES,
    activation,
    broadcast_prelu,
    chain,
    linear_tanh_shrink_dict,
    node_by_node_async,
    prelu_softmax,
    sample,
    shared_intermediate_dict,
)

B64 = lambda b: {"base64": base64.b64encode(bytes(b)).decode()}  # noqa: E731


def buffers(graph_json: dict, arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """Each input's buffer: its elements, zero-padded to its TotalTensorSizeInBytes (FLOAT16 rounds to 4 bytes)."""
    graph = parse_graph(graph_json)
    descs = {name: graph.input_desc(i) for i, name in enumerate(graph.input_names())}
    return {name: a.tobytes().ljust(descs[name].total_bytes, b"\0") for name, a in arrays.items()}


def one_by_one(http, graph_json: dict, arrays: dict[str, np.ndarray]) -> dict[str, bytes]:
    """The graph's outputs by name, each node its own /v1/execute request (base64 both ways)."""
    graph = parse_graph(graph_json)
    inputs = buffers(graph_json, arrays)

    async def run(n: int, args: list[bytes]) -> bytes:
        op = graph_json["Nodes"][n]["Operator"]
        fields = graph.operators[n].input_fields
        response = http.post("/v1/execute", json={"Operator": op, "Inputs": {f: B64(a) for f, a in zip(fields, args)}})
        assert response.status_code == 200, response.text
        return base64.b64decode(response.json()["Output"]["base64"])

    return asyncio.run(node_by_node_async(run, graph, [inputs[name] for name in graph.input_names()]))


def post_graph(http, graph_json: dict, inputs: dict[str, np.ndarray], encoding: str, **extra):
    """A Graph request with ``inputs`` in ``encoding``; the answer's outputs as bytes by name, and its head."""
    if encoding == "binary":
        raw = buffers(graph_json, inputs)
        header = {"Graph": graph_json, "Inputs": {k: {"binary_data_size": len(v)} for k, v in raw.items()}, **extra}
        parts, n = encode_frame(header, list(raw.values()))
        response = http.post("/v1/execute", content=b"".join(parts), headers={HEADER_LENGTH: str(n), "Content-Type": BINARY_CONTENT_TYPE})
    else:
        data = {k: B64(buffers(graph_json, {k: v})[k]) if encoding == "base64" else [_json_value(x) for x in v.reshape(-1).tolist()] for k, v in inputs.items()}
        response = http.post("/v1/execute", json={"Graph": graph_json, "Inputs": data, **extra})
    assert response.status_code == 200, response.text
    if HEADER_LENGTH in response.headers:
        n = int(response.headers[HEADER_LENGTH])
        head, tail = json.loads(response.content[:n]), response.content[n:]
    else:
        head, tail = response.json(), b""
    outputs, offset = {}, 0
    for name, data in head["Outputs"].items():
        desc = head["OutputTensors"][name]
        dtype = np.dtype({"DML_TENSOR_DATA_TYPE_FLOAT32": np.float32, "DML_TENSOR_DATA_TYPE_FLOAT16": np.float16}[desc["DataType"]])
        binary = None
        if "binary_data_size" in data:
            binary = memoryview(tail)[offset : offset + data["binary_data_size"]]
            offset += data["binary_data_size"]
        span = int(np.prod(desc["Sizes"])) * dtype.itemsize   # packed outputs here
        outputs[name] = decode_data(data, dtype, desc["TotalTensorSizeInBytes"], span, name, binary).tobytes()
    assert offset == len(tail)
    return outputs, head


def _json_value(x: float):
    return x if np.isfinite(x) else ("NaN" if np.isnan(x) else ("Infinity" if x > 0 else "-Infinity"))


def assert_same(got: dict[str, bytes], expected: dict[str, bytes], dtype, exact_bits: bool) -> None:
    assert list(got) == list(expected)
    for name in expected:
        if exact_bits:
            assert got[name] == expected[name], name
        else:   # JSON numbers: every value exact, a NaN's payload aside
            a, b = np.frombuffer(got[name], dtype), np.frombuffer(expected[name], dtype)
            np.testing.assert_array_equal(a, b)
            assert np.array_equal(np.signbit(a[~np.isnan(a)]), np.signbit(b[~np.isnan(b)]))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("encoding", ["binary", "base64", "json"])
def test_linear_scaled_tanh_shrink_is_its_nodes_one_by_one(http, dtype, encoding):
    graph_json = linear_tanh_shrink_dict(dtype)
    x = sample(dtype)
    expected = one_by_one(http, graph_json, {"x": x})
    got, head = post_graph(http, graph_json, {"x": x}, encoding)
    assert_same(got, expected, dtype, exact_bits=encoding != "json")
    assert head["Compiled"] == {"Fused": True, "Dispatches": 1, "Nodes": 3, "Notes": []}
    assert head["OutputTensors"]["y"]["Sizes"] == list(SIZES)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["f32", "f16"])
def test_parameterized_relu_then_softmax1_over_axes(http, dtype):
    sizes = (2, 3, 64)
    graph_json = prelu_softmax(dtype, sizes, axes=(1, 2))
    x = sample(dtype, sizes)
    x.reshape(-1)[:8] = np.linspace(-2, 2, 8)   # softmax: NaN/inf would make whole rows NaN
    slope = (np.random.default_rng(1).random(sizes) * 0.5).astype(dtype)
    expected = one_by_one(http, graph_json, {"x": x, "slope": slope})
    got, head = post_graph(http, graph_json, {"slope": slope, "x": x}, "base64")   # names, not order, bind inputs
    assert_same(got, expected, dtype, exact_bits=True)
    assert head["Compiled"]["Dispatches"] == 1   # PARAMETERIZED_RELU runs in SOFTMAX1's loads (a prologue)


def test_two_outputs_and_a_shared_intermediate(http):
    graph_json = shared_intermediate_dict(np.float32)
    x = sample(np.float32)
    expected = one_by_one(http, graph_json, {"x": x})
    for encoding in ("binary", "base64"):
        got, head = post_graph(http, graph_json, {"x": x}, encoding)
        assert list(got) == ["s", "p", "l"]           # the graph outputs' index order
        assert_same(got, expected, np.float32, exact_bits=True)
        assert head["Compiled"]["Fused"] is True


def test_a_graph_that_cannot_fuse_runs_node_by_node_and_says_why(http):
    graph_json = broadcast_prelu(np.float32)
    x = sample(np.float32, (6, 40))
    slope = np.linspace(0.1, 0.9, 40, dtype=np.float32)
    expected = one_by_one(http, graph_json, {"x": x, "slope": slope})
    got, head = post_graph(http, graph_json, {"x": x, "slope": slope}, "binary")
    assert_same(got, expected, np.float32, exact_bits=True)
    compiled = head["Compiled"]
    assert compiled["Fused"] is False and compiled["Dispatches"] == 3
    assert any("Nodes[1]" in note and "broadcast" in note for note in compiled["Notes"])


def _refused(http, body: dict, status: int, field: str, words: str = "") -> None:
    response = http.post("/v1/execute", json=body)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["field"] == field, error
    assert words in error["error"], error


def test_bad_graphs_are_422s_naming_the_field(http):
    x = {"x": B64(sample(np.float32).tobytes())}
    good = linear_tanh_shrink_dict(np.float32)

    cycle = copy.deepcopy(good)   # n1 -> n2 and n2 -> n1: n1's input bound twice, so rebind it from n2
    cycle["IntermediateEdges"][0] = {"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0}
    cycle["OutputEdges"][0]["FromNodeIndex"] = 0
    _refused(http, {"Graph": cycle, "Inputs": x}, 422, "Graph.IntermediateEdges[0]", "cycle")

    out_of_range = copy.deepcopy(good)
    out_of_range["IntermediateEdges"][1]["ToNodeIndex"] = 7
    _refused(http, {"Graph": out_of_range, "Inputs": x}, 422, "Graph.IntermediateEdges[1].ToNodeIndex", "3 node(s)")

    too_many = chain([activation("RELU", np.float32, SIZES)] * 65)   # VKACT_MAX_GRAPH_NODES is 64 by default
    _refused(http, {"Graph": too_many, "Inputs": x}, 422, "Graph.Nodes", "VKACT_MAX_GRAPH_NODES")

    bad_scalar = copy.deepcopy(good)
    bad_scalar["Nodes"][1]["Operator"]["Alpha"] = "high"
    _refused(http, {"Graph": bad_scalar, "Inputs": x}, 422, "Graph.Nodes[1].Operator.Alpha")

    _refused(http, {"Graph": [1], "Inputs": x}, 422, "Graph")
    _refused(http, {"Graph": good, "Operator": good["Nodes"][0]["Operator"], "Inputs": x}, 422, "Graph", "not both")
    _refused(http, {"Graph": good, "Inputs": x, "InPlace": True}, 422, "InPlace")


def test_bad_inputs_and_sizes_are_4xx_naming_them(http):
    good = linear_tanh_shrink_dict(np.float32)
    data = sample(np.float32).tobytes()
    _refused(http, {"Graph": good, "Inputs": {"z": B64(data)}}, 400, "Inputs.z", "no input 'z'")
    _refused(http, {"Graph": good, "Inputs": {"x": B64(data), "z": B64(data)}}, 400, "Inputs.z")
    _refused(http, {"Graph": good, "Inputs": {}}, 400, "Inputs.x", "missing")
    _refused(http, {"Graph": good, "Inputs": {"x": B64(data[:-4])}}, 400, "Inputs.x", "TotalTensorSizeInBytes")
    _refused(http, {"Graph": good, "Inputs": {"x": [1.0, 2.0]}}, 400, "Inputs.x")

    huge = copy.deepcopy(good)   # a tensor no device binds: refused before any data is read
    for node in huge["Nodes"]:
        for name in ("InputTensor", "OutputTensor"):
            node["Operator"][name] = {**node["Operator"]["InputTensor"], "TotalTensorSizeInBytes": 1 << 40}
    _refused(http, {"Graph": huge, "Inputs": {"x": B64(data)}}, 422, "Graph.Nodes[0].Operator.InputTensor.TotalTensorSizeInBytes", "binds at most")

    swollen = copy.deepcopy(good)   # the last output declared far beyond the data sent
    swollen["Nodes"][2]["Operator"]["OutputTensor"] = {**swollen["Nodes"][2]["Operator"]["InputTensor"], "TotalTensorSizeInBytes": 1 << 24}
    _refused(http, {"Graph": swollen, "Inputs": {"x": B64(data)}}, 422, "Graph.Nodes[2].Operator.OutputTensor.TotalTensorSizeInBytes")

    # still serving, and the failures and the success counted against "graph"
    post_graph(http, good, {"x": sample(np.float32)}, "base64")
    metrics = http.get("/metrics").text
    assert 'vkact_requests_total{code="200",operator="graph"}' in metrics
    assert 'vkact_requests_total{code="400",operator="graph"}' in metrics
