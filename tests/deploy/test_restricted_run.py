"""The cpu image runs as deploy/kubernetes/vkact-cpu.yaml's restricted pod runs it: the image's root
read-only, tmpfs for the pod's emptyDirs (sized as the manifest sizes them), an arbitrary UID in group
0 (as OpenShift assigns), no supplementary groups, no capabilities, no_new_privs, the image's ENV with
the pod's env; then readiness and liveness, /v2 inference over HTTP and over gRPC (tritonclient).

No container runtime may run it here (`podman run` is refused), so this does what a runtime does with
the image: `podman image mount`, then tests/deploy/restricted_pod.sh in a mount and PID namespace of
its own (unshare), which mounts and starts the service through chroot and the image's setpriv. It
skips, saying why, without root, podman, the image (`make images`), or a kernel that lets it mount.
Not reproduced: the runtime's seccomp filter (setpriv here cannot load one) and a network namespace
(the service binds 127.0.0.1 on free ports instead of 0.0.0.0)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg

from tests.deploy.test_manifests import DEPLOY, documents
from tests.service.conftest import ended, free_port

IMAGE = os.environ.get("VKACT_IMAGE_CPU", "vkact:cpu")
GPU_IMAGE = os.environ.get("VKACT_IMAGE_GPU", "vkact:gpu")
SCRIPT = Path(__file__).with_name("restricted_pod.sh")
UID, GID = 1000670000, 0   # an OpenShift-style UID from a namespace's range, in group 0
START_TIMEOUT_S = 180      # a loaded 2-core machine: the image's first start compiles nothing, but imports plenty


def why_not(image: str) -> str | None:
    if os.geteuid() != 0:
        return "needs root (podman image mount, mount, chroot)"
    for tool in ("podman", "unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"no {tool} here (the image is mounted with podman: `make images` installs and uses it)"
    if subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode != 0:
        return f"no {image} image: build it with `make images`"
    return None


needs_cpu_image = pytest.mark.skipif(why_not(IMAGE) is not None, reason=why_not(IMAGE) or "")
needs_gpu_image = pytest.mark.skipif(why_not(GPU_IMAGE) is not None, reason=why_not(GPU_IMAGE) or "")


def manifest_container(flavour: str = "cpu") -> tuple[dict, dict]:
    """The Deployment's container, and its volumes by name."""
    doc = next(d for d in documents(DEPLOY / "kubernetes" / f"vkact-{flavour}.yaml") if d["kind"] == "Deployment")
    spec = doc["spec"]["template"]["spec"]
    return spec["containers"][0], {v["name"]: v for v in spec["volumes"]}


def tmpfs_size(quantity: str) -> str:
    """A Kubernetes quantity (512Mi, 1Gi) as tmpfs's size option."""
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity).groups()
    return number + unit[0].lower()


def process_tree(root: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue   # ended meanwhile
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += parents.get(pid, [])
    return tree


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


class Pod:
    """``image`` started as its Deployment's restricted pod (the manifest's env and emptyDir sizes, ``env``
    on top), until ``stop``."""

    def __init__(self, image: str, flavour: str, work: Path, **env: str) -> None:
        config = json.loads(subprocess.run(["podman", "image", "inspect", image], capture_output=True, text=True, check=True).stdout)[0]["Config"]
        self.image = image
        self.container, volumes = manifest_container(flavour)
        mounts = {m["mountPath"]: volumes[m["name"]]["emptyDir"] for m in self.container["volumeMounts"]}
        assert set(mounts) == {"/dev/shm", "/tmp"}, "restricted_pod.sh mounts these two: keep them in step with the manifest"
        http, grpc = free_port(), free_port()
        full_env = dict(e.split("=", 1) for e in config["Env"])
        full_env |= {e["name"]: e["value"] for e in self.container["env"]}
        # the runtime's HOME for a UID without a passwd entry; loopback and free ports (no network namespace)
        full_env |= {"HOME": "/", "VKACT_HOST": "127.0.0.1", "VKACT_PORT": str(http), "VKACT_GRPC_PORT": str(grpc)} | env
        rootfs = subprocess.run(["podman", "image", "mount", image], capture_output=True, text=True, check=True).stdout.strip()
        stage, self.log = work / "root", work / "log"
        stage.mkdir()
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--pid", "--fork", "--kill-child", str(SCRIPT), str(stage), rootfs, str(UID), str(GID),
                 tmpfs_size(mounts["/dev/shm"]["sizeLimit"]), tmpfs_size(mounts["/tmp"]["sizeLimit"]),
                 "--", "/usr/bin/env", "-C", config["WorkingDir"], *config["Cmd"]],
                env=full_env, stdout=out, stderr=subprocess.STDOUT)
        self.url, self.grpc = f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}"

    def wait_ready(self) -> int:
        """The service's PID (on the host) once its readiness probe answers 200."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert self.proc.poll() is None, f"the service exited ({self.proc.returncode}):\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"not ready within {START_TIMEOUT_S} s:\n{self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}{self.container['readinessProbe']['httpGet']['path']}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        [service] = process_tree(self.proc.pid)[1:2]   # unshare's child: the service, PID 1 of its namespace
        return service

    def stop(self) -> None:
        if self.proc.poll() is None:
            # unshare's --kill-child is a parent-death signal, which the kernel clears when the process drops its
            # privileges (setpriv, in restricted_pod.sh): killing unshare alone left the service running, PID 1
            # of its namespace. Killing that PID 1 ends every process of the namespace.
            for pid in process_tree(self.proc.pid)[1:2]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.kill()
            self.proc.wait(timeout=30)
        subprocess.run(["podman", "image", "unmount", self.image], capture_output=True)


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    started = Pod(IMAGE, "cpu", tmp_path_factory.mktemp("pod"))
    try:
        supervisor = started.wait_ready()
        yield {"url": started.url, "grpc": started.grpc, "proc": started.proc, "supervisor": supervisor, "log": started.log,
               "container": started.container}
    finally:
        started.stop()


@needs_cpu_image
def test_readiness_and_liveness_answer(pod):
    for probe in ("readinessProbe", "livenessProbe"):
        response = httpx.get(pod["url"] + pod["container"][probe]["httpGet"]["path"], timeout=10)
        assert response.status_code == 200, (probe, response.text)


@needs_cpu_image
def test_v2_inference_over_http(pod):
    x = np.random.default_rng(26).standard_normal(1000).astype(np.float32)
    body = {"inputs": [{"name": "InputTensor", "shape": [1000], "datatype": "FP32", "data": x.tolist()}],
            "parameters": {"Alpha": 0.5, "Beta": 0.25}}
    response = httpx.post(f"{pod['url']}/v2/models/hard_sigmoid/infer", json=body, timeout=60)
    assert response.status_code == 200, response.text
    out = np.asarray(response.json()["outputs"][0]["data"], np.float32)
    np.testing.assert_allclose(out, np.clip(0.5 * x.astype(np.float64) + 0.25, 0, 1), rtol=0, atol=1e-7)


@needs_cpu_image
def test_v2_inference_over_grpc(pod):
    client = tg.InferenceServerClient(pod["grpc"])
    try:
        assert client.is_server_live() and client.is_server_ready()
        x = np.linspace(-4, 4, 4096, dtype=np.float32).reshape(64, 64)
        inp = tg.InferInput("InputTensor", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        out = client.infer("relu", [inp]).as_numpy("OutputTensor")
        np.testing.assert_array_equal(out, np.maximum(x, 0))
    finally:
        client.close()


@needs_cpu_image
def test_every_process_runs_unprivileged(pod):
    tree = process_tree(pod["supervisor"])
    assert len(tree) >= 3, "the supervisor, the HTTP process and its device worker"
    for pid in tree:
        s = status(pid)
        assert s["Uid"].split() == [str(UID)] * 4 and s["Gid"].split() == [str(GID)] * 4, (pid, s["Uid"], s["Gid"])
        assert s["Groups"] == ""
        assert all(int(s[cap], 16) == 0 for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), pid
        assert s["NoNewPrivs"] == "1"


@needs_cpu_image
def test_the_root_is_read_only_and_writes_land_in_the_empty_dirs(pod):
    mounts = {f[4]: (f[5], f[f.index("-") + 1]) for f in (line.split() for line in Path(f"/proc/{pod['supervisor']}/mountinfo").read_text().splitlines())}
    assert mounts["/"][0].split(",")[0] == "ro"
    assert mounts["/dev/shm"] == ("rw,nosuid,nodev,relatime", "tmpfs") and mounts["/tmp"][1] == "tmpfs"
    root = Path(f"/proc/{pod['supervisor']}/root")
    assert any(p.name.startswith("vkact-") for p in (root / "dev/shm").iterdir()), "tensor slots and the registry"
    text = pod["log"].read_text()
    for trouble in ("Read-only file system", "Permission denied", "Traceback", "ERROR"):
        assert trouble not in text, text


@needs_cpu_image
def test_sigterm_stops_it_cleanly(pod):
    """Last: what the kubelet does when it stops the pod."""
    os.kill(pod["supervisor"], signal.SIGTERM)
    assert pod["proc"].wait(timeout=60) == 0, pod["log"].read_text()


@needs_gpu_image
def test_the_gpu_image_without_a_gpu_says_so_in_one_line_and_exits(tmp_path):
    """As its restricted pod on a node that gave it no GPU (here: none at all, lavapipe only)."""
    started = Pod(GPU_IMAGE, "gpu", tmp_path)
    try:
        assert started.proc.wait(timeout=START_TIMEOUT_S) == 2
        lines = started.log.read_text().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("vkact: no GPU Vulkan device"), lines
        assert "VKACT_REQUIRE_GPU=0" in lines[0] and "llvmpipe" in lines[0]
    finally:
        started.stop()


@needs_gpu_image
def test_the_gpu_image_told_to_fall_back_serves_from_lavapipe(tmp_path):
    started = Pod(GPU_IMAGE, "gpu", tmp_path, VKACT_REQUIRE_GPU="0")
    service = None
    try:
        service = started.wait_ready()
        x = np.linspace(-2, 2, 256, dtype=np.float32)
        body = {"inputs": [{"name": "InputTensor", "shape": [256], "datatype": "FP32", "data": x.tolist()}]}
        out = httpx.post(f"{started.url}/v2/models/relu/infer", json=body, timeout=60).json()["outputs"][0]["data"]
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.maximum(x, 0))
        assert "llvmpipe" in httpx.get(f"{started.url}/v1/device", timeout=10).text
    finally:
        started.stop()
    # stopped means gone: a service left running outlived every test run (it dropped unshare's --kill-child)
    deadline = time.monotonic() + 30   # a bound on waiting, not a latency
    while service is not None and not ended(service) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service is None or ended(service), f"the service ({service}) outlived its pod"
