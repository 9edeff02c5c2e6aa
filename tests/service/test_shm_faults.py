"""Shared memory under attack or failure: a client that shrinks its object while a request waits for the
device (was SIGBUS in the HTTP process), a full /dev/shm under the registry (was a corrupted registry
and 500s for good), and a bound on registrations. Real servers; the device is held by SIGSTOP on the
device worker, /dev/shm is made small with a private tmpfs (unshare -m)."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from tests.engine.test_operators import max_ulp
from tests.helpers import assert_matches
from tests.service.conftest import Server, start_server, stop_server
from tests.service.test_load import worker_pid
from tests.service.test_v2 import reference
from tests.service.test_v2_errors import assert_still_serving
from tests.service.test_v2_shm import held

SHM_LIMIT = "2m"


def infer_body(region: str, nbytes: int, out_offset: int) -> dict:
    count = nbytes // 4
    return {
        "inputs": [{"name": "InputTensor", "shape": [count], "datatype": "FP32",
                    "parameters": {"shared_memory_region": region, "shared_memory_byte_size": nbytes}}],
        "outputs": [{"name": "OutputTensor", "parameters": {"shared_memory_region": region, "shared_memory_byte_size": nbytes,
                                                            "shared_memory_offset": out_offset}}],
    }


def register(client: httpx.Client, name: str, key: str, byte_size: int) -> httpx.Response:
    return client.post(f"/v2/systemsharedmemory/region/{name}/register", json={"key": key, "byte_size": byte_size})


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.timeout(120)
def test_an_object_shrunk_while_its_request_waits_is_a_400_and_the_server_lives(server: Server):
    """Input and output in one region; the device worker is stopped, so the request waits with its input
    read and its output not yet written; the client truncates the object; the device resumes. The output
    write finds the object short: a 400 naming the output's region field, no SIGBUS."""
    x = np.linspace(-4, 4, 4096, dtype=np.float32)
    key = f"/vk_test_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm{key}"
    with open(path, "wb") as f:
        f.write(x.tobytes() * 2)
    name = f"shrunk{uuid.uuid4().hex[:6]}"
    answers: list[httpx.Response] = []
    with server.client() as client:
        assert register(client, name, key, 2 * x.nbytes).status_code == 200
        pid = worker_pid(server)
        os.kill(pid, signal.SIGSTOP)
        try:
            thread = threading.Thread(target=lambda: answers.append(client.post("/v2/models/relu/infer", json=infer_body(name, x.nbytes, x.nbytes))))
            thread.start()
            for _ in range(600):  # until the request holds the region open (its input is read next)
                if held(server.process.pid, key):
                    break
                time.sleep(0.01)
            time.sleep(0.2)
            os.truncate(path, 16)
        finally:
            os.kill(pid, signal.SIGCONT)
        thread.join(60)
        assert server.process.poll() is None, "the server died"
        assert answers[0].status_code == 400, answers[0].text
        error = answers[0].json()["error"]
        assert error.startswith("outputs[0].parameters.shared_memory_region") and ("runs past the end" in error or "shrank" in error), error
        assert_still_serving(client)
        # The same region, grown again by its client, serves as before.
        os.truncate(path, 2 * x.nbytes)
        with open(path, "r+b") as f:
            f.write(x.tobytes())
        assert client.post("/v2/models/relu/infer", json=infer_body(name, x.nbytes, x.nbytes)).status_code == 200
        with open(path, "rb") as f:
            np.testing.assert_array_equal(np.frombuffer(f.read(), np.float32)[4096:], np.maximum(x, 0))
        client.post(f"/v2/systemsharedmemory/region/{name}/unregister")
    os.unlink(path)


@pytest.mark.driver_independent
@pytest.mark.timeout(180)
def test_a_full_dev_shm_fails_registration_cleanly_and_loses_nothing():
    """The server's /dev/shm is a 2 MiB tmpfs; the test fills it through /proc/PID/root. A registration
    then answers 507 with a JSON body, the registry keeps what it had (status, inferences), no
    descriptor leaks, and once there is room registering works again."""
    wrap = ("unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={SHM_LIMIT} tmpfs /dev/shm && exec "$0" "$@"')
    server = start_server(wrap=wrap)
    shm = f"/proc/{server.process.pid}/root/dev/shm"
    try:
        with server.client() as client:
            x = np.arange(-8, 8, dtype=np.float32)
            with open(f"{shm}/kept", "wb") as f:
                f.write(x.tobytes() * 2)
            assert register(client, "kept", "/kept", 2 * x.nbytes).status_code == 200
            assert client.post("/v2/models/relu/infer", json=infer_body("kept", x.nbytes, x.nbytes)).status_code == 200
            with open(f"{shm}/other", "wb") as f:
                f.write(b"\0" * 64)
            filler = os.open(f"{shm}/filler", os.O_WRONLY | os.O_CREAT)
            try:  # every block of the tmpfs
                for _ in range(1 << 16):
                    os.write(filler, b"\0" * 4096)
            except OSError:
                pass
            finally:
                os.close(filler)
            fds = fds_of(server.process.pid)
            for i in range(20):
                response = register(client, f"other{i}", "/other", 64)
                assert response.status_code == 507, response.text
                assert "registry could not be written" in response.json()["error"]
            assert fds_of(server.process.pid) == fds
            assert client.get("/v2/systemsharedmemory/status").json() == [{"name": "kept", "key": "/kept", "offset": 0, "byte_size": 2 * x.nbytes}]
            with open(f"{shm}/kept", "r+b") as f:
                f.write(x[::-1].tobytes())
            assert client.post("/v2/models/relu/infer", json=infer_body("kept", x.nbytes, x.nbytes)).status_code == 200
            with open(f"{shm}/kept", "rb") as f:
                np.testing.assert_array_equal(np.frombuffer(f.read(), np.float32)[16:], np.maximum(x[::-1], 0))
            assert_still_serving(client)
            os.unlink(f"{shm}/filler")
            assert register(client, "other", "/other", 64).status_code == 200
            assert {r["name"] for r in client.get("/v2/systemsharedmemory/status").json()} == {"kept", "other"}
            assert sorted(n for n in os.listdir(shm) if n.startswith("vkact-regions-") and ".new-" in n) == []
            metrics = client.get("/metrics").text
            assert 'vkact_errors_total{code="500"}' not in metrics
    finally:
        stop_server(server)


@pytest.mark.driver_independent
@pytest.mark.timeout(120)
def test_registrations_are_bounded():
    server = start_server(max_shm_regions=3)
    key = f"/vk_test_{uuid.uuid4().hex[:8]}"
    with open(f"/dev/shm{key}", "wb") as f:
        f.write(b"\0" * 64)
    try:
        with server.client() as client:
            for i in range(3):
                assert register(client, f"r{i}", key, 64).status_code == 200
            response = register(client, "r3", key, 64)
            assert response.status_code == 400 and "VKACT_MAX_SHM_REGIONS" in response.json()["error"], response.text
            assert len(client.get("/v2/systemsharedmemory/status").json()) == 3
            assert client.post("/v2/systemsharedmemory/region/r0/unregister").status_code == 200
            assert register(client, "r3", key, 64).status_code == 200
            assert {r["name"] for r in client.get("/v2/systemsharedmemory/status").json()} == {"r1", "r2", "r3"}
    finally:
        stop_server(server)
        os.unlink(f"/dev/shm{key}")


@pytest.mark.driver_independent
def test_region_names_are_bounded(server: Server):
    """A region name was any length the HTTP parser lets through (~15,000 characters in the path): at
    max_shm_regions such names made a 30 MB registry, dumped (200 ms) and written by every registration
    and parsed (76 ms) by the next inference of every HTTP process, all on the event loop."""
    key = f"/vk_test_{uuid.uuid4().hex[:8]}"
    with open(f"/dev/shm{key}", "wb") as f:
        f.write(b"\0" * 64)
    try:
        with server.client() as client:
            response = register(client, "n" * 5000, key, 64)
            assert response.status_code == 400 and "256" in response.json()["error"], response.text
            assert "n" * 5000 not in {r["name"] for r in client.get("/v2/systemsharedmemory/status").json()}
            longest = "m" * 256
            assert register(client, longest, key, 64).status_code == 200
            assert client.get(f"/v2/systemsharedmemory/region/{longest}/status").json()[0]["name"] == longest
            assert client.post(f"/v2/systemsharedmemory/region/{longest}/unregister").status_code == 200
    finally:
        os.unlink(f"/dev/shm{key}")


def test_a_large_region_is_read_and_written_whole(server: Server):
    """8 MiB in and out of one region: transfers above 1 MiB go through a thread, in one or more
    preadv/pwritev calls, and every byte arrives."""
    x = np.random.default_rng(7).standard_normal(1 << 21).astype(np.float32)
    key = f"/vk_test_{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm{key}"
    with open(path, "wb") as f:
        f.write(x.tobytes() + b"\xff" * x.nbytes)
    name = f"large{uuid.uuid4().hex[:6]}"
    try:
        with server.client() as client:
            assert register(client, name, key, 2 * x.nbytes).status_code == 200
            response = client.post("/v2/models/softsign/infer", json=infer_body(name, x.nbytes, x.nbytes))
            assert response.status_code == 200, response.text
            with open(path, "rb") as f:
                y = np.frombuffer(f.read(), np.float32)[1 << 21 :]
            assert_matches(y, reference("softsign", {"InputTensor": x}), max_ulp("SOFTSIGN", np.float32))
            client.post(f"/v2/systemsharedmemory/region/{name}/unregister")
    finally:
        os.unlink(path)
