"""Graph models are the server's, not one HTTP process's: with --workers 2 (connections spread over the
processes by SO_REUSEPORT, which no client chooses) a load through one connection is inferred, listed,
described and ready through every other; a reload is answered everywhere after it returns; an unload
is a 404 everywhere; VKACT_MAX_GRAPH_MODELS counts per server. Every answer is checked bit for bit
against the graph's nodes run one by one as operator models (test_graph_infer.one_by_one)."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from service.dataplane.models import MODELS
from tests.graph_helpers import sample
from tests.service.conftest import Server, spawned_children, start_server, stop_server
from tests.service.test_graph_infer import grpc_infer, http_infer, lts, one_by_one, same_bits, shared
from tests.service.test_v2 import address

CONNECTIONS = 24   # new connections per check: both processes answer some (each half the time)


@pytest.fixture(scope="module")
def two_workers() -> Iterator[Server]:
    s = start_server(workers=2, max_graph_models=2)
    try:
        assert len(spawned_children(s.process.pid)) == 2
        _until_both_ready(s)
        yield s
        metrics = httpx.get(f"{s.url}/metrics").text
        assert 'vkact_errors_total{code="500"}' not in metrics, metrics
    finally:
        stop_server(s)


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
