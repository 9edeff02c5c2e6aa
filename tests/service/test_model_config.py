"""The model configuration tells the truth about batching: batch_stats accounts for every execution under
concurrent load, and load_model with a config changes the batching the device worker applies, or is
refused naming the field (HTTP 400, gRPC INVALID_ARGUMENT): never OK without effect."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.service.test_v2 import address

MODEL = "thresholded_relu"  # no other test infers it: its statistics move only here
CLIENTS = 64


@pytest.fixture(scope="module")
def clients(server) -> Iterator[tuple[triton.InferenceServerClient, tg.InferenceServerClient]]:
    http, grpc = triton.InferenceServerClient(address(server)), tg.InferenceServerClient(server.grpc)
    yield http, grpc
    http.load_model(MODEL)  # the service's batching again, whatever a test left
    http.close()
    grpc.close()


def batches(http: triton.InferenceServerClient) -> tuple[dict[int, int], int, int]:
    """(executions by batch size, execution_count, inference_count) of MODEL."""
    (entry,) = http.get_inference_statistics(MODEL)["model_stats"]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}
    return sizes, entry["execution_count"], entry["inference_count"]


def under_load(server, http: triton.InferenceServerClient) -> tuple[dict[int, int], int, int]:
    """CLIENTS requests at once over gRPC, each checked against numpy; what the statistics grew by."""
    before = batches(http)
    x = np.linspace(-2, 2, 4096, dtype=np.float32)

    async def run() -> None:
        client = tg_aio.InferenceServerClient(server.grpc)
        try:
            async def one(k: int) -> None:
                data = x + np.float32(k)
                i = tg_aio.InferInput("InputTensor", [4096], "FP32").set_data_from_numpy(data)
                got = (await client.infer(MODEL, [i])).as_numpy("OutputTensor")
                np.testing.assert_array_equal(got, np.where(data > 1.0, data, 0).astype(np.float32))  # Alpha 1, DirectML's default

            await asyncio.gather(*(one(k) for k in range(CLIENTS)))
        finally:
            await client.close()

    asyncio.run(run())
    after = batches(http)
    grown = {size: n - before[0].get(size, 0) for size, n in after[0].items() if n != before[0].get(size, 0)}
    return grown, after[1] - before[1], after[2] - before[2]


def test_batch_stats_account_for_every_execution(server, clients):
    http, _ = clients
    limit = http.get_model_config(MODEL)["max_batch_size"]
    sizes, executions, inferences = under_load(server, http)
    assert sum(sizes.values()) == executions and sum(size * n for size, n in sizes.items()) == inferences == CLIENTS
    assert max(sizes) <= limit


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_with_a_config_sets_the_batching(server, clients, protocol):
    http, grpc = clients
    client = http if protocol == "http" else grpc
    served = http.get_model_config(MODEL)
    assert served["max_batch_size"] > 2 and served["dynamic_batching"] == {"max_queue_delay_microseconds": 0}
    try:
        client.load_model(MODEL, config=json.dumps({**served, "max_batch_size": 2}))
        assert http.get_model_config(MODEL)["max_batch_size"] == 2
        assert grpc.get_model_config(MODEL, as_json=True)["config"]["max_batch_size"] == 2
        assert http.get_model_metadata(MODEL)["inputs"][0]["shape"] == [-1, -1]
        sizes, executions, _ = under_load(server, http)
        assert max(sizes) <= 2 and sum(sizes.values()) == executions

        no_batching = {k: v for k, v in served.items() if k != "dynamic_batching"}
        client.load_model(MODEL, config=json.dumps({**no_batching, "max_batch_size": 0}))
        config = http.get_model_config(MODEL)
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
        assert http.get_model_metadata(MODEL)["inputs"][0]["shape"] == [-1]
        sizes, executions, _ = under_load(server, http)
        assert sizes == {1: CLIENTS} == {1: executions}  # each request ran alone
    finally:
        client.load_model(MODEL)  # no config: the service's batching again
    assert http.get_model_config(MODEL) == served


REFUSED = [
    ({"max_batch_size": 0, "dynamic_batching": {}}, "config.dynamic_batching"),
    ({"max_batch_size": 1000}, "config.max_batch_size"),
    ({"max_batch_size": -1}, "config.max_batch_size"),
    ({"dynamic_batching": {"max_queue_delay_microseconds": 100}}, "config.dynamic_batching.max_queue_delay_microseconds"),
    ({"dynamic_batching": {"preferred_batch_size": [4]}}, "config.dynamic_batching.preferred_batch_size"),
    ({"instance_group": [{"count": 2}]}, "config.instance_group"),
    ({"input": [{"name": "InputTensor", "data_type": "TYPE_FP16", "dims": [-1]}]}, "config.input"),
    ({"no_such_field": 1}, "config"),
]


@pytest.mark.parametrize("change, field", REFUSED)
def test_a_config_vkact_cannot_apply_is_refused(server, clients, http, change, field):
    tc, gc = clients
    before = tc.get_model_config(MODEL)
    config = json.dumps({**before, **change})
    answer = http.post(f"/v2/repository/models/{MODEL}/load", json={"parameters": {"config": config}})
    assert answer.status_code == 400 and answer.json()["error"].startswith(f"{field}: "), answer.text  # /v2: the field leads
    with pytest.raises(InferenceServerException) as info:
        gc.load_model(MODEL, config=config)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and info.value.message().startswith(f"{field}: ")
    assert tc.get_model_config(MODEL) == before  # nothing applied


def test_malformed_loads_are_refused(server, clients, http):
    assert http.post(f"/v2/repository/models/{MODEL}/load", content=b"[1]").status_code == 400
    for params, field in (({"config": 3}, "config"), ({"config": "{"}, "config"), ({"file:1/model.onnx": "AAAA"}, "file:1/model.onnx")):
        answer = http.post(f"/v2/repository/models/{MODEL}/load", json={"parameters": params})
        assert answer.status_code == 400 and answer.json()["error"].startswith(f"{field}: "), answer.text
    # a reduction runs each request alone: it takes no batch size
    answer = http.post("/v2/repository/models/softmax/load", json={"parameters": {"config": json.dumps({"max_batch_size": 4})}})
    assert answer.status_code == 400 and answer.json()["error"].startswith("config.max_batch_size: ") and "reduction" in answer.json()["error"]
