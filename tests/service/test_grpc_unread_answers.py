"""Answers a client never reads are held within the budget of bytes in flight (VKACT_INFLIGHT_BYTES): the
audit's attack, one HTTP/2 connection sending 48 small gzip ModelInfer requests for 8 MiB answers and never
reading the socket, against a real server. The process's peak memory grows by about the budget (it grew by
every answer before), vkact_inflight_bytes counts what is held and never passes the budget, and once the
client goes the budget is back to 0 and a well-behaved call is answered correctly. Two clients: one that
keeps HTTP/2's 64 KiB window (nghttp2 holds the answers back: h2grpc's queues), one that opens a 2 GiB
window and reads nothing (the transport's write buffer fills: answers wait in the queues, not in it)."""
from __future__ import annotations

import gzip
import socket

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2_grpc

from tests.service.conftest import ASAN_RUNTIME, start_server, stop_server
from tests.service.h2_client import unread_calls
from tests.service.test_grpc_transport import INFER, assert_serving, relu_of, relu_request
from tests.service.test_inflight_budget import reset_peak
from tests.service.test_bombs import peak_rss
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge

# Driver-independent (test-portability.sh leaves them to make test): answers held within the budget of bytes in
# flight, the transport's queues
pytestmark = pytest.mark.driver_independent

BUDGET = 64 << 20
ANSWER_FLOATS = 2 << 20  # 8 MiB answers: 48 of them are six budgets
STREAMS = 48
SLACK = 32 << 20  # beyond the budget: what the calls that ran leave in the allocator


@pytest.fixture(scope="module")
def server():
    # glibc's dynamic mmap threshold would keep freed 8 MiB blocks in the heap, resident: with a fixed one
    # they go back to the system when freed, so the process's resident memory follows what it holds
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
        # the attack's connection must stay while its calls run (minutes on a loaded machine): past
        # VKACT_BODY_TIMEOUT_S without a byte read it would be cut (test_grpc_deadlines.py)
        server = start_server(max_body_bytes=16 << 20, inflight_bytes=BUDGET, body_timeout_s=3600)
    yield server
    stop_server(server)


def unread_attack(address: str, huge_window: bool) -> socket.socket:
    """The connection, its requests sent: never read (a tiny receive buffer, so the kernel holds little)."""
    packed = gzip.compress(relu_request(np.zeros(ANSWER_FLOATS, np.float32)).SerializeToString())
    body = b"\1" + len(packed).to_bytes(4, "big") + packed
    return unread_calls(address, INFER, [body] * STREAMS, huge_window, [("grpc-encoding", "gzip")])


def rss(pid: int) -> int:
    """The process's private resident memory now (RssAnon: not the tensor slots, /dev/shm, which have a
    bound of their own, VKACT_SLOT_BYTES), in bytes."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no RssAnon")


def calls_done(http: httpx.Client) -> int:
    """relu's inferences ended so far, served or failed (Triton's statistics)."""
    stats = http.get("/v2/models/relu/stats").json()["model_stats"][0]["inference_stats"]
    return stats["success"]["count"] + stats["fail"]["count"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("huge_window", [False, True], ids=["64KiB-window", "2GiB-window-unread-socket"])
def test_unread_answers_are_held_within_the_budget(server, huge_window):
    pid = server.process.pid
    assert_serving(server.grpc)
    with server.client() as http:
        assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0)
        peak_before, before, done = reset_peak(pid), rss(pid), calls_done(http)
        sock = unread_attack(server.grpc, huge_window)
        try:
            seen: list[tuple[float, int]] = []  # the budget's count and the calls ended, polled while they run

            def idle() -> bool:  # no device slot held, and neither count has moved for 2 s: the calls have run
                seen.append((gauge(http, "vkact_inflight_bytes"), calls_done(http)))
                return gauge(http, "vkact_queue_depth") == 0 and seen[-1][1] > done and len(set(seen[-20:])) == 1 == len(seen[-20:]) // 20

            assert until(idle, 240), seen[-5:]
            held, grown = seen[-1][0], rss(pid) - before
            print(f"unread answers: held {held / 2**20:.1f} MiB of the {BUDGET >> 20} MiB budget (at most "
                  f"{max(c for c, _ in seen) / 2**20:.1f} while the calls ran), memory +{grown >> 20} MiB "
                  f"(peak +{(peak_rss(pid) - peak_before) >> 20} MiB; {STREAMS} answers of {ANSWER_FLOATS * 4 >> 20} MiB)")
            assert max(c for c, _ in seen) <= BUDGET
            assert held >= ANSWER_FLOATS * 4  # the answers it holds are counted: at least one
            if not ASAN_RUNTIME:  # ASan keeps freed memory in quarantine (make test-asan): only the count is asserted there
                assert grown < BUDGET + SLACK, f"the HTTP process's memory grew by {grown >> 20} MiB and holds it"
        finally:
            sock.close()
        assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0), "the budget is not given back"
    assert_serving(server.grpc)
    x = np.linspace(-3, 3, ANSWER_FLOATS, dtype=np.float32)  # a large answer, read: served whole
    with grpc.insecure_channel(server.grpc, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(relu_request(x), timeout=120)
    np.testing.assert_array_equal(relu_of(answer), np.maximum(x, 0))
