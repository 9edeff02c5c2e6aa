"""Processes that die: the device worker under in-flight requests (a transient 503 with Retry-After,
not a 500), and the HTTP process itself (the supervisor of ``python -m service`` restarts it)."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.graph_helpers import activation, chain
from tests.service.conftest import ended, start_server, stop_server
from tests.service.helpers import binary_request, request_body
from tests.service.test_load import await_restarted_worker, one_request, worker_pid

# Driver-independent (test-portability.sh leaves them to make test): processes killed, hung and restarted:
# supervision, not the driver
pytestmark = pytest.mark.driver_independent


def gauge(client: httpx.Client, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", client.get("/metrics").text, re.M)
    assert match, name
    return float(match[1])


def test_in_flight_requests_of_a_dying_worker_get_503_with_retry_after():
    server = start_server()
    try:
        with server.client() as client, ThreadPoolExecutor(2) as pool:
            one_request(client, 1)
            pid = worker_pid(server)
            os.kill(pid, signal.SIGSTOP)  # the jobs reach its pipe and stay there
            x = np.ones(64, np.float32)
            body, headers = binary_request(request_body("SOFTSIGN", x), x.view(np.uint8))
            with server.client() as other:
                answers = [pool.submit(c.post, "/v1/execute", content=body, headers=headers) for c in (client, other)]
                for _ in range(600):
                    if gauge(client, "vkact_queue_depth") == 2:
                        break
                    time.sleep(0.01)
                os.kill(pid, signal.SIGKILL)
                responses = [a.result(60) for a in answers]
            for response in responses:
                assert response.status_code == 503, response.text
                assert response.headers["retry-after"] == "1"
                assert "device worker exited (code -9)" in response.json()["error"]
            await_restarted_worker(client, 120)
            for i in range(3):
                one_request(client, i)
            assert 'vkact_errors_total{code="500"}' not in client.get("/metrics").text
    finally:
        stop_server(server)


def http_child(server) -> int:
    """The supervised HTTP server: the supervisor's one child."""
    children = [int(p) for p in os.popen(f"pgrep -P {server.process.pid}").read().split()]
    assert len(children) == 1, children
    return children[0]


@pytest.mark.timeout(180)
def test_the_supervisor_restarts_a_killed_http_process_and_registrations_survive():
    """``python -m service`` supervises its HTTP server: SIGKILL it (as SIGBUS or the OOM killer would)
    and a new one serves, the dead one's slot files are gone, the shared-memory registrations, the
    loaded graph models and a model's batching loaded with a config are kept (the server's, not the
    process's); SIGTERM to the supervisor stops both and removes the three files."""
    server = start_server(supervised=True)
    key = f"/vk_test_{os.getpid()}_sup"
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    with open(f"/dev/shm{key}", "wb") as f:
        f.write(x.tobytes() * 2)
    try:
        with server.client() as client:
            assert client.post("/v2/systemsharedmemory/region/kept/register", json={"key": key, "byte_size": 2 * x.nbytes}).status_code == 200
            graph = chain([activation("LINEAR", np.float32, (64,), Alpha=2.0, Beta=0.0), activation("RELU", np.float32, (64,))])
            assert client.post("/v2/repository/models/twice_relu/load", json={"parameters": {"config": json.dumps(graph)}}).status_code == 200
            batched = {**client.get("/v2/models/celu/config").json(), "max_batch_size": 3}
            assert client.post("/v2/repository/models/celu/load", json={"parameters": {"config": json.dumps(batched)}}).status_code == 200
            one_request(client, 1)
            first = http_child(server)
            slots = [n for n in os.listdir("/dev/shm") if n.startswith(f"vkact-{first}-")]
            assert slots
            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 90
            while True:  # until a new HTTP process answers ready
                assert time.monotonic() < deadline, "the HTTP server was not restarted"
                try:
                    if client.get("/health/ready").status_code == 200 and http_child(server) != first:
                        break
                except (httpx.TransportError, AssertionError):
                    pass
                time.sleep(0.2)
            assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"vkact-{first}-")]
            assert [r["name"] for r in client.get("/v2/systemsharedmemory/status").json()] == ["kept"]
            assert client.get("/v2/models/celu/config").json() == batched
            answer = client.post("/v2/models/twice_relu/infer", json={"inputs": [{"name": "x", "shape": [64], "datatype": "FP32", "data": x.tolist()}]})
            assert answer.status_code == 200, answer.text   # compiled by the new process, from the server's file
            assert np.array_equal(np.array(answer.json()["outputs"][0]["data"], np.float32), np.maximum(2 * x, 0))
            body = {"inputs": [{"name": "InputTensor", "shape": [64], "datatype": "FP32",
                                "parameters": {"shared_memory_region": "kept", "shared_memory_byte_size": x.nbytes}}],
                    "outputs": [{"name": "OutputTensor", "parameters": {"shared_memory_region": "kept", "shared_memory_byte_size": x.nbytes,
                                                                        "shared_memory_offset": x.nbytes}}]}
            assert client.post("/v2/models/relu/infer", json=body).status_code == 200
            with open(f"/dev/shm{key}", "rb") as f:
                np.testing.assert_array_equal(np.frombuffer(f.read(), np.float32)[64:], np.maximum(x, 0))
            one_request(client, 2)
        documents = tuple(f"vkact-{kind}-{server.process.pid}-" for kind in ("regions", "graphs", "batching"))
        files = [n for n in os.listdir("/dev/shm") if n.startswith(documents)]
        assert len([n for n in files if n.endswith(".json")]) == 3
        server.process.terminate()
        assert server.process.wait(30) == 0
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(documents)]
    finally:
        if server.process.poll() is None:
            stop_server(server)
        os.unlink(f"/dev/shm{key}")


def _stopped_while_starting(server) -> int:
    """Kill the device worker and SIGSTOP its successor before it reports ready (a driver hung while
    creating the device); the successor's pid. Tried again if the successor was ready first."""
    with server.client() as client:
        for _ in range(5):
            old = worker_pid(server)
            os.kill(old, signal.SIGKILL)
            for _ in range(1000):
                try:
                    new = worker_pid(server)
                except AssertionError:  # the old one not reaped yet, or none started yet
                    new = old
                if new != old:
                    break
                time.sleep(0.005)
            os.kill(new, signal.SIGSTOP)
            if client.get("/health/ready").status_code == 503:
                return new
            os.kill(new, signal.SIGCONT)
            await_restarted_worker(client, 120)
    raise AssertionError("the restarted worker was always ready before it could be stopped")


def test_a_worker_hung_while_starting_is_killed_and_started_again():
    """A device worker that never reports ready (stopped here; a driver hung in device creation) was
    waited for forever: readiness 503 for good. Past worker_start_timeout_s it is killed and replaced."""
    server = start_server(worker_start_timeout_s=3)
    try:
        with server.client() as client:
            one_request(client, 1)
            hung = _stopped_while_starting(server)
            deadline = time.monotonic() + 90
            while client.get("/health/ready").status_code != 200 or worker_pid(server) == hung:
                assert time.monotonic() < deadline, "the hung worker was never replaced"
                time.sleep(0.2)
            assert ended(hung)
            for i in range(3):
                one_request(client, i)
    finally:
        stop_server(server)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


@pytest.mark.timeout(240)
def test_sigterm_while_the_supervisor_restarts_its_http_server_stops_both():
    """SIGTERM that arrives while the supervisor starts a new HTTP process (its Popen running) was passed
    to the dead one only: the new one ran on and the supervisor waited on it for good."""
    for _ in range(2):
        server = start_server(supervised=True)
        supervisor = server.process.pid
        try:
            first = _children(supervisor)[0]
            os.kill(first, signal.SIGKILL)
            for _ in range(200_000):  # until the new HTTP process exists (forked, maybe not yet exec'd)
                if [p for p in _children(supervisor) if p != first]:
                    break
            os.kill(supervisor, signal.SIGTERM)
            assert server.process.wait(60) == 0, "the supervisor did not stop"
            assert not _children(supervisor)
        finally:
            for pid in _children(supervisor):
                os.kill(pid, signal.SIGKILL)
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait()


@pytest.mark.timeout(240)
def test_a_flood_of_503s_does_not_block_on_the_log():
    """Every 503 (queue full, worker lost or starting) was logged at ERROR, one line a request, written
    on the event loop: a client that floods a busy server made the log its bottleneck, and once the log's
    reader fell behind (here: the test's stdout pipe, never read, 64 KiB) the event loop blocked on the
    write and the server answered nothing, liveness included. 5xx lines are now at most one a second."""
    server = start_server(queue_size=1)  # its stdout is a pipe that nobody reads
    try:
        with httpx.Client(base_url=server.url, timeout=20) as client:
            one_request(client, 1)
            worker = worker_pid(server)
            os.kill(worker, signal.SIGSTOP)  # the first jobs stay on the device, the queue fills
            try:
                x = np.ones(16, np.float32)
                body, headers = binary_request(request_body("RELU", x), x.view(np.uint8))
                with ThreadPoolExecutor(4) as pool:
                    held = [pool.submit(client.post, "/v1/execute", content=body, headers=headers) for _ in range(3)]
                    for _ in range(600):
                        if gauge(client, "vkact_queue_depth") >= 3:
                            break
                        time.sleep(0.01)
                    codes = [client.post("/v1/execute", content=body, headers=headers).status_code for _ in range(1500)]
                    assert set(codes) == {503}
                    assert client.get("/health/live").status_code == 200
                    os.kill(worker, signal.SIGCONT)
                    assert all(h.result(60).status_code == 200 for h in held)
            finally:
                os.kill(worker, signal.SIGCONT)
            one_request(client, 2)
    finally:
        stop_server(server)


def test_a_server_that_cannot_start_stops_its_supervisor(server):
    """A fault that a restart cannot mend (here the gRPC port is taken: uvicorn's startup fails) ends
    the supervisor with the server's status and its message, instead of restarting it for ever."""
    from tests.service.conftest import start_server

    taken = int(server.grpc.rsplit(":", 1)[1])
    with pytest.raises(RuntimeError) as info:
        start_server(supervised=True, grpc_port=taken)
    message = str(info.value)
    assert message.startswith("server exited") and "gRPC cannot listen" in message
    assert "not restarting it" in message and "restarting in" not in message  # one start, no retries
