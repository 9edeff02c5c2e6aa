"""Loaded models are the server's, not one HTTP process's: with --workers 2 (connections spread over the
processes by SO_REUSEPORT, which no client chooses) a load through one connection is inferred, listed,
described and ready through every other; a reload is answered everywhere after it returns; an unload
is a 404 everywhere; VKACT_MAX_GRAPH_MODELS counts per server. Every answer is checked bit for bit
against the graph's nodes run one by one as operator models (test_graph_infer.one_by_one). An operator
model's batching set by load_model with a config is likewise every process's, in its config and in
the batches its device worker forms, until a load without a config restores the served one."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tg_aio
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.graph_helpers import sample
from tests.service.conftest import Server, spawned_children
from tests.service.test_graph_infer import grpc_infer, http_infer, lts, one_by_one, same_bits, shared
from tests.service.test_v2 import address

CONNECTIONS = 24   # new connections per check: both processes answer some (each half the time)


@pytest.fixture(scope="module")
def two_workers(two_processes: Server) -> Server:
    """The session's two-process server (conftest: VKACT_MAX_GRAPH_MODELS=2), both processes ready."""
    assert len(spawned_children(two_processes.process.pid)) == 2
    _until_both_ready(two_processes)
    return two_processes


def _until_both_ready(server: Server) -> None:
    """The server was ready when one process was: wait until 20 new connections in a row are."""
    in_a_row, deadline = 0, time.monotonic() + 120
    while in_a_row < 20:
        assert time.monotonic() < deadline, "the second HTTP process never became ready"
        in_a_row = in_a_row + 1 if httpx.get(f"{server.url}/v2/health/ready").status_code == 200 else 0


def each_connection(server: Server, check: Callable[[triton.InferenceServerClient], None]) -> None:
    """``check`` through CONNECTIONS new HTTP connections (and so through both processes)."""
    for _ in range(CONNECTIONS):
        with triton.InferenceServerClient(address(server)) as client:
            check(client)


def graph_names(client: triton.InferenceServerClient) -> set[str]:
    return {m["name"] for m in client.get_model_repository_index()} - set(MODELS)


def test_a_graph_model_is_every_process_s(two_workers):
    x = {"x": sample(np.float32)}
    with triton.InferenceServerClient(address(two_workers)) as first:
        first.load_model("lts", config=json.dumps(lts(np.float32)))
        first.load_model("shared", config=json.dumps(shared()))
        want = {"lts": one_by_one(first, lts(np.float32), x), "shared": one_by_one(first, shared(), x)}

    def answers_as_loaded(client: triton.InferenceServerClient) -> None:
        assert graph_names(client) == {"lts", "shared"}
        for name, outputs in want.items():
            assert client.is_model_ready(name)
            meta = client.get_model_metadata(name)
            assert [o["name"] for o in meta["outputs"]] == list(outputs) and meta["parameters"]["graph_fused"] == "true"
            got = http_infer(client, name, x)
            for key in outputs:
                same_bits(got[key], outputs[key])

    each_connection(two_workers, answers_as_loaded)
    for _ in range(4):   # gRPC's port is SO_REUSEPORT too
        g = tg.InferenceServerClient(two_workers.grpc)
        try:
            for name, outputs in want.items():
                got = grpc_infer(g, name, x)
                for key in outputs:
                    same_bits(got[key], outputs[key])
        finally:
            g.close()

    # the limit counts the server's models, whichever process takes the load
    def refuses_a_third(client: triton.InferenceServerClient) -> None:
        with pytest.raises(InferenceServerException) as err:
            client.load_model("third", config=json.dumps(lts(np.float32)))
        assert err.value.status() == "400" and "VKACT_MAX_GRAPH_MODELS" in err.value.message()

    each_connection(two_workers, refuses_a_third)

    # a reload is what every process answers once it returns: a new Alpha, then a new data type
    for dtype, alpha in ((np.float32, 0.6), (np.float16, 0.6)):
        graph, given = lts(dtype, alpha=alpha), {"x": sample(dtype)}
        with triton.InferenceServerClient(address(two_workers)) as client:
            client.load_model("lts", config=json.dumps(graph))
            reloaded = one_by_one(client, graph, given)["y"]

        def answers_as_reloaded(client: triton.InferenceServerClient) -> None:
            same_bits(http_infer(client, "lts", given)["y"], reloaded)

        each_connection(two_workers, answers_as_reloaded)

    # an unload reaches every process
    with triton.InferenceServerClient(address(two_workers)) as client:
        client.unload_model("lts")

    def forgot_it(client: triton.InferenceServerClient) -> None:
        assert graph_names(client) == {"shared"}
        for call in (lambda: http_infer(client, "lts", x), lambda: client.get_model_metadata("lts"), lambda: client.unload_model("lts")):
            with pytest.raises(InferenceServerException) as err:
                call()
            assert err.value.status() == "404", err.value.message()
        assert not client.is_model_ready("lts")

    each_connection(two_workers, forgot_it)
    with triton.InferenceServerClient(address(two_workers)) as client:
        client.unload_model("shared")
        assert graph_names(client) == set()


BATCHED = "thresholded_relu"   # elementwise: batched; no other test of this module's server infers it
AT_ONCE = 64


def _batches_on_one_connection(server: Server) -> dict[int, int]:
    """AT_ONCE requests of BATCHED at once over one new gRPC connection (so one process; a channel of its
    own, as grpcio would share one to the same address), each checked against numpy; the batch sizes
    that process's statistics grew by (asked over the same connection)."""
    x = np.linspace(-2, 2, 4096, dtype=np.float32)

    async def run() -> dict[int, int]:
        client = tg_aio.InferenceServerClient(server.grpc, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        try:
            async def sizes() -> dict[int, int]:
                (entry,) = (await client.get_inference_statistics(BATCHED, as_json=True))["model_stats"]
                return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in entry.get("batch_stats", [])}

            async def one(k: int) -> None:
                data = x + np.float32(k)
                i = tg_aio.InferInput("InputTensor", [4096], "FP32").set_data_from_numpy(data)
                got = (await client.infer(BATCHED, [i])).as_numpy("OutputTensor")
                np.testing.assert_array_equal(got, np.where(data > 1.0, data, 0).astype(np.float32))  # Alpha 1, DirectML's default

            before = await sizes()
            await asyncio.gather(*(one(k) for k in range(AT_ONCE)))
            after = await sizes()
            return {size: n - before.get(size, 0) for size, n in after.items() if n != before.get(size, 0)}
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_model_s_batching_is_every_process_s(two_workers):
    with triton.InferenceServerClient(address(two_workers)) as first:
        served = first.get_model_config(BATCHED)
        assert served["max_batch_size"] > 2 and served["dynamic_batching"] == {"max_queue_delay_microseconds": 0}
        first.load_model(BATCHED, config=json.dumps({**served, "max_batch_size": 2}))
    try:
        def configured_with_two(client: triton.InferenceServerClient) -> None:
            assert client.get_model_config(BATCHED) == {**served, "max_batch_size": 2}
            assert client.get_model_metadata(BATCHED)["inputs"][0]["shape"] == [-1, -1]

        each_connection(two_workers, configured_with_two)
        for _ in range(6):   # new connections: both processes' device workers batch at most 2
            sizes = _batches_on_one_connection(two_workers)
            assert sum(size * n for size, n in sizes.items()) == AT_ONCE and max(sizes) <= 2, sizes

        # no batching, set through gRPC (its port is SO_REUSEPORT too)
        g = tg.InferenceServerClient(two_workers.grpc, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        try:
            g.load_model(BATCHED, config=json.dumps({**{k: v for k, v in served.items() if k != "dynamic_batching"}, "max_batch_size": 0}))
        finally:
            g.close()

        def not_batched(client: triton.InferenceServerClient) -> None:
            config = client.get_model_config(BATCHED)
            assert config["max_batch_size"] == 0 and "dynamic_batching" not in config

        each_connection(two_workers, not_batched)
        for _ in range(4):
            assert set(_batches_on_one_connection(two_workers)) == {1}
    finally:
        with triton.InferenceServerClient(address(two_workers)) as client:
            client.load_model(BATCHED)   # no config: the served batching again, everywhere

    def as_served(client: triton.InferenceServerClient) -> None:
        assert client.get_model_config(BATCHED) == served

    each_connection(two_workers, as_served)
