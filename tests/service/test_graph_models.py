"""Graphs as models through Triton's model repository extension, with tritonclient (HTTP and gRPC) against
a running service: load (the graph's JSON as the config string), the index, readiness, metadata and
config named by the graph's edges, statistics per graph model, unload; bad graphs refused naming the
field, the limit of loaded graph models, names that would shadow an operator model. Inference of loaded
graphs: test_graph_infer.py."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.graph_helpers import SIZES, activation, chain
from tests.helpers import elements_beyond_the_device, tensor
from tests.service.conftest import Server, start_server, stop_server
from tests.service.test_v2 import address

MAX_MODELS = 3  # the limit this module's server runs with (VKACT_MAX_GRAPH_MODELS)


def lts(dtype=np.float32, alpha: float = 1.7) -> dict:
    """LINEAR -> SCALED_TANH -> SHRINK, input "x", output "y"."""
    return chain([
        activation("LINEAR", dtype, SIZES, Alpha=alpha, Beta=-0.3),
        activation("SCALED_TANH", dtype, SIZES, Alpha=1.3, Beta=0.9),
        activation("SHRINK", dtype, SIZES, Bias=0.1, Threshold=0.4),
    ])


@pytest.fixture(scope="module")
def graph_server() -> Iterator[Server]:
    s = start_server(max_graph_models=MAX_MODELS)
    yield s
    metrics = httpx.get(f"{s.url}/metrics").text
    stop_server(s)
    assert 'vkact_errors_total{code="500"}' not in metrics, metrics


@pytest.fixture(scope="module")
def clients(graph_server) -> Iterator[tuple[triton.InferenceServerClient, tg.InferenceServerClient]]:
    h, g = triton.InferenceServerClient(address(graph_server)), tg.InferenceServerClient(graph_server.grpc)
    yield h, g
    h.close()
    g.close()


@pytest.fixture
def http(graph_server) -> Iterator[httpx.Client]:
    with graph_server.client() as c:
        yield c


@pytest.fixture(autouse=True)
def unload_all(clients, http) -> Iterator[None]:
    yield
    for entry in http.post("/v2/repository/index").json():
        if entry["name"] not in MODELS:
            clients[0].unload_model(entry["name"])


def refused(call) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        call()
    return str(err.value.status()), err.value.message()


BAD_REQUEST = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_describe_unload(clients, http, protocol):
    client = clients[0] if protocol == "http" else clients[1]
    client.load_model("lts", config=json.dumps(lts()))
    assert client.is_model_ready("lts")
    index = {m["name"]: m for m in http.post("/v2/repository/index").json()}
    assert index["lts"] == {"name": "lts", "version": "1", "state": "READY", "reason": ""}
    assert set(index) == {*MODELS, "lts"}  # the operator models are all still there
    grpc_index = [(m.name, m.state) for m in clients[1].get_model_repository_index().models]
    assert ("lts", "READY") in grpc_index and len(grpc_index) == len(MODELS) + 1

    meta = http.get("/v2/models/lts").json()
    shape = list(SIZES)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": shape}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": shape}]
    assert meta["parameters"]["graph_fused"] == "true" and meta["parameters"]["graph_dispatches"] == "1"
    grpc_meta = clients[1].get_model_metadata("lts")
    assert [(t.name, t.datatype, list(t.shape)) for t in grpc_meta.inputs] == [("x", "FP32", shape)]
    assert [(t.name, t.datatype, list(t.shape)) for t in grpc_meta.outputs] == [("y", "FP32", shape)]
    config = clients[1].get_model_config("lts").config
    assert [(t.name, list(t.dims)) for t in config.input] == [("x", shape)] and config.max_batch_size == 0
    assert config.parameters["graph_fused"].string_value == "true"
    assert http.get("/v2/models/lts/config").json()["output"][0]["data_type"] == "TYPE_FP32"
    (stats,) = clients[0].get_inference_statistics("lts")["model_stats"]
    assert stats["name"] == "lts" and stats["inference_count"] == 0
    assert "lts" in {s.name for s in clients[1].get_inference_statistics().model_stats}

    client.unload_model("lts")
    assert not client.is_model_ready("lts")
    assert "lts" not in {m["name"] for m in http.post("/v2/repository/index").json()}
    assert refused(lambda: client.get_model_metadata("lts"))[0] == NOT_FOUND[protocol]
    assert refused(lambda: client.unload_model("lts"))[0] == NOT_FOUND[protocol]   # unknown: 4xx, not OK
    assert refused(lambda: client.get_inference_statistics("lts"))[0] == NOT_FOUND[protocol]
    assert refused(lambda: client.load_model("lts"))[0] == NOT_FOUND[protocol]     # no config: nothing to load


def test_a_graph_that_cannot_fuse_says_why(clients, http):
    strided = chain([activation("RELU", np.float32, (4, 6)), {**activation("SIGMOID", np.float32, (4, 6)), "OutputTensor": tensor(np.float32, (4, 6), (1, 4))}])
    transposed = {"InputTensor": tensor(np.float32, (4, 6), (1, 4)), "OutputTensor": tensor(np.float32, (4, 6))}
    strided["Nodes"].append({"Operator": {**activation("TANH", np.float32, (4, 6)), **transposed}})  # reads it transposed
    strided["IntermediateEdges"].append({"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 0})
    strided["OutputEdges"][0]["FromNodeIndex"] = 2
    clients[0].load_model("strided", config=json.dumps(strided))
    params = http.get("/v2/models/strided").json()["parameters"]
    assert params["graph_fused"] == "false" and params["graph_notes"], params
    assert clients[1].get_model_config("strided").config.parameters["graph_notes"].string_value == params["graph_notes"]


BAD_GRAPHS = [
    ("bad edge", lambda g: g["IntermediateEdges"][1].update(ToNodeIndex=7), "Graph.IntermediateEdges[1].ToNodeIndex"),
    ("unknown field", lambda g: g["Nodes"][0]["Operator"].update(Alpah=1.0), "Graph.Nodes[0].Operator"),
    ("bad type", lambda g: g["Nodes"][2]["Operator"].update(Threshold="x"), "Graph.Nodes[2].Operator"),
    ("output unused", lambda g: g["OutputEdges"][0].update(GraphOutputIndex=1), "Graph.OutputEdges[0].GraphOutputIndex"),
    ("strided input", lambda g: g["Nodes"][0]["Operator"].update(InputTensor=tensor(np.float32, SIZES, (1, 3, 15)), OutputTensor=tensor(np.float32, SIZES)), "Graph.InputEdges[0]"),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("what,spoil,field", BAD_GRAPHS, ids=[b[0] for b in BAD_GRAPHS])
def test_a_bad_graph_is_refused_naming_the_field(clients, http, protocol, what, spoil, field):
    client = clients[0] if protocol == "http" else clients[1]
    graph = lts()
    spoil(graph)
    status, message = refused(lambda: client.load_model("bad", config=json.dumps(graph)))
    assert status == BAD_REQUEST[protocol] and field in message, message
    assert "bad" not in {m["name"] for m in http.post("/v2/repository/index").json()}


def test_hostile_loads(clients, http, graph_server):
    h, g = clients
    graph = json.dumps(lts())
    for config, piece in [("not json", "config"), ("[" * 200_000, "nested too deeply"), ("[1, 2]", "config"), ("{}", "Graph.InputCount")]:
        status, message = refused(lambda: h.load_model("bad", config=config))
        assert status == "400" and piece in message, message
    # the config parameter not a string; other parameters; bodies that are not the protocol's
    for body in ({"parameters": {"config": {"InputCount": 1}}}, {"parameters": {"config": 5}}, {"parameters": {"file:1/model": "x"}}, {"parameters": []}):
        response = http.post("/v2/repository/models/bad/load", json=body)
        assert response.status_code == 400 and "error" in response.json(), response.text
    too_many = lts()
    too_many["Nodes"] = too_many["Nodes"] * 30   # 90 nodes: the default limit is 64
    status, message = refused(lambda: g.load_model("bad", config=json.dumps(too_many)))
    assert status == "StatusCode.INVALID_ARGUMENT" and "Graph.Nodes" in message and "VKACT_MAX_GRAPH_NODES" in message
    huge = json.dumps({**lts(), "Padding": " " * (1 << 20)})
    assert http.post("/v2/repository/models/bad/load", json={"parameters": {"config": huge}}).status_code == 413
    assert refused(lambda: g.load_model("bad", config=huge))[0] == "StatusCode.RESOURCE_EXHAUSTED"
    # names: never an operator model's, nothing a URL or a label cannot carry
    for name, piece in [("relu", "operator model"), ("stats", "name"), (".hidden", "name"), ("a" * 200, "name"), ("a b", "name")]:
        status, message = refused(lambda: g.load_model(name, config=graph))
        assert status == "StatusCode.INVALID_ARGUMENT" and piece in message, (name, message)
    for config in ("[" * 200_000, "{" * 50_000):   # an operator model's config nested too deeply: a 400 too
        assert refused(lambda: g.load_model("relu", config=config))[0] == "StatusCode.INVALID_ARGUMENT"
        assert refused(lambda: h.load_model("relu", config=config))[0] == "400"
    assert http.get("/v2/models/relu").json()["platform"] == "vkact_directml"   # still the operator
    assert {m["name"] for m in http.post("/v2/repository/index").json()} == set(MODELS)
    assert http.get("/v2/health/ready").status_code == 200


def test_a_graph_beyond_the_device_is_refused_at_load(clients, http):
    """Tensors past the device's binding limit (maxStorageBufferRange less 16) fail at load, named,
    not at every inference (before the buffer pool's limit: the first node's input is checked first)."""
    h, g = clients
    n = elements_beyond_the_device(4)
    big = chain([activation("RELU", np.float32, (n,)), activation("SIGMOID", np.float32, (n,))])
    for client, status in ((h, "400"), (g, "StatusCode.INVALID_ARGUMENT")):
        code, message = refused(lambda: client.load_model("big", config=json.dumps(big)))
        assert code == status and "Graph.Nodes[0].Operator.InputTensor" in message, message
    assert "big" not in {m["name"] for m in http.post("/v2/repository/index").json()}


def test_the_limit_of_loaded_graph_models(clients, http):
    h, g = clients
    for k in range(MAX_MODELS):
        h.load_model(f"g{k}", config=json.dumps(lts(alpha=1.0 + k)))
    status, message = refused(lambda: g.load_model("one_more", config=json.dumps(lts())))
    assert status == "StatusCode.INVALID_ARGUMENT" and "VKACT_MAX_GRAPH_MODELS" in message, message
    assert refused(lambda: h.load_model("one_more", config=json.dumps(lts())))[0] == "400"
    h.load_model("g0", config=json.dumps(lts(np.float16)))   # a reload takes no more room: it replaces
    assert http.get("/v2/models/g0").json()["inputs"][0]["datatype"] == "FP16"
    h.unload_model("g1")
    g.load_model("one_more", config=json.dumps(lts()))
    assert {m["name"] for m in http.post("/v2/repository/index").json()} - set(MODELS) == {"g0", "g2", "one_more"}


def test_loads_at_once(clients, http, graph_server):
    """Loads of one name at once all succeed (one at a time, the last wins); loads of more names at
    once than the limit: as many succeed as it allows, the others are refused with the setting named."""
    import asyncio

    import tritonclient.grpc.aio as tg_aio

    async def run(names: list[str]) -> list[object]:
        client = tg_aio.InferenceServerClient(graph_server.grpc)
        try:
            async def load(k: int, name: str) -> object:
                try:
                    return await client.load_model(name, config=json.dumps(lts(alpha=1.0 + k / 8)))
                except InferenceServerException as exc:
                    return exc.message()

            return await asyncio.gather(*(load(k, name) for k, name in enumerate(names)))
        finally:
            await client.close()

    assert all(r is None for r in asyncio.run(run(["same"] * 6)))
    assert {m["name"] for m in http.post("/v2/repository/index").json()} - set(MODELS) == {"same"}
    results = asyncio.run(run([f"n{k}" for k in range(6)]))
    assert sum(r is None for r in results) == MAX_MODELS - 1
    assert all("VKACT_MAX_GRAPH_MODELS" in r for r in results if r is not None)
    assert len({m["name"] for m in http.post("/v2/repository/index").json()} - set(MODELS)) == MAX_MODELS
    assert http.get("/v2/health/ready").status_code == 200


def test_loads_cut_by_their_deadline_leave_the_files_whole(clients, http, graph_server):
    """gRPC loads whose deadline passes while they parse, compile or store (the transport cancels the
    call; test_model_loads.py holds a load at each point): each is refused DEADLINE_EXCEEDED or done,
    and after each (a reload of another model waits for a cancelled load's thread) the server's graph
    file names exactly the attachments beside it, every model listed answers its metadata, the
    model loaded before serves on, and no request got a 500."""
    h, g = clients
    kept = lts(alpha=1.25)
    h.load_model("kept", config=json.dumps(kept))
    prefix = f"vkact-graphs-{graph_server.process.pid}-"
    outcomes = []
    for k in range(10):  # deadlines from 50 us to 6 ms: the short ones are cut even on a fast idle machine
        try:
            g.load_model("cut", config=json.dumps(lts(np.float16 if k % 2 else np.float32, alpha=2 + k / 16)), client_timeout=0.00005 * 1.7 ** k)
            outcomes.append("loaded")
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.DEADLINE_EXCEEDED", exc.message()
            outcomes.append("cut")
        h.load_model("kept", config=json.dumps(kept))
        names = {m["name"] for m in http.post("/v2/repository/index").json()} - set(MODELS)
        attachments = [n for n in os.listdir("/dev/shm") if n.startswith(prefix) and re.fullmatch(r"[0-9a-f]{16}", n.rsplit(".", 1)[-1])]
        assert "kept" in names and len(attachments) == len(names), (names, attachments)
        for name in names:
            assert http.get(f"/v2/models/{name}").status_code == 200
    assert "cut" in outcomes, outcomes   # at least one load was cancelled by its deadline
