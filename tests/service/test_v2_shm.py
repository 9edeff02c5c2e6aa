"""Triton's system shared memory extension with tritonclient.utils.shared_memory: tensors read from and
written to client-created POSIX shared memory, no bytes in the HTTP body; bad keys, offsets and sizes
answer 400; unregistering releases the server's mapping."""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.service.conftest import spawned_children
from tests.service.test_v2 import address, reference
from tests.service.test_v2_errors import assert_still_serving


@pytest.fixture(scope="module")
def tc(server) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(address(server))
    client.unregister_system_shared_memory()
    yield client
    client.unregister_system_shared_memory()
    client.close()


class Region:
    """A client-side region (created with tritonclient's helper) that the test registers itself."""

    def __init__(self, size: int) -> None:
        self.name = f"r{uuid.uuid4().hex[:8]}"
        self.key = f"/vk_test_{self.name}"
        self.size = size
        self.handle = shm.create_shared_memory_region(self.name, self.key, size)

    def register(self, client, offset: int = 0, byte_size: int | None = None) -> Region:
        client.register_system_shared_memory(self.name, self.key, self.size - offset if byte_size is None else byte_size, offset)
        return self


@pytest.fixture
def regions() -> Iterator[callable]:
    made: list[Region] = []

    def make(size: int) -> Region:
        made.append(Region(size))
        return made[-1]

    yield make
    for r in made:
        shm.destroy_shared_memory_region(r.handle)


def shm_input(name: str, array: np.ndarray, region: Region, offset: int = 0) -> triton.InferInput:
    i = triton.InferInput(name, list(array.shape), {np.float32: "FP32", np.float16: "FP16"}[array.dtype.type])
    i.set_shared_memory(region.name, array.nbytes, offset)
    return i


def shm_output(name: str, region: Region, byte_size: int, offset: int = 0) -> triton.InferRequestedOutput:
    out = triton.InferRequestedOutput(name)
    out.set_shared_memory(region.name, byte_size, offset)
    return out


def test_input_and_output_in_one_region(tc, regions):
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    io = regions(2 * x.nbytes).register(tc)
    shm.set_shared_memory_region(io.handle, [x])
    result = tc.infer("shrink", [shm_input("InputTensor", x, io)], outputs=[shm_output("OutputTensor", io, x.nbytes, x.nbytes)],
                      parameters={"Bias": 0.5, "Threshold": 1.0})
    entry = result.get_output("OutputTensor")
    assert entry == {"name": "OutputTensor", "datatype": "FP32", "shape": [8, 8]}  # as Triton answers: no parameters
    y = shm.get_contents_as_numpy(io.handle, np.float32, entry["shape"], offset=x.nbytes)
    np.testing.assert_array_equal(y, reference("shrink", {"InputTensor": x}, Bias=0.5, Threshold=1.0))


def test_two_inputs_at_offsets_and_an_output_region(tc, regions):
    x, dy = (np.random.default_rng(i).standard_normal((4, 6)).astype(np.float32) for i in range(2))
    inputs = regions(x.nbytes + dy.nbytes).register(tc)
    outputs = regions(x.nbytes + 16).register(tc, offset=16)  # a region that starts 16 bytes into its object
    shm.set_shared_memory_region(inputs.handle, [x, dy])
    result = tc.infer("relu_grad", [shm_input("InputTensor", x, inputs), shm_input("InputGradientTensor", dy, inputs, x.nbytes)],
                      outputs=[shm_output("OutputGradientTensor", outputs, x.nbytes)])
    assert "parameters" not in result.get_output("OutputGradientTensor")
    y = shm.get_contents_as_numpy(outputs.handle, np.float32, [4, 6], offset=16)
    np.testing.assert_array_equal(y, reference("relu_grad", {"InputTensor": x, "InputGradientTensor": dy}))


def test_shared_memory_input_with_a_binary_output_in_fp16(tc, regions):
    x = np.linspace(-3, 3, 11, dtype=np.float16)  # 22 bytes: the descriptor's buffer is padded to 24
    region = regions(x.nbytes).register(tc)
    shm.set_shared_memory_region(region.handle, [x])
    result = tc.infer("celu", [shm_input("InputTensor", x, region)])
    np.testing.assert_array_equal(result.as_numpy("OutputTensor"), reference("celu", {"InputTensor": x}))


def test_status_and_unregister(tc, regions):
    a, b = regions(64).register(tc), regions(128).register(tc, offset=64)
    listed = {r["name"]: r for r in tc.get_system_shared_memory_status()}
    assert listed[a.name] == {"name": a.name, "key": a.key, "offset": 0, "byte_size": 64}
    assert tc.get_system_shared_memory_status(b.name) == [{"name": b.name, "key": b.key, "offset": 64, "byte_size": 64}]
    tc.unregister_system_shared_memory(a.name)
    tc.unregister_system_shared_memory(a.name)  # unknown names are not an error, as in Triton
    assert a.name not in {r["name"] for r in tc.get_system_shared_memory_status()}
    with pytest.raises(InferenceServerException) as info:
        tc.get_system_shared_memory_status(a.name)
    assert info.value.status() == "404"
    tc.unregister_system_shared_memory()
    assert tc.get_system_shared_memory_status() == []


def held(pid: int, key: str) -> bool:
    """Whether process ``pid`` maps the object or holds a descriptor of it."""
    path = f"/dev/shm{key}"
    if key in open(f"/proc/{pid}/maps").read():
        return True
    fds = f"/proc/{pid}/fd"
    links = []
    for fd in os.listdir(fds):
        try:
            links.append(os.readlink(os.path.join(fds, fd)))
        except OSError:  # closed meanwhile
            pass
    return path in links


def test_a_region_is_neither_mapped_nor_held_between_requests(server, tc, regions):
    """Regions are read and written through a descriptor opened for the request (never mapped: a client
    may shrink its object at any time), so nothing of a region stays in the server between requests."""
    x = np.ones(256, np.float32)
    region = regions(2 * x.nbytes).register(tc)
    shm.set_shared_memory_region(region.handle, [x])
    tc.infer("softsign", [shm_input("InputTensor", x, region)], outputs=[shm_output("OutputTensor", region, x.nbytes, x.nbytes)])
    np.testing.assert_allclose(shm.get_contents_as_numpy(region.handle, np.float32, [256], offset=x.nbytes), x / 2, rtol=1e-6)
    assert not held(server.process.pid, region.key)
    tc.unregister_system_shared_memory(region.name)
    with pytest.raises(InferenceServerException, match="not a registered") as info:
        tc.infer("softsign", [shm_input("InputTensor", x, region)])
    assert info.value.status() == "404"  # as Triton answers an unknown region


def test_asyncio_client(server, regions):
    x = np.linspace(-2, 2, 32, dtype=np.float32)
    region = regions(2 * x.nbytes)
    shm.set_shared_memory_region(region.handle, [x])

    async def scenario() -> np.ndarray:
        async with triton_aio.InferenceServerClient(address(server)) as client:
            await client.register_system_shared_memory(region.name, region.key, region.size)
            status = await client.get_system_shared_memory_status(region.name)
            assert status[0]["byte_size"] == region.size
            await client.infer("tanh", [shm_input("InputTensor", x, region)], outputs=[shm_output("OutputTensor", region, x.nbytes, x.nbytes)])
            await client.unregister_system_shared_memory(region.name)
        return shm.get_contents_as_numpy(region.handle, np.float32, [32], offset=x.nbytes)

    np.testing.assert_allclose(asyncio.run(scenario()), np.tanh(x), rtol=1e-6, atol=1e-6)


def raises_400(call, match: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == "400" and match in info.value.message(), info.value.message()


def test_bad_registrations(tc, http, regions):
    region = regions(64)
    raises_400(lambda: tc.register_system_shared_memory("x", "/vk_test_does_not_exist", 16), "No such file")
    raises_400(lambda: tc.register_system_shared_memory("x", region.key, 65), "runs past the end")
    raises_400(lambda: tc.register_system_shared_memory("x", region.key, 32, 40), "runs past the end")
    raises_400(lambda: tc.register_system_shared_memory("x", "/a/b", 16), "not a valid shm_open name")
    raises_400(lambda: tc.register_system_shared_memory("x", "../etc/passwd", 16), "not a valid shm_open name")
    raises_400(lambda: tc.register_system_shared_memory("x", "vkact-0-0", 16), "this service's own")
    raises_400(lambda: tc.register_system_shared_memory("x", region.key, 0), "byte_size")
    region.register(tc)
    raises_400(lambda: region.register(tc), "already registered")
    for body in (b"", b"{", b'{"key": 1, "byte_size": 8}', b'{"key": "k", "byte_size": -1}', b'{"key": "k", "byte_size": 8, "x": 1}'):
        response = http.post("/v2/systemsharedmemory/region/y/register", content=body)
        assert response.status_code == 400 and set(response.json()) == {"error"}, response.text
    assert_still_serving(http)


def test_bad_tensor_references(tc, http, regions):
    x = np.ones(16, np.float32)
    region = regions(x.nbytes).register(tc)
    good = lambda: shm_input("InputTensor", x, region)  # noqa: E731
    small = triton.InferInput("InputTensor", [16], "FP32").set_shared_memory(region.name, 32)
    raises_400(lambda: tc.infer("relu", [small]), "32 bytes given")
    past = triton.InferInput("InputTensor", [16], "FP32").set_shared_memory(region.name, 64, offset=8)
    raises_400(lambda: tc.infer("relu", [past]), "runs past region")
    raises_400(lambda: tc.infer("relu", [good()], outputs=[shm_output("OutputTensor", region, 32)]), "smaller than output")
    raises_400(lambda: tc.infer("relu", [good()], outputs=[shm_output("OutputTensor", region, 64, 8)]), "runs past region")
    both = {"inputs": [{"name": "InputTensor", "shape": [16], "datatype": "FP32", "data": [0] * 16,
                        "parameters": {"shared_memory_region": region.name, "shared_memory_byte_size": 64}}]}
    response = http.post("/v2/models/relu/infer", json=both)
    assert response.status_code == 400 and "exactly one of" in response.json()["error"]
    no_size = {"inputs": [{"name": "InputTensor", "shape": [16], "datatype": "FP32", "parameters": {"shared_memory_region": region.name}}]}
    response = http.post("/v2/models/relu/infer", json=no_size)
    assert response.status_code == 400 and "shared_memory_byte_size is required" in response.json()["error"]
    assert_still_serving(http)


def test_an_object_truncated_after_registration_is_refused_not_fatal(tc, http, regions):
    """Reading past the end of a shrunk object would be SIGBUS in the HTTP process."""
    x = np.ones(1024, np.float32)
    region = regions(x.nbytes).register(tc)
    tc.infer("relu", [shm_input("InputTensor", x, region)])  # mapped now
    os.truncate(f"/dev/shm{region.key}", 16)
    raises_400(lambda: tc.infer("relu", [shm_input("InputTensor", x, region)]), "runs past the end")
    assert_still_serving(http)


def _http_processes(server) -> list[int]:
    """uvicorn's worker processes: the children of the server process (each has its device worker)."""
    return spawned_children(server.process.pid)


def test_regions_are_shared_by_the_http_processes(two_processes):
    """With --workers 2 a registration made through one connection serves inferences on any other, and
    an unregistration through one is seen by all."""
    server = two_processes
    region = Region(64)
    try:
        x = np.arange(16, dtype=np.float32) - 8
        shm.set_shared_memory_region(region.handle, [x])
        assert len(_http_processes(server)) == 2
        with triton.InferenceServerClient(address(server)) as client:
            region.register(client)
        answered = 0
        for _ in range(400):  # a new connection each time: they spread over both processes
            with triton.InferenceServerClient(address(server)) as client:
                try:
                    y = client.infer("relu", [shm_input("InputTensor", x, region)]).as_numpy("OutputTensor")
                except InferenceServerException as exc:  # the server was ready when one process was
                    assert exc.status() == "503", exc
                    time.sleep(0.05)
                    continue
            np.testing.assert_array_equal(y, np.maximum(x, 0))
            answered += 1
            if answered == 20:
                break
        assert answered == 20
        with triton.InferenceServerClient(address(server)) as client:
            client.unregister_system_shared_memory(region.name)
        refused = 0
        for _ in range(400):
            with triton.InferenceServerClient(address(server)) as client, pytest.raises(InferenceServerException) as info:
                client.infer("relu", [shm_input("InputTensor", x, region)])
            if info.value.status() == "503":
                time.sleep(0.05)
                continue
            assert info.value.status() == "404" and "not a registered" in info.value.message(), info.value.message()
            refused += 1
            if refused == 20:
                break
        assert refused == 20
    finally:
        shm.destroy_shared_memory_region(region.handle)
