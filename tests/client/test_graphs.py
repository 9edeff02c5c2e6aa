"""client.graphs against an httpx.MockTransport: the DML_GRAPH_DESC a builder writes, the request frame
of a compiled graph's call (the graph's text written once, arrays by input name), and its answer read
back by output name; a malformed answer is a ProtocolError."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from client import Client, ProtocolError
from client.codec import HEADER_LENGTH


def _builder(handler=lambda request: httpx.Response(500)):
    vk = Client("http://vkact.test", transport=httpx.MockTransport(handler))
    return vk, vk.graph()


def test_the_graph_desc_keeps_what_leads_to_the_outputs():
    _, g = _builder()
    x, s = g.input("x", (2, 3)), g.input("s", (2, 3))
    g.relu(x)                                   # leads nowhere: left out
    h = g.linear(x, alpha=2.0)
    p = g.parameterized_relu(h, s)
    f = g.compile({"p": p}, h=h)
    d = f.desc
    assert [n["Operator"]["Type"] for n in d["Nodes"]] == ["DML_OPERATOR_ACTIVATION_LINEAR", "DML_OPERATOR_ACTIVATION_PARAMETERIZED_RELU"]
    assert d["InputCount"] == 2 and d["OutputCount"] == 2
    assert d["InputEdges"] == [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"},
                               {"GraphInputIndex": 1, "ToNodeIndex": 1, "ToNodeInputIndex": 1, "Name": "s"}]
    assert d["IntermediateEdges"] == [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0}]
    assert [(e["FromNodeIndex"], e["GraphOutputIndex"], e["Name"]) for e in d["OutputEdges"]] == [(1, 0, "p"), (0, 1, "h")]
    assert d["Nodes"][0]["Operator"]["Alpha"] == 2.0 and d["Nodes"][0]["Operator"]["Beta"] == 0.0   # DirectML's default, sent
    assert f.outputs == ("p", "h") and list(f.inputs) == ["x", "s"]


def test_a_call_sends_the_graph_and_reads_the_outputs_by_name():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        n = int(request.headers[HEADER_LENGTH])
        head, tail = json.loads(request.content[:n]), request.content[n:]
        seen.append(head)
        x = np.frombuffer(tail[: head["Inputs"]["x"]["binary_data_size"]], np.float16)
        y = (x * 2).astype(np.float16).tobytes().ljust(8, b"\0")   # 3 FLOAT16 values: a 4-byte-rounded buffer
        desc = {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT16", "Sizes": [3], "TotalTensorSizeInBytes": 8}
        body = json.dumps({"Compiled": {"Fused": True, "Dispatches": 1, "Nodes": 1, "Notes": []},
                           "OutputTensors": {"y": desc}, "Outputs": {"y": {"binary_data_size": 8}}}).encode()
        return httpx.Response(200, content=body + y, headers={HEADER_LENGTH: str(len(body))})

    _, g = _builder(handler)
    f = g.compile(y=g.linear(g.input("x", (3,), np.float16), alpha=2.0))
    for _ in range(2):
        out = f(x=np.array([1, -2, 3], np.float16))
        np.testing.assert_array_equal(out["y"], np.array([2, -4, 6], np.float16))
    assert seen[0] == seen[1] and seen[0]["Graph"] == f.desc and seen[0]["ResponseEncoding"] == "binary"
    assert seen[0]["Inputs"] == {"x": {"binary_data_size": 8}}
    assert f.report == {"Fused": True, "Dispatches": 1, "Nodes": 1, "Notes": []}


@pytest.mark.parametrize("reply", [b"{}", b"[1]", json.dumps({"Compiled": {}, "OutputTensors": {}, "Outputs": {}}).encode()])
def test_a_malformed_answer_is_a_protocol_error(reply):
    _, g = _builder(lambda request: httpx.Response(200, content=reply))
    f = g.compile(y=g.relu(g.input("x", (2,))))
    with pytest.raises(ProtocolError):
        f(x=np.ones(2, np.float32), encoding="json")
