"""Request bytes in flight within one budget (service/inflight.py, VKACT_INFLIGHT_BYTES): 32 compressed
bombs at once, over HTTP and over gRPC, each refused (413 / RESOURCE_EXHAUSTED) while the HTTP process's
peak memory grows by no more than the budget and a little slack (gzip bombs, which announce their size, by
far less) and liveness probes sent meanwhile are answered; a normal compressed
request served after them, the budget given back after every failure. Latency under the bombs
is a figure of the benchmark (bench/liveness.py), never asserted here."""
from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import socket
import subprocess
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc

from service.api.v2.encoding import decode_body
from service.inflight import Claim, InflightBudget
from service.errors import Busy, PayloadTooLarge
from tests.service.conftest import Server, start_server, stop_server
from tests.service.test_bombs import peak_rss
from tests.service.test_bombs import probe_while as bombs_probe_while
from tests.service.test_bombs import sending
from tests.service.test_grpc_transport import INFER, relu_of, relu_request
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge

# Driver-independent (test-portability.sh leaves them to make test): bombs and the budget of bytes in flight are
# refused or held before any kernel
pytestmark = pytest.mark.driver_independent

BOMBS = 32
BUDGET_SLACK = 32 << 20  # beyond the budget: the compressed bodies, a step of output per inflating thread


# -- the budget itself -------------------------------------------------------------------------------


def test_a_claim_grows_within_the_budget_and_gives_everything_back():
    budget = InflightBudget(100)
    with budget.claim() as a:
        a.grow(60)
        b = budget.claim()
        with pytest.raises(Busy, match="VKACT_INFLIGHT_BYTES"):
            b.grow(50)  # fits alone, not beside a's 60
        with pytest.raises(PayloadTooLarge, match="VKACT_INFLIGHT_BYTES"):
            b.grow(101)  # never fits
        assert b.held == 0 and budget.held == 60
        assert b.try_grow(40) and not b.try_grow(1)
        b.shrink(40)
        assert budget.held == 60 and b.held == 0
        assert budget.try_reserve(40) and not budget.try_reserve(1)
        a.adopt(40)  # bytes a transport reserved as they arrived, handed to the call
        assert a.held == 100 and budget.held == 100
    assert budget.held == 0 and a.held == 0
    a.release()  # twice: nothing more to give back
    assert budget.held == 0 and isinstance(a, Claim)


@pytest.mark.parametrize("coding,pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_body_is_inflated_within_the_budget(coding, pack):
    """In-process, the inflater against a budget: kept and charged while it fits (deflate's growing
    buffer, whose copy does not fit beside it, inflated again at its size); counted past the room left,
    to answer 503 when it fits alone and 413 (naming the setting) when it never does; past the body
    limit 413 whatever the budget; everything given back."""
    data = np.tile(np.arange(256, dtype=np.uint8), 3 << 12).tobytes()  # 3 MiB
    packed = memoryview(pack(data))
    budget = InflightBudget(4 << 20)
    with budget.claim() as claim:
        assert bytes(asyncio.run(decode_body(packed, coding, 8 << 20, claim))) == data
        assert claim.held == len(data)
    other = budget.claim()
    other.grow(2 << 20)
    with budget.claim() as claim, pytest.raises(Busy, match="VKACT_INFLIGHT_BYTES"):
        asyncio.run(decode_body(packed, coding, 8 << 20, claim))
    other.release()
    with InflightBudget(2 << 20).claim() as claim, pytest.raises(PayloadTooLarge, match="VKACT_INFLIGHT_BYTES"):
        asyncio.run(decode_body(packed, coding, 8 << 20, claim))
    with budget.claim() as claim, pytest.raises(PayloadTooLarge, match="decompressed body exceeds"):
        asyncio.run(decode_body(packed, coding, 2 << 20, claim))
    assert budget.held == 0


# -- bombs against a real server ---------------------------------------------------------------------


# VKACT_MAX_BODY_BYTES, and so the budget: a quarter of the default (256 MiB, what the issue measured). Every
# bomb is inflated up to the limit to be counted (0.6 s of CPU at 256 MiB: 32 of them made each test 40-50 s
# of CI's). Without the budget, the bombs the two inflating threads keep grow the process by two to three
# limits (with it set to 64 limits: deflate +163-172 MiB, gRPC +131, 2026-11-27), past the budget and its
# slack; with it, +73-75 and +60-65.
BODY_LIMIT = 64 << 20
GROWTH_BOUND = BODY_LIMIT + BUDGET_SLACK
# gzip bombs announce their size and are only counted: +7 MiB here (12-35 at the 256 MiB limit). Kept while
# the budget had room instead, they grew it by the budget (+78 MiB): the bound tells the two apart.
GZIP_GROWTH_BOUND = 48 << 20


def http_bombs() -> dict[str, tuple[bytes, str]]:
    """name: (body, Content-Encoding), each inflating past the body limit: a gzip bomb, whose trailer
    gives its size; a deflate bomb, which gives none; a gzip bomb whose trailer lies (a small size)."""
    spaces = b" " * (BODY_LIMIT + (16 << 20))  # past the limit by more than one inflation step
    honest = gzip.compress(spaces, 9)
    return {"gzip": (honest, "gzip"), "deflate": (zlib.compress(spaces, 9), "deflate"),
            "lying gzip": (honest[:-4] + (1000).to_bytes(4, "little"), "gzip")}


def send_http_bombs(url: str, count: int, names: list[str]) -> None:
    """In a process of its own (the probing test's GIL stays free): ``count`` bombs at once, of the
    kinds ``names`` in turn, to /v2 and /v1 in turn; prints each answer's (kind, status)."""
    kinds = http_bombs()
    paths = ("/v2/models/relu/infer", "/v1/execute")

    def post(i: int) -> tuple[str, int]:
        body, coding = kinds[names[i % len(names)]]
        with httpx.Client(timeout=300) as client:
            response = client.post(url + paths[i // len(names) % 2], content=body, headers={"Content-Encoding": coding})
            return names[i % len(names)], response.status_code

    with ThreadPoolExecutor(count) as pool:
        sending()
        print(json.dumps(list(pool.map(post, range(count)))))


def send_grpc_bombs(address: str, count: int) -> None:
    """``count`` ModelInfer calls at once, each on a connection of its own (nghttp), whose gzip or deflate
    message (a valid ModelInferRequest of zeros, compressed here once) inflates past the message limit;
    prints each one's grpc-status."""
    message = relu_request(np.zeros(BODY_LIMIT // 4 + (1 << 18), np.float32)).SerializeToString()
    with tempfile.TemporaryDirectory() as tmp:
        bodies = []
        for coding, packed in (("gzip", gzip.compress(message, 9)), ("deflate", zlib.compress(message, 9))):
            path = os.path.join(tmp, coding)
            with open(path, "wb") as f:
                f.write(b"\1" + len(packed).to_bytes(4, "big") + packed)  # the compressed flag, the length
            bodies.append((coding, path))
        del message

        def call(i: int) -> str:
            coding, path = bodies[i % 2]
            done = subprocess.run(["nghttp", "-nv", "-t", "300", "-d", path, "-H", "content-type: application/grpc",
                                   "-H", f"grpc-encoding: {coding}", "-H", "te: trailers", f"http://{address}{INFER}"],
                                  capture_output=True, text=True, errors="replace", timeout=360)
            status = re.search(r"grpc-status: (\d+)", done.stdout)
            return status[1] if status else done.stdout[-500:]

        with ThreadPoolExecutor(count) as pool:
            sending()
            print(json.dumps(list(pool.map(call, range(count)))))


@pytest.fixture(scope="module")
def bombed() -> Server:
    server = start_server(max_body_bytes=BODY_LIMIT)
    yield server
    stop_server(server)


def probe_while(server: Server, call: str) -> tuple[list, int]:
    return bombs_probe_while(server.url, f"from tests.service.test_inflight_budget import *; {call}")


def assert_served(server: Server) -> None:
    """A normal compressed request, over HTTP and gRPC: the budget holds nothing of the bombs."""
    x = np.linspace(-2, 2, 4096, dtype=np.float32)
    body = json.dumps({"inputs": [{"name": "InputTensor", "shape": [x.size], "datatype": "FP32", "data": x.tolist()}]}).encode()
    for coding, packed in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        response = httpx.post(f"{server.url}/v2/models/relu/infer", content=packed, headers={"Content-Encoding": coding}, timeout=60)
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(np.asarray(response.json()["outputs"][0]["data"], np.float32), np.maximum(x, 0))
    with grpc.insecure_channel(server.grpc) as ch:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(relu_request(x), timeout=60, compression=grpc.Compression.Gzip)
    np.testing.assert_array_equal(relu_of(answer), np.maximum(x, 0))


def reset_peak(pid: int) -> int:
    """Reset the process's peak resident memory (VmHWM) to its current one (Linux's clear_refs 5); returns it."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return peak_rss(pid)


def test_32_gzip_bombs_at_once_are_each_413_and_only_counted(bombed):
    """The issue's case: gzip bombs, whose trailers announce more than the limit, are only counted: the
    process's peak grows by a few megabytes (it grew by 1.4 GB before the budget)."""
    before = reset_peak(bombed.process.pid)
    answers, probes = probe_while(bombed, f"send_http_bombs({bombed.url!r}, {BOMBS}, ['gzip'])")
    grown = peak_rss(bombed.process.pid) - before
    print(f"{BOMBS} gzip bombs: peak memory +{grown >> 20} MiB, {probes} probes answered")
    assert answers == [["gzip", 413]] * BOMBS, answers
    assert probes >= 1
    assert grown < GZIP_GROWTH_BOUND, f"the HTTP process's peak memory grew by {grown >> 20} MiB"
    assert_served(bombed)


def test_32_bombs_without_a_true_size_are_each_413_within_the_budget(bombed):
    """Deflate bombs, and gzip bombs whose trailer lies, are kept while the budget has room and counted
    past it: the peak grows by the budget (VKACT_INFLIGHT_BYTES, here VKACT_MAX_BODY_BYTES) and little more."""
    before = reset_peak(bombed.process.pid)
    answers, probes = probe_while(bombed, f"send_http_bombs({bombed.url!r}, {BOMBS}, ['deflate', 'lying gzip'])")
    grown = peak_rss(bombed.process.pid) - before
    print(f"{BOMBS} deflate and lying gzip bombs: peak memory +{grown >> 20} MiB, {probes} probes answered")
    assert len(answers) == BOMBS and all(status == 413 for _, status in answers), answers
    assert probes >= 1
    assert grown < GROWTH_BOUND, f"the HTTP process's peak memory grew by {grown >> 20} MiB"
    assert_served(bombed)


@pytest.mark.skipif(not os.path.exists("/usr/bin/nghttp"), reason="nghttp2-client (scripts/setup.sh installs it)")
def test_32_grpc_bombs_at_once_are_each_refused_within_the_budget(bombed):
    """gzip and deflate messages (from grpcio's clients, or any) inflating past the message limit: each
    RESOURCE_EXHAUSTED; half are deflate, kept while the budget has room, so the bound is the budget's."""
    before = reset_peak(bombed.process.pid)
    answers, probes = probe_while(bombed, f"send_grpc_bombs({bombed.grpc!r}, {BOMBS})")
    grown = peak_rss(bombed.process.pid) - before
    print(f"{BOMBS} gRPC bombs: peak memory +{grown >> 20} MiB, {probes} probes answered")
    assert answers == [str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])] * BOMBS, answers
    assert probes >= 1
    assert grown < GROWTH_BOUND, f"the HTTP process's peak memory grew by {grown >> 20} MiB"
    assert_served(bombed)


def test_the_bombs_leave_nothing_held(bombed):
    """After every bomb above (413s, RESOURCE_EXHAUSTED) the budget holds nothing."""
    with bombed.client() as http:
        assert gauge(http, "vkact_inflight_bytes") == 0


# -- 503 while others hold it, 413 when it never fits, given back when a client leaves ---------------


def relu_frame(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A /v2 binary request for RELU on ``x``: its body and headers."""
    head = json.dumps({"inputs": [{"name": "InputTensor", "shape": [x.size], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}], "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}]}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head))}


def relu_answer(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.frombuffer(response.content[int(response.headers["Inference-Header-Content-Length"]):], np.float32)


def test_a_request_finding_the_budget_held_gets_503_and_is_served_once_it_is_given_back():
    """A 4 MiB budget; a client uploading 3 MiB slowly holds what it sent. A body that inflates to 2 MiB
    gets 503 with Retry-After (it fits alone), as does a 2 MiB plain body; one that needs more than the
    whole budget gets 413 naming the setting. Once the slow client leaves, both are served."""
    server = start_server(max_body_bytes=8 << 20, inflight_bytes=4 << 20)
    try:
        x = np.tile(np.linspace(-2, 2, 1024, dtype=np.float32), 512)  # 2 MiB that compress to a few KiB
        body, headers = relu_frame(x)
        packed = gzip.compress(body)
        host, port = server.url.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(b"POST /v2/models/relu/infer HTTP/1.1\r\nHost: vkact\r\nInference-Header-Content-Length: 10\r\n"
                     b"Content-Length: %d\r\n\r\n" % (3 << 20) + b" " * ((3 << 20) - 1))
        with server.client() as http:
            assert until(lambda: gauge(http, "vkact_inflight_bytes") >= (3 << 20) - (64 << 10))
            for content, extra in ((packed, {"Content-Encoding": "gzip"}), (body, {})):
                response = http.post("/v2/models/relu/infer", content=content, headers={**headers, **extra})
                assert response.status_code == 503 and response.headers["retry-after"] == "1", response.text
                assert "VKACT_INFLIGHT_BYTES" in response.json()["error"]
            response = http.post("/v2/models/relu/infer", content=b" " * (5 << 20), headers=headers)
            assert response.status_code == 413 and "VKACT_INFLIGHT_BYTES" in response.json()["error"], response.text
            slow.close()  # the slow client leaves: what its request held is given back
            assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0)
            for content, extra in ((packed, {"Content-Encoding": "gzip"}), (body, {})):
                np.testing.assert_array_equal(relu_answer(http.post("/v2/models/relu/infer", content=content, headers={**headers, **extra})),
                                              np.maximum(x, 0))
    finally:
        stop_server(server)
