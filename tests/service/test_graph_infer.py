"""Loaded graph models inferred by name with tritonclient, unchanged (HTTP and gRPC; JSON, binary and
system shared memory tensors; several outputs, a subset of them; ModelStreamInfer), against the running
service: every answer bit-identical to the graph's nodes run one by one as the service's operator models
(the oracle: tritonclient requests to `linear`, `scaled_tanh`, ..., each node's output sent on as the
next node's input). Then the hostile side: load and unload while the model is being inferred (no 500,
every answer one of the graph's versions, the service healthy)."""
from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.graph_helpers import SIZES, activation, chain, sample
from tests.service.test_perf_analyzer import MODES, measure, perf_analyzer, shared_memory_names  # noqa: F401 - a fixture
from tests.service.test_v2 import address, triton_dtype
from tests.service.test_v2_errors import assert_still_serving
from tests.service.test_v2_shm import Region, regions  # noqa: F401 - the fixture


def lts(dtype, alpha: float = 1.7) -> dict:
    return chain([
        activation("LINEAR", dtype, SIZES, Alpha=alpha, Beta=-0.3),
        activation("SCALED_TANH", dtype, SIZES, Alpha=1.3, Beta=0.9),
        activation("SHRINK", dtype, SIZES, Bias=0.1, Threshold=0.4),
    ])


def prelu_softmax(dtype=np.float32) -> dict:
    """PARAMETERIZED_RELU(x, slope) -> SOFTMAX1 over Axes [1, 2]: two graph inputs, a reduction."""
    return {
        "InputCount": 2, "OutputCount": 1,
        "Nodes": [{"Operator": activation("PARAMETERIZED_RELU", dtype, SIZES, ("InputTensor", "SlopeTensor"))},
                  {"Operator": activation("SOFTMAX1", dtype, SIZES, Axes=[1, 2])}],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"},
                       {"GraphInputIndex": 1, "ToNodeIndex": 0, "ToNodeInputIndex": 1, "Name": "slope"}],
        "IntermediateEdges": [{"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0}],
        "OutputEdges": [{"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "probabilities"}],
    }


def shared(dtype=np.float32) -> dict:
    """x -> LINEAR (n0); n0 -> SIGMOID (n1) -> "s"; PARAMETERIZED_RELU(n0, n1) -> "p"; n0 is also "l"."""
    return {
        "InputCount": 1, "OutputCount": 3,
        "Nodes": [{"Operator": activation("LINEAR", dtype, SIZES, Alpha=-1.25, Beta=0.5)},
                  {"Operator": activation("SIGMOID", dtype, SIZES)},
                  {"Operator": activation("PARAMETERIZED_RELU", dtype, SIZES, ("InputTensor", "SlopeTensor"))}],
        "InputEdges": [{"GraphInputIndex": 0, "ToNodeIndex": 0, "ToNodeInputIndex": 0, "Name": "x"}],
        "IntermediateEdges": [
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 1, "ToNodeInputIndex": 0},
            {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 0},
            {"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "ToNodeIndex": 2, "ToNodeInputIndex": 1},
        ],
        "OutputEdges": [{"FromNodeIndex": 1, "FromNodeOutputIndex": 0, "GraphOutputIndex": 0, "Name": "s"},
                        {"FromNodeIndex": 2, "FromNodeOutputIndex": 0, "GraphOutputIndex": 1, "Name": "p"},
                        {"FromNodeIndex": 0, "FromNodeOutputIndex": 0, "GraphOutputIndex": 2, "Name": "l"}],
    }


def one_by_one(tc: triton.InferenceServerClient, graph: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The oracle: each node (listed in an order that runs producers first) as a request to its
    operator model, its output bytes handed on; the graph's outputs by their edges' names."""
    values: dict[tuple, np.ndarray] = {}
    for e in graph["InputEdges"]:
        values[("to", e["ToNodeIndex"], e["ToNodeInputIndex"])] = inputs[e["Name"]]
    made: dict[int, np.ndarray] = {}
    for n, node in enumerate(graph["Nodes"]):
        op = node["Operator"]
        model = op["Type"].removeprefix("DML_OPERATOR_ACTIVATION_").lower()
        for e in graph["IntermediateEdges"]:
            if e["ToNodeIndex"] == n:
                values[("to", n, e["ToNodeInputIndex"])] = made[e["FromNodeIndex"]]
        params = {k: (",".join(map(str, v)) if isinstance(v, list) else v) for k, v in op.items() if k != "Type" and not isinstance(v, dict)}
        arrays = {name: values[("to", n, slot)] for slot, name in enumerate(MODELS[model].input_fields)}
        request = []
        for name, a in arrays.items():
            request.append(triton.InferInput(name, list(a.shape), triton_dtype(a.dtype)))
            request[-1].set_data_from_numpy(a)
        made[n] = tc.infer(model, request, parameters=params).as_numpy(MODELS[model].output_field)
    return {e["Name"]: made[e["FromNodeIndex"]] for e in graph["OutputEdges"]}


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), f"{np.count_nonzero(got.view(np.uint8) != want.view(np.uint8))} bytes differ"


@pytest.fixture(scope="module")
def tc(server) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(address(server)) as c:
        yield c


@pytest.fixture(scope="module")
def gc(server) -> Iterator[tg.InferenceServerClient]:
    c = tg.InferenceServerClient(server.grpc)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def unload_graphs(tc) -> Iterator[None]:
    """The session's server is shared: every graph model loaded here is unloaded after its test."""
    yield
    for entry in tc.get_model_repository_index():
        if entry["name"] not in MODELS:
            tc.unload_model(entry["name"])


def http_infer(tc, model: str, arrays: dict[str, np.ndarray], outputs: list[str] | None = None, binary: bool = True) -> dict[str, np.ndarray]:
    request = []
    for name, a in arrays.items():
        request.append(triton.InferInput(name, list(a.shape), triton_dtype(a.dtype)))
        request[-1].set_data_from_numpy(a, binary_data=binary)
    wanted = [triton.InferRequestedOutput(name, binary_data=binary) for name in outputs] if outputs else None
    result = tc.infer(model, request, outputs=wanted)
    names = outputs or [o["name"] for o in result.get_response()["outputs"]]
    return {name: result.as_numpy(name) for name in names}


def grpc_infer(gc, model: str, arrays: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
    request = [tg.InferInput(name, list(a.shape), triton_dtype(a.dtype)).set_data_from_numpy(a) for name, a in arrays.items()]
    result = gc.infer(model, request, outputs=[tg.InferRequestedOutput(n) for n in outputs] if outputs else None)
    names = outputs or [o.name for o in result.get_response().outputs]
    return {name: result.as_numpy(name) for name in names}


GRAPHS = {
    "lts_f32": (lambda: lts(np.float32), lambda: {"x": sample(np.float32)}),
    "lts_f16": (lambda: lts(np.float16), lambda: {"x": sample(np.float16)}),
    "prelu_softmax": (prelu_softmax, lambda: {"x": sample(np.float32), "slope": sample(np.float32, seed=1) / 4}),
    "shared": (shared, lambda: {"x": sample(np.float32)}),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_a_graph_model_answers_as_its_nodes_one_by_one(tc, gc, http, name):
    graph, inputs = GRAPHS[name][0](), GRAPHS[name][1]()
    tc.load_model(name, config=json.dumps(graph))
    want = one_by_one(tc, graph, inputs)
    for got in (http_infer(tc, name, inputs), grpc_infer(gc, name, inputs)):
        assert list(got) == list(want)   # every output, in the graph's order, by the edges' names
        for key in want:
            same_bits(got[key], want[key])
    (stats,) = tc.get_inference_statistics(name)["model_stats"]
    assert stats["inference_count"] == 2 and stats["execution_count"] == 2 and stats["inference_stats"]["success"]["count"] == 2
    assert f'nv_inference_request_success{{model="{name}",version="1"}} 2' in http.get("/metrics").text
    tc.unload_model(name)
    assert f'model="{name}"' not in http.get("/metrics").text   # gone with the model: names never pile up


def test_the_largest_graph(tc, gc):
    """VKACT_MAX_GRAPH_NODES' 64 nodes in one chain (a long fused shader): still its nodes' answer."""
    ops = [activation("LINEAR", np.float32, SIZES, Alpha=1.01, Beta=0.01) if k % 2 else activation("SOFTSIGN", np.float32, SIZES)
           for k in range(64)]
    graph = chain(ops)
    tc.load_model("long", config=json.dumps(graph))
    x = {"x": sample(np.float32)}
    same_bits(grpc_infer(gc, "long", x)["y"], one_by_one(tc, graph, x)["y"])


def test_a_raw_binary_body(tc, http):
    """Inference-Header-Content-Length 0: the body is a one-input graph's input, the answer binary."""
    tc.load_model("lts_f32", config=json.dumps(lts(np.float32)))
    x = sample(np.float32)
    answer = http.post("/v2/models/lts_f32/infer", content=x.tobytes(), headers={"Inference-Header-Content-Length": "0"})
    assert answer.status_code == 200, answer.text
    head = int(answer.headers["Inference-Header-Content-Length"])
    assert json.loads(answer.content[:head])["outputs"][0]["parameters"] == {"binary_data_size": x.nbytes}
    same_bits(np.frombuffer(answer.content[head:], np.float32).reshape(SIZES), one_by_one(tc, lts(np.float32), {"x": x})["y"])
    tc.load_model("prelu_softmax", config=json.dumps(prelu_softmax()))
    answer = http.post("/v2/models/prelu_softmax/infer", content=x.tobytes(), headers={"Inference-Header-Content-Length": "0"})
    assert answer.status_code == 400 and "one input" in answer.json()["error"]


def test_json_tensors_and_a_subset_of_the_outputs(tc, gc):
    tc.load_model("shared", config=json.dumps(shared()))
    x = {"x": np.nan_to_num(sample(np.float32), nan=0.5, posinf=7.0, neginf=-7.0)}   # JSON numbers: finite
    want = one_by_one(tc, shared(), x)
    got = http_infer(tc, "shared", x, outputs=["p", "l"], binary=False)
    assert list(got) == ["p", "l"]
    for key in got:
        same_bits(got[key], want[key])
    got = grpc_infer(gc, "shared", x, outputs=["l"])
    assert list(got) == ["l"]
    same_bits(got["l"], want["l"])
    # typed contents over gRPC, as KServe's clients send them
    request = tg.InferInput("x", list(SIZES), "FP32")
    request.set_data_from_numpy(x["x"])
    message = tg.service_pb2.ModelInferRequest(model_name="shared", inputs=[tg.service_pb2.ModelInferRequest.InferInputTensor(
        name="x", datatype="FP32", shape=list(SIZES), contents=tg.service_pb2.InferTensorContents(fp32_contents=x["x"].reshape(-1).tolist()))])
    answer = gc._client_stub.ModelInfer(message)
    assert [o.name for o in answer.outputs] == ["s", "p", "l"]
    same_bits(np.frombuffer(answer.raw_output_contents[1], np.float32).reshape(SIZES), want["p"])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_inputs_and_outputs(tc, gc, regions, protocol):  # noqa: F811 - the fixture
    tc.load_model("prelu_softmax", config=json.dumps(prelu_softmax()))
    x, slope = sample(np.float32), sample(np.float32, seed=1) / 4
    want = one_by_one(tc, prelu_softmax(), {"x": x, "slope": slope})["probabilities"]
    client, lib = (tc, triton) if protocol == "http" else (gc, tg)
    io: Region = regions(3 * x.nbytes).register(client)
    shm.set_shared_memory_region(io.handle, [x, slope])
    inputs = [lib.InferInput("x", list(SIZES), "FP32"), lib.InferInput("slope", list(SIZES), "FP32")]
    inputs[0].set_shared_memory(io.name, x.nbytes)
    inputs[1].set_shared_memory(io.name, x.nbytes, offset=x.nbytes)
    out = lib.InferRequestedOutput("probabilities")
    out.set_shared_memory(io.name, x.nbytes, offset=2 * x.nbytes)
    result = client.infer("prelu_softmax", inputs, outputs=[out])
    entry = result.get_output("probabilities")
    shape = entry["shape"] if protocol == "http" else list(entry.shape)
    assert shape == list(SIZES)
    same_bits(shm.get_contents_as_numpy(io.handle, np.float32, SIZES, offset=2 * x.nbytes), want)
    client.unregister_system_shared_memory(io.name)


def test_stream_infer(tc, gc):
    tc.load_model("lts_f32", config=json.dumps(lts(np.float32)))
    answers: queue.Queue = queue.Queue()
    xs = [sample(np.float32, seed=k) for k in range(3)]
    gc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for k, x in enumerate(xs):
            gc.async_stream_infer("lts_f32", [tg.InferInput("x", list(SIZES), "FP32").set_data_from_numpy(x)], request_id=str(k))
        got = {}
        for _ in xs:
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("y")
    finally:
        gc.stop_stream()
    for k, x in enumerate(xs):
        same_bits(got[str(k)], one_by_one(tc, lts(np.float32), {"x": x})["y"])


def test_bad_inference_requests(tc, gc, http):
    tc.load_model("shared", config=json.dumps(shared()))
    x = sample(np.float32)
    cases = [
        ({"x": x.astype(np.float16)}, None, "datatype"),
        ({"x": x[:2]}, None, "shape"),
        ({"y": x}, None, "inputs[0].name"),
        ({}, None, "missing"),
        ({"x": x}, ["nope"], "outputs[0].name"),
    ]
    for arrays, outputs, piece in cases:
        for call in (lambda: http_infer(tc, "shared", arrays, outputs), lambda: grpc_infer(gc, "shared", arrays, outputs)):
            with pytest.raises(InferenceServerException) as err:
                call()
            assert str(err.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT") and piece in err.value.message(), err.value.message()
    assert http.post("/v2/models/shared/versions/2/infer", json={"inputs": []}).status_code == 404
    for client, lib, status in ((tc, triton, "400"), (gc, tg, "StatusCode.INVALID_ARGUMENT")):  # its scalars are in the graph
        request = lib.InferInput("x", list(SIZES), "FP32")
        request.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as err:
            client.infer("shared", [request], parameters={"Alpha": 2.0})
        assert str(err.value.status()) == status and "parameters.Alpha" in err.value.message(), err.value.message()
    (stats,) = tc.get_inference_statistics("shared")["model_stats"]
    assert stats["inference_stats"]["fail"]["count"] >= 2 * len(cases)
    assert_still_serving(http)


def test_load_and_unload_during_inference(tc, gc, server, http):
    """Forty inferences over gRPC while the model is reloaded with another Alpha, then unloaded: each
    answers with one of the two graphs' bit-exact answers, or NOT_FOUND once it is gone; never a 500."""
    first, second = lts(np.float32, alpha=1.7), lts(np.float32, alpha=-0.6)
    x = sample(np.float32)
    answers = {a: one_by_one(tc, g, {"x": x})["y"].tobytes() for a, g in (("first", first), ("second", second))}
    tc.load_model("moving", config=json.dumps(first))

    async def run() -> list:
        client = tg_aio.InferenceServerClient(server.grpc)
        try:
            async def one() -> object:
                try:
                    result = await client.infer("moving", [tg_aio.InferInput("x", list(SIZES), "FP32").set_data_from_numpy(x)])
                    return result.as_numpy("y").tobytes()
                except InferenceServerException as exc:
                    return exc.status()

            async def churn() -> None:
                await asyncio.sleep(0.05)
                await client.load_model("moving", config=json.dumps(second))
                await asyncio.sleep(0.2)
                await client.unload_model("moving")

            tasks = [asyncio.ensure_future(one()) for _ in range(20)]
            await churn()
            tasks += [asyncio.ensure_future(one()) for _ in range(20)]
            return await asyncio.gather(*tasks)
        finally:
            await client.close()

    results = asyncio.run(run())
    for r in results:
        assert r in (answers["first"], answers["second"], "StatusCode.NOT_FOUND"), r
    assert results[-1] == "StatusCode.NOT_FOUND"   # after the unload
    assert sum(r == answers["first"] for r in results) >= 1
    assert_still_serving(http)


@pytest.mark.parametrize("mode", ["grpc", "http-shm", "grpc-streaming-shm"])
def test_perf_analyzer_measures_a_graph_model(tc, server, http, perf_analyzer, mode):  # noqa: F811 - the fixture
    """Triton's perf_analyzer against a graph model as against any Triton model: the shapes from its
    metadata (no --shape), three outputs (in shared memory: sized by their dims), every request counted."""
    tc.load_model("shared", config=json.dumps(shared()))
    args = MODES[mode]
    url = server.grpc if "grpc" in args else server.url.removeprefix("http://")

    def counted() -> tuple[int, int]:
        (stats,) = tc.get_inference_statistics("shared")["model_stats"]
        return stats["inference_stats"]["success"]["count"], stats["inference_stats"]["fail"]["count"]

    with shared_memory_names(args):
        measure([*perf_analyzer, "-m", "shared", "-u", url, *args, "--concurrency-range", "2", "--request-count", "12"], 12, counted)
    assert_still_serving(http)
