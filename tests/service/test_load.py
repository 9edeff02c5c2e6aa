"""The service under concurrency, a large request, a full queue and a crashed worker."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from client.buffers import to_buffer
from client.codec import HEADER_LENGTH
from service.operators import parse_operator
from tests.engine.test_operators import CASES, max_ulp
from tests.helpers import assert_matches, tensor
from tests.service.conftest import ended, spawned_children, start_server, stop_server
from tests.service.test_bombs import PROBE_TIMEOUT_S
from tests.service.helpers import binary_request, decode_response, request_body




def one_request(client: httpx.Client, i: int) -> None:
    rng = np.random.default_rng(i)
    kind, params = CASES[i % len(CASES)]
    dtype = (np.float32, np.float16)[i % 2]
    shape = tuple(int(s) for s in rng.integers(1, 9, 1 + i % 4))
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    operator = request_body(kind, x, **params)
    body, headers = binary_request(operator, to_buffer(x))
    response = client.post("/v1/execute", content=body, headers=headers)
    assert_matches(decode_response(response, dtype), parse_operator(operator).reference(x), max_ulp(kind, dtype))


def test_200_concurrent_requests_from_16_threads(server):
    with server.client(limits=httpx.Limits(max_connections=16)) as client, ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: one_request(client, i), range(200)))


@pytest.mark.parametrize("kind, dtype", [("SCALED_TANH", np.float32), ("CELU", np.float16)])
def test_concurrent_requests_of_one_descriptor_each_get_their_own_answer(server, kind, dtype):
    """Requests that share a descriptor and differ in data, 16 at a time: the device worker batches them
    (one dispatch, inputs end to end), and every caller must still get the answer to its own tensor.

    The worker is stopped (SIGSTOP) until requests queue behind the first: a device fast enough to answer
    each before the next arrives never batches (an H100 did not, once each eval stopped paying 0.5 ms)."""
    def request(i: int) -> None:
        x = (np.random.default_rng(i).standard_normal(512) * 3).astype(dtype)
        operator = request_body(kind, x)
        body, headers = binary_request(operator, x.view(np.uint8))
        got = decode_response(client.post("/v1/execute", content=body, headers=headers), dtype)
        assert_matches(got, parse_operator(operator).reference(x), max_ulp(kind, dtype))

    model = f'{{model="{kind.lower()}",version="1"}}'
    (worker,) = spawned_children(server.process.pid)
    with server.client(limits=httpx.Limits(max_connections=16)) as client, server.client() as probe, ThreadPoolExecutor(16) as pool:
        request(320)  # the worker ready and this descriptor's pipeline built before the worker is stopped
        before = _metric(client, f"nv_inference_count{model}"), _metric(client, f"nv_inference_exec_count{model}")
        os.kill(worker, signal.SIGSTOP)
        try:
            answered = pool.map(request, range(320))
            deadline = time.monotonic() + 60  # a bound on waiting, not on latency: the queue fills at once
            # (on a connection of its own: the 16 of the pool are the stopped requests')
            while _metric(probe, "vkact_queue_depth") < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.kill(worker, signal.SIGCONT)
        list(answered)
        inferences = _metric(client, f"nv_inference_count{model}") - before[0]
        executions = _metric(client, f"nv_inference_exec_count{model}") - before[1]
    assert inferences == 320 and executions < 320, (inferences, executions)  # some ran batched


def test_liveness_answers_while_a_64_mib_request_computes(server, tmp_path):
    """Probes keep being answered while one large request is read, computed and answered: each waited for
    generously (PROBE_TIMEOUT_S: a timeout, not a latency bound: a busy CI machine must not fail this), and
    several of them while the request is in flight, which a loop held by the request could not do. The
    latency itself is a figure of the benchmark (bench/service.py, liveness under load).

    The big request comes from another process (curl): in this one, httpx would hold the GIL while it
    sends and parses 64 MiB, and the probe would measure the test rather than the server."""
    n = 16 << 20  # 64 MiB of float32
    x = np.random.default_rng(3).standard_normal(n, dtype=np.float32)
    operator = request_body("CELU", x)
    body, headers = binary_request(operator, x.view(np.uint8))
    (tmp_path / "body").write_bytes(body)
    curl = ["curl", "-sS", "-o", str(tmp_path / "reply"), "-D", str(tmp_path / "headers"), "--data-binary", f"@{tmp_path / 'body'}"]
    for key, value in headers.items():
        curl += ["-H", f"{key}: {value}"]
    probes = 0
    with httpx.Client(base_url=server.url, timeout=PROBE_TIMEOUT_S) as probe:  # generous: see test_bombs
        probe.get("/health/live")
        big = subprocess.Popen([*curl, f"{server.url}/v1/execute"])
        while big.poll() is None:
            assert probe.get("/health/live").status_code == 200  # httpx raises past the probe's budget
            probes += 1
            time.sleep(0.005)
    assert big.returncode == 0
    reply = (tmp_path / "reply").read_bytes()
    length = int(next(line.split(":")[1] for line in (tmp_path / "headers").read_text().splitlines() if line.lower().startswith(HEADER_LENGTH.lower())))
    y = np.frombuffer(reply[length:], np.float32)
    assert_matches(y[:: 1 << 10], parse_operator(operator).reference(x[:: 1 << 10]), 4)
    assert probes >= 3, f"only {probes} probes answered while the large request was in flight"


@pytest.mark.driver_independent
def test_full_queue_answers_503_with_retry_after():
    server = start_server(queue_size=1)
    try:
        n = 4 << 20
        x = np.ones(n, np.float32)
        body, headers = binary_request(request_body("SCALED_TANH", x), x.view(np.uint8))
        with server.client(limits=httpx.Limits(max_connections=12)) as client, ThreadPoolExecutor(12) as pool:
            responses = list(pool.map(lambda _: client.post("/v1/execute", content=body, headers=headers), range(12)))
            busy = [r for r in responses if r.status_code == 503]
            ok = [r for r in responses if r.status_code == 200]
            assert busy and ok and len(busy) + len(ok) == 12
            assert all(r.headers["retry-after"] == "1" and r.json()["error"] for r in busy)
            np.testing.assert_allclose(decode_response(ok[0], np.float32)[:8], np.tanh(0.5), rtol=1e-6)
            assert client.post("/v1/execute", content=body, headers=headers).status_code == 200
    finally:
        stop_server(server)


def worker_pid(server) -> int:
    workers = spawned_children(server.process.pid)
    assert len(workers) == 1, workers
    return workers[0]


def await_restarted_worker(client: httpx.Client, seconds: float) -> None:
    """Until a restarted device worker is ready: the restart count first (readiness read before it could
    predate the worker's end)."""
    deadline = time.monotonic() + seconds
    while client.get("/v1/device").json()["worker_restarts"] < 1 or client.get("/health/ready").status_code != 200:
        assert time.monotonic() < deadline, "the worker did not come back"
        time.sleep(0.1)


@pytest.mark.driver_independent
def test_a_crashed_worker_is_restarted():
    server = start_server()
    try:
        with server.client() as client:
            one_request(client, 1)
            os.kill(worker_pid(server), signal.SIGKILL)
            await_restarted_worker(client, 120)  # a wait, not a bound: a new worker loads kp and its shaders
            for i in range(5):
                one_request(client, i)
    finally:
        stop_server(server)


@pytest.mark.driver_independent
@pytest.mark.timeout(60)
def test_a_queued_request_whose_caller_left_never_reaches_the_device():
    import asyncio

    from service.config import Settings
    from service.worker import DeviceWorker

    async def scenario() -> tuple[int, int]:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        big = parse_operator(request_body("CELU", np.zeros(1 << 23, np.float32)))
        small = parse_operator(request_body("CELU", np.zeros(8, np.float32)))
        running = [asyncio.ensure_future(worker.run(big, [np.zeros(1 << 25, np.uint8)], False)) for _ in range(2)]
        while worker.dispatched < 2:  # both big jobs on the device: the next one has to queue
            await asyncio.sleep(0.001)
        queued = asyncio.ensure_future(worker.run(small, [np.zeros(32, np.uint8)], False))
        await asyncio.sleep(0.001)
        queued.cancel()
        for r in await asyncio.gather(*running):
            r.release()
        after = await worker.run(small, [np.zeros(32, np.uint8)], False)
        after.release()
        await worker.close()
        return worker.dispatched, worker.queue_depth

    dispatched, depth = asyncio.run(scenario())
    assert dispatched == 3 and depth == 0  # two big, one small: the cancelled job was never sent


def _metric(client: httpx.Client, series: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(series + " ") or line.startswith(series + "{") and line.split(" ")[0] == series:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no series {series}")


@pytest.mark.driver_independent
def test_a_request_past_the_timeout_gets_504_and_the_service_carries_on():
    server = start_server(request_timeout_s=0.02)
    try:
        x = np.ones(1 << 24, np.float32)  # GELU on 64 MiB: far longer than 20 ms on any CPU
        body, headers = binary_request(request_body("GELU", x), x.view(np.uint8))
        with server.client() as client:
            response = client.post("/v1/execute", content=body, headers=headers)
            assert response.status_code == 504 and "within 0.02 s" in response.json()["error"]
            deadline = time.monotonic() + 120  # the job finishes on the device (GELU on 64 MiB: long on a busy CPU), then its slot is free
            while _metric(client, "vkact_queue_depth") != 0:
                assert time.monotonic() < deadline, "the timed-out job never let its slot go"
                time.sleep(0.02)
            # A small request's first run may itself outlast 20 ms (its pipeline is built then); the
            # ones after it are answered, correctly.
            x = np.linspace(-3, 3, 64, dtype=np.float32)
            body, headers = binary_request(request_body("CELU", x), x.view(np.uint8))
            statuses = []
            while not statuses or statuses[-1] != 200:
                response = client.post("/v1/execute", content=body, headers=headers)
                statuses.append(response.status_code)
                assert len(statuses) <= 10 and set(statuses) <= {200, 504}, statuses
            assert_matches(decode_response(response, np.float32), parse_operator(request_body("CELU", x)).reference(x), 4)
    finally:
        stop_server(server)


@pytest.mark.driver_independent
@pytest.mark.timeout(120)
@pytest.mark.parametrize("header_seen", [False, True], ids=["route", "direct path"])
def test_a_queued_request_whose_client_hung_up_is_answered_by_nobody_and_never_runs(header_seen):
    """Over HTTP: four large requests keep the device busy (two handed to the worker, two waiting in the
    queue, as nv_inference_pending_request_count shows: Triton's gauge counts only requests awaiting
    execution); a small one queued behind them is sent on a raw socket that hangs up once it waits. It
    never reaches the device: CELU is executed no more times and counts one failure. ``header_seen``: the
    same request answered once before, so its header is cached and it takes the direct path
    (service/http_direct.py)."""
    import socket
    import threading

    server = start_server()
    try:
        # Long on the device, quick to upload: one row broadcast (zero stride) to 4,096 x 4,096 elements.
        row = np.linspace(-3, 3, 4096, dtype=np.float32)
        big_op = {"Type": "DML_OPERATOR_ACTIVATION_GELU", "InputTensor": tensor(np.float32, (4096, 4096), (0, 1)),
                  "OutputTensor": tensor(np.float32, (4096, 4096))}
        big_body, big_headers = binary_request(big_op, row.view(np.uint8))
        small = np.ones(8, np.float32)
        body, headers = binary_request(request_body("CELU", small), small.view(np.uint8))
        gelu, celu = '{model="gelu",version="1"}', '{model="celu",version="1"}'
        with server.client(limits=httpx.Limits(max_connections=5)) as client:
            if header_seen:
                assert client.post("/v1/execute", content=body, headers=headers).status_code == 200
            executed = _metric(client, f"nv_inference_exec_count{celu}")
            statuses: list[int] = []
            threads = [threading.Thread(target=lambda: statuses.append(client.post("/v1/execute", content=big_body, headers=big_headers).status_code))
                       for _ in range(4)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while _metric(client, f"nv_inference_pending_request_count{gelu}") < 2:  # two on the device, two waiting
                assert time.monotonic() < deadline and all(t.is_alive() for t in threads), "the large requests never queued"
                time.sleep(0.002)
            host, port = server.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port))) as sock:
                head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": len(body), "Host": host}.items())
                sock.sendall(f"POST /v1/execute HTTP/1.1\r\n{head}\r\n".encode() + body)
                # Behind two large jobs in the queue: it can reach the device only after three of them end.
                while _metric(client, f"nv_inference_pending_request_count{celu}") < 1:
                    assert time.monotonic() < deadline, "the small request never queued"
                    time.sleep(0.002)
            for t in threads:
                t.join()
            assert statuses == [200, 200, 200, 200]
            deadline = time.monotonic() + 60  # a wait, not a latency bound: it is counted when the loop gets to it
            while _metric(client, f"nv_inference_request_failure{celu}") < 1:
                assert time.monotonic() < deadline, "the hung-up request was never counted"
                time.sleep(0.01)
            assert _metric(client, f"nv_inference_exec_count{celu}") == executed
            assert _metric(client, f"nv_inference_pending_request_count{celu}") == 0
            assert _metric(client, "vkact_queue_depth") == 0
            one_request(client, 3)
    finally:
        stop_server(server)


def _run_queued_behind_slow_jobs(queued: list) -> tuple[list[np.ndarray], list[int], int, int]:
    """Run ``queued`` (descriptor, input) jobs while two slow ones fill the device window, so they queue
    and may batch; their outputs, batch sizes, and the worker's dispatched jobs and batches."""
    import asyncio

    from service.config import Settings
    from service.worker import DeviceWorker

    # Long on the device, quick to hand over: one row broadcast (zero stride) to 4,096 x 4,096 elements.
    slow = parse_operator({"Type": "DML_OPERATOR_ACTIVATION_GELU", "InputTensor": tensor(np.float32, (4096, 4096), (0, 1)),
                           "OutputTensor": tensor(np.float32, (4096, 4096))})

    async def scenario() -> tuple[list[np.ndarray], list[int], int, int]:
        worker = DeviceWorker(Settings(pin_cpu="off"))  # in-process: never pin the test runner's thread
        worker.start()
        await worker.wait_ready(60)
        busy = [asyncio.ensure_future(worker.run(slow, [np.zeros(4096 * 4, np.uint8)], False)) for _ in range(2)]
        while worker.dispatched < 2:  # the window is full: what follows queues
            await asyncio.sleep(0.001)
        jobs = [asyncio.ensure_future(worker.run(op, [x.view(np.uint8)], False)) for op, x in queued]
        outputs, sizes = [], []
        for job in jobs:
            result = await job
            outputs.append(np.frombuffer(result.output, np.float32).copy())
            sizes.append(result.batch_size)
            result.release()
        for r in await asyncio.gather(*busy):
            r.release()
        await worker.close()
        return outputs, sizes, worker.dispatched, worker.batches

    return asyncio.run(scenario())


@pytest.mark.timeout(60)
def test_queued_requests_of_one_descriptor_run_as_one_batch_and_each_gets_its_answer():
    rng = np.random.default_rng(11)
    shrink = parse_operator(request_body("SHRINK", np.zeros(300, np.float32), Bias=0.25))
    celu = parse_operator(request_body("CELU", np.zeros(300, np.float32)))
    queued = [(shrink, rng.standard_normal(300).astype(np.float32)) for _ in range(5)]
    queued += [(celu, rng.standard_normal(300).astype(np.float32))]
    queued += [(shrink, rng.standard_normal(300).astype(np.float32)) for _ in range(3)]

    outputs, sizes, dispatched, batches = _run_queued_behind_slow_jobs(queued)
    for (op, x), y in zip(queued, outputs):
        assert_matches(y, op.reference(x), 4)
    # 2 slow ones alone, then at most three messages for the 9 queued: SHRINK x5, CELU, SHRINK x3
    assert dispatched == 2 + len(queued) and batches <= 2 + 3
    assert sizes[5] == 1 and round(sum(1 / n for n in sizes)) == batches - 2  # each job knows its batch's size


@pytest.mark.timeout(60)
def test_equal_descriptors_spelled_differently_share_one_key_and_batch_together():
    """RELU with and without DimensionCount (and TotalTensorSizeInBytes) are the same descriptor once
    validated: one canonical key, and queued side by side they run in one dispatch."""
    from service.jobs import descriptor_key

    rng = np.random.default_rng(12)
    plain = request_body("RELU", np.zeros(300, np.float32))
    spelled = {**plain, **{name: {**plain[name], "DimensionCount": 1, "TotalTensorSizeInBytes": 1200}
                           for name in ("InputTensor",)}}
    twins = parse_operator(plain), parse_operator(spelled)
    assert twins[0] == twins[1] and descriptor_key(twins[0]) == descriptor_key(twins[1])
    queued = [(twins[i % 2], rng.standard_normal(300).astype(np.float32)) for i in range(6)]

    outputs, sizes, dispatched, batches = _run_queued_behind_slow_jobs(queued)
    for (op, x), y in zip(queued, outputs):
        assert_matches(y, op.reference(x), 0)
    assert dispatched == 2 + len(queued) and batches == 2 + 1 and sizes == [len(queued)] * len(queued)


@pytest.mark.driver_independent
def test_a_hung_device_worker_is_killed_and_the_service_recovers():
    """SIGSTOP plays a hung device: the request on it gets its 504, the watchdog kills the worker once
    the job has been on the device past device_timeout_s, readiness drops, and after the restart
    requests are answered again."""
    server = start_server(request_timeout_s=1, device_timeout_s=2)
    try:
        with server.client() as client:
            one_request(client, 1)
            pid = worker_pid(server)
            os.kill(pid, signal.SIGSTOP)
            x = np.ones(16, np.float32)
            body, headers = binary_request(request_body("SOFTSIGN", x), x.view(np.uint8))
            assert client.post("/v1/execute", content=body, headers=headers).status_code == 504
            await_restarted_worker(client, 120)
            assert ended(pid)  # killed
            for i in range(3):
                one_request(client, i)
    finally:
        stop_server(server)
