"""Triton's statistics extension: tritonclient's get_inference_statistics over HTTP and gRPC returns
vkact's counts, exactly: N successful inferences over /v1, /v2 and gRPC are N successes (one queue,
compute_input, compute_infer and compute_output count each), failed ones count as fail."""
from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.service.test_v2 import address

MODEL = "softsign"  # no other test of this module's server infers it between two snapshots
SPANS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


@pytest.fixture(scope="module")
def clients(server) -> Iterator[tuple[triton.InferenceServerClient, tg.InferenceServerClient]]:
    http, grpc = triton.InferenceServerClient(address(server)), tg.InferenceServerClient(server.grpc)
    yield http, grpc
    http.close()
    grpc.close()


def counts(stats: dict) -> dict[str, int]:
    """The counters of one model's entry (gRPC's JSON has int64 as strings, and omits zeros)."""
    inference = stats["inference_stats"]
    out = {"inference_count": int(stats.get("inference_count", 0)), "execution_count": int(stats.get("execution_count", 0))}
    out.update({span: int(inference.get(span, {}).get("count", 0)) for span in SPANS})
    return out


def snapshot(http: triton.InferenceServerClient, grpc: tg.InferenceServerClient) -> dict[str, int]:
    over_http = http.get_inference_statistics(MODEL)["model_stats"]
    over_grpc = grpc.get_inference_statistics(MODEL, as_json=True)["model_stats"]
    assert len(over_http) == len(over_grpc) == 1 and over_http[0]["name"] == MODEL and over_http[0]["version"] == "1"
    assert counts(over_http[0]) == counts(over_grpc[0])
    return counts(over_http[0])


def v1_body(values: list[float]) -> dict:
    desc = {"Type": "DML_OPERATOR_ACTIVATION_SOFTSIGN", "InputTensor": {"DataType": "DML_TENSOR_DATA_TYPE_FLOAT32", "Sizes": [4]}}
    return {"Operator": desc, "Inputs": {"InputTensor": values}}


def test_counts_are_exact_over_every_protocol(clients, http):
    tc, gc = clients
    before = snapshot(tc, gc)
    started_ms = time.time_ns() // 1_000_000
    x = np.linspace(-2, 2, 1024, dtype=np.float32)
    for _ in range(3):
        i = tg.InferInput("InputTensor", [1024], "FP32").set_data_from_numpy(x)
        np.testing.assert_allclose(gc.infer(MODEL, [i]).as_numpy("OutputTensor"), x / (1 + np.abs(x)), rtol=1e-6)
    for _ in range(4):
        i = triton.InferInput("InputTensor", [1024], "FP32")
        i.set_data_from_numpy(x)
        tc.infer(MODEL, [i])
    for _ in range(2):
        assert http.post("/v1/execute", json=v1_body([1, 2, 3, 4])).status_code == 200
    # failures of a known model: a byte count that does not match the shape, on each protocol
    short = tg.InferInput("InputTensor", [1024], "FP32").set_data_from_numpy(x)
    short._raw_content = x[:10].tobytes()
    with pytest.raises(InferenceServerException):
        gc.infer(MODEL, [short])
    assert http.post(f"/v2/models/{MODEL}/infer", json={"inputs": [{"name": "InputTensor", "datatype": "FP32", "shape": [3], "data": [1]}]}).status_code == 400
    after = snapshot(tc, gc)
    delta = {k: after[k] - before[k] for k in after}
    assert delta == {"inference_count": 9, "execution_count": 9, "success": 9, "fail": 2, "queue": 9, "compute_input": 9,
                     "compute_infer": 9, "compute_output": 9, "cache_hit": 0, "cache_miss": 0}, delta
    stats = tc.get_inference_statistics(MODEL)["model_stats"][0]
    assert stats["last_inference"] >= started_ms
    spans = stats["inference_stats"]
    # the request's time is its queue, its dispatch and the host's work around it (rounding aside)
    assert abs(spans["success"]["ns"] - spans["queue"]["ns"] - spans["compute_input"]["ns"] - spans["compute_infer"]["ns"]) <= 3
    assert spans["fail"]["ns"] > 0 and spans["compute_infer"]["ns"] > 0


def test_every_model_and_triton_shape(clients, http):
    tc, gc = clients
    everything = http.get("/v2/models/stats").json()["model_stats"]
    assert [m["name"] for m in everything] == sorted(MODELS)
    for entry in everything:
        # perf_analyzer reads these with rapidjson's GetUint64: JSON integers, never strings
        assert isinstance(entry["version"], str) and isinstance(entry["last_inference"], int)
        assert all(isinstance(entry["inference_stats"][s][k], int) for s in SPANS for k in ("count", "ns"))
        assert entry["memory_usage"] == []
        assert sum(b["compute_infer"]["count"] for b in entry["batch_stats"]) == entry["execution_count"]
    assert http.get(f"/v2/models/{MODEL}/versions/1/stats").json() == http.get(f"/v2/models/{MODEL}/stats").json()
    assert len(gc.get_inference_statistics().model_stats) == len(MODELS)
    assert http.get("/v2/models/nope/stats").status_code == 404
    assert http.get(f"/v2/models/{MODEL}/versions/2/stats").status_code == 404
    with pytest.raises(InferenceServerException) as info:
        gc.get_inference_statistics("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as info:
        tc.get_inference_statistics(MODEL, "2")
    assert info.value.status() == "404"
