"""Large inference bodies read by the kernel straight into where they go (service/http_body.py): a repeated
/v2 binary request's tensors into the job's slot, any other body into one buffer for the route. The
answers are the operator's, the connection carries the requests after a large body (pipelined too),
the body is charged to the budget of bytes in flight as it is read, and a client that stalls or
leaves mid-body gives back its slot and its bytes. Raw sockets on loopback, an independent numpy oracle."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from client import Client
from tests.service.conftest import Server, start_server, stop_server
from tests.service.test_connections import read_until_closed
from tests.service.test_large_answers import N, WAIT_S, call, connect, frame, inputs, read_answer
from tests.service.test_memory_bounds import until
from tests.service.test_process_faults import gauge


def response(s: socket.socket) -> tuple[bytes, bytes]:
    """One whole response (any status, any size): its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, data[:200]
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")))
    while len(body) < length:
        chunk = s.recv(1 << 20)
        assert chunk, head
        body += chunk
    return head, body


@pytest.fixture(scope="module")
def small_queue() -> Server:  # three slots (queue_size 1), a short body timeout
    server = start_server(queue_size=1, body_timeout_s=3)
    yield server
    stop_server(server)


def test_repeated_and_pipelined_large_requests_and_the_requests_after_them_are_answered(small_queue):
    with connect(small_queue) as s:
        for seed in range(3):  # the first read whole for the route, the later ones into the slot
            x = inputs(seed)
            np.testing.assert_array_equal(call(s, x), np.maximum(x, 0))
        xs = [inputs(10 + i) for i in range(2)]
        v1 = b"POST /v1/execute HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"  # a small request after them, on h1http
        sender = threading.Thread(target=s.sendall, args=(frame(xs[0]) + frame(xs[1]) + v1,))
        sender.start()  # pipelined: sent while the answers are read
        for x in xs:
            status, out = read_answer(s)
            assert status == 200
            np.testing.assert_array_equal(out, np.maximum(x, 0))
        sender.join()
        head, body = response(s)
        assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["field"] == "Inference-Header-Content-Length"


def test_v1_and_json_bodies_over_64_kib_are_read_whole_for_the_route(small_queue):
    x = np.random.default_rng(5).standard_normal(1 << 18).astype(np.float32)  # 1 MiB: a binary /v1 frame
    with Client(small_queue.url, timeout=WAIT_S) as vk:
        np.testing.assert_array_equal(vk.relu(x), np.maximum(x, 0))
        np.testing.assert_array_equal(vk.relu(x), np.maximum(x, 0))
    y = np.random.default_rng(6).standard_normal(20000).astype(np.float32)  # a JSON /v2 body of ~200 KB
    body = {"inputs": [{"name": "InputTensor", "shape": [y.size], "datatype": "FP32", "data": y.tolist()}]}
    with httpx.Client(base_url=small_queue.url, timeout=WAIT_S) as http:
        answer = http.post("/v2/models/relu/infer", json=body)
        assert answer.status_code == 200 and len(answer.request.content) > 1 << 16
        np.testing.assert_array_equal(np.array(answer.json()["outputs"][0]["data"], np.float32), np.maximum(y, 0))


def test_an_error_in_a_large_body_is_answered_and_the_connection_carries_on(small_queue):
    x = inputs(20)
    bad = frame(x).replace(b'"FP32"', b'"FP99"')
    with connect(small_queue) as s:
        s.sendall(bad)
        status, body = read_answer(s)
        assert status == 400 and "FP99" in json.loads(body)["error"]  # /v2's JSON error, as on httptools
        np.testing.assert_array_equal(call(s, x), np.maximum(x, 0))  # the same connection


def test_clients_that_stall_or_leave_mid_body_give_back_their_slots_and_cannot_take_them_all(small_queue):
    """Of three stalled repeated requests one reads its tensor into a slot (half the three slots, rounded
    down: http_body.slot_readers), the others are read whole first and hold no slot: a small request and
    a fourth large one still find a slot (before the bound, the three held every slot: 503 for all
    others). The one that leaves and the ones cut off by the body timeout give every slot and every
    byte in flight back, and no byte of theirs reaches another request's answer."""
    with connect(small_queue) as warm:
        call(warm, inputs(30))  # its header seen: the next ones read into the slot
    request = frame(inputs(31))
    half = request[: len(request) // 2]
    stalled = [connect(small_queue) for _ in range(3)]
    with httpx.Client(base_url=small_queue.url, timeout=10) as http:
        try:
            for s in stalled:
                s.sendall(half)
            assert until(lambda: gauge(http, "vkact_inflight_bytes") >= 3 * (len(request) - len(half)))  # all three charged
            assert gauge(http, "vkact_queue_depth") == 1  # one slot taken
            with connect(small_queue) as other:
                small = np.random.default_rng(32).standard_normal(16).astype(np.float32)
                other.sendall(frame(small))
                head, body = response(other)
                assert head.startswith(b"HTTP/1.1 200 ")
                np.testing.assert_array_equal(np.frombuffer(body[-small.nbytes :], np.float32), np.maximum(small, 0))
                y = inputs(33)
                np.testing.assert_array_equal(call(other, y), np.maximum(y, 0))
            stalled[0].close()  # leaves; the others are cut off after 3 s without a byte
            closed = read_until_closed(stalled[1:], WAIT_S)
            assert all(not data for data in closed.values())  # no answer: the connections were closed
            assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0)
            assert until(lambda: gauge(http, "vkact_queue_depth") == 0)
        finally:
            for s in stalled:
                s.close()
    for seed in range(3):  # every slot is free again, and holds this request's bytes
        with connect(small_queue) as after:
            y = inputs(40 + seed)
            np.testing.assert_array_equal(call(after, y), np.maximum(y, 0))


def test_a_large_body_is_charged_as_it_is_read():
    """Over the budget of bytes in flight: 413 before any of it is read. A client that declares a large
    body and stalls holds at most twice what it sent and a step (http_body.read_charged), not the
    length it declared: a request that fits beside it is served; one that does not is a 503 with
    Retry-After (its body dropped as it comes, never held)."""
    server = start_server(inflight_bytes=3 << 20, body_timeout_s=WAIT_S)
    try:
        x = np.random.default_rng(7).standard_normal(1 << 20).astype(np.float32)  # 4 MiB: never fits
        with connect(server) as s:
            s.sendall(frame(x)[:200_000])
            head, body = response(s)  # answered before the body is in
            assert head.startswith(b"HTTP/1.1 413 ") and b"VKACT_INFLIGHT_BYTES" in body
        y = np.random.default_rng(8).standard_normal(1 << 19).astype(np.float32)  # 2 MiB: fits alone
        with connect(server) as holder, connect(server) as other:
            holder.sendall(frame(y)[:100_000])  # charged, stalled mid-body
            with httpx.Client(base_url=server.url, timeout=10) as http:
                assert until(lambda: gauge(http, "vkact_inflight_bytes") > 100_000)
                assert gauge(http, "vkact_inflight_bytes") <= 2 * 100_000 + (1 << 16)  # not its 2 MiB
            z = np.random.default_rng(9).standard_normal(1 << 18).astype(np.float32)  # 1 MiB: fits beside it
            other.sendall(frame(z))
            head, body = response(other)
            assert head.startswith(b"HTTP/1.1 200 ")
            np.testing.assert_array_equal(np.frombuffer(body[-z.nbytes :], np.float32), np.maximum(z, 0))
            w = np.random.default_rng(10).standard_normal((3 << 18) - (1 << 14)).astype(np.float32)  # 3 MiB - 64 KiB: fits alone
            other.sendall(frame(w))  # not beside the holder's charge: 503 as it is read
            head, body = response(other)
            assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after" in head.lower() and json.loads(body)["error"]
            holder.sendall(frame(y)[100_000:])
            head, body = response(holder)
            assert head.startswith(b"HTTP/1.1 200 ")
            np.testing.assert_array_equal(np.frombuffer(body[-y.nbytes :], np.float32), np.maximum(y, 0))
    finally:
        stop_server(server)


def test_a_client_leaving_a_body_read_whole_gives_back_its_bytes(small_queue):
    """A header not seen before: the body is read into one buffer for the route, charged as it is read;
    the client leaving mid-body gives the charge back and the server serves on."""
    x = np.random.default_rng(50).standard_normal(N // 2 + 3).astype(np.float32)  # a shape of its own: not cached
    request = frame(x)
    with httpx.Client(base_url=small_queue.url, timeout=10) as http:
        with connect(small_queue) as leaving:
            leaving.sendall(request[: len(request) // 3])
            assert until(lambda: gauge(http, "vkact_inflight_bytes") >= len(request) // 3 - 1000)  # what came
        assert until(lambda: gauge(http, "vkact_inflight_bytes") == 0)
    with connect(small_queue) as after:
        y = inputs(51)
        np.testing.assert_array_equal(call(after, y), np.maximum(y, 0))


def test_a_body_sent_slowly_is_not_held_to_the_request_timeout():
    """A client on a slow link: its 4 MiB body comes over ~3.2 s, past a 2 s request timeout, in pieces
    well within the body idle timeout. The first request (read whole before the route) and the same one
    repeated (read into the slot) are both answered: the request timeout counts from the body's end
    (the repeated one was a 504 while its tensors were read under the request's deadline)."""
    server = start_server(request_timeout_s=2, body_timeout_s=WAIT_S)
    try:
        with connect(server) as s:
            for seed in range(2):
                x = np.random.default_rng(60 + seed).standard_normal(1 << 20).astype(np.float32)
                request = frame(x)
                step = len(request) // 8 + 1
                for at in range(0, len(request), step):
                    s.sendall(request[at : at + step])
                    time.sleep(0.4)
                head, body = response(s)
                assert head.startswith(b"HTTP/1.1 200 "), body[:200]
                np.testing.assert_array_equal(np.frombuffer(body[-x.nbytes :], np.float32), np.maximum(x, 0))
    finally:
        stop_server(server)


def test_stalled_readers_hold_at_most_half_the_slot_memory():
    """The count of slot readers (half the slots) left every byte of VKACT_SLOT_BYTES to a few clients trickling
    large tensors: four 128 MiB ones held the 1 GiB default and every other request got 503. The bytes of the
    slots they hold are bounded too (http_body.slot_reader_bytes, half of them), counted by the slot taken, not
    by the tensors (a job takes the smallest free slot that fits, which an earlier larger job may have left):
    here 128 MiB of slots, a free 40 MiB one, and three clients stalled mid-body on 16 MiB tensors (a 32 MiB
    job): one reads into the 40 MiB slot (a second would pass 64 MiB), the others are read whole, charged as
    their bytes come, and another large request still finds its slot."""
    server = start_server(slot_bytes=128 << 20, body_timeout_s=WAIT_S)  # the stalled ones stay until they leave
    try:
        with connect(server) as warm:
            call(warm, inputs(50))  # its header seen: the next ones read into the slot (32 MiB: 16 in, 16 out)
            bigger = np.random.default_rng(9).standard_normal(5 << 20).astype(np.float32)
            warm.sendall(frame(bigger))  # its 40 MiB slot replaces that one
            head, body = response(warm)
            assert head.startswith(b"HTTP/1.1 200 ")
            np.testing.assert_array_equal(np.frombuffer(body[-bigger.nbytes :], np.float32), np.maximum(bigger, 0))
        request = frame(inputs(51))
        stalled = [connect(server) for _ in range(3)]
        try:
            with httpx.Client(base_url=server.url, timeout=10) as http:
                half = len(request) // 2
                for s in stalled:
                    s.sendall(request[:half])
                assert until(lambda: gauge(http, "vkact_inflight_bytes") >= 3 * (len(request) - half))  # all three charged
                assert gauge(http, "vkact_queue_depth") == 1  # one slot taken, not three (nor two)
                with connect(server) as other:
                    y = inputs(52)
                    np.testing.assert_array_equal(call(other, y), np.maximum(y, 0))
        finally:
            for s in stalled:
                s.close()
        with connect(server) as after:  # and the slots are back once they leave
            for seed in range(3):
                y = inputs(53 + seed)
                np.testing.assert_array_equal(call(after, y), np.maximum(y, 0))
    finally:
        stop_server(server)
