"""A real server for the service tests: ``python -m service`` on a free loopback port, lavapipe behind."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# make test-asan (scripts/test-asan.sh) preloads the ASan runtime into this process: it goes on to the
# service processes started here and to no other program (pgrep deadlocks under it, in textdomain).
ASAN_RUNTIME = os.environ.get("VKACT_ASAN_RUNTIME", "")
if ASAN_RUNTIME:
    os.environ.pop("LD_PRELOAD", None)


@dataclass
class Server:
    url: str
    process: subprocess.Popen
    grpc: str = ""  # host:port of its gRPC server ("" when started with grpc_port=0)

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(variables: dict[str, str]) -> dict[str, str]:
    """The environment of a service process: this one's, ``variables``, and under make test-asan the ASan runtime."""
    return {**os.environ, **variables, **({"LD_PRELOAD": ASAN_RUNTIME} if ASAN_RUNTIME else {})}


def start_server(wrap: tuple[str, ...] = (), supervised: bool = False, **settings: object) -> Server:
    """``wrap``: a command that execs the server's command line given as its arguments (unshare ...).
    Unsupervised by default: the process is then the HTTP server itself, which tests look into."""
    port = free_port()
    settings.setdefault("grpc_port", free_port())  # never the default 8001: servers of parallel runs would share it
    env = server_env({f"VKACT_{k.upper()}": str(v) for k, v in settings.items()})
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-m", "service", "--port", str(port), "--log-level", "warning", *([] if supervised else ["--no-supervise"])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # generous: a busy machine imports, probes Vulkan and loads shaders slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read().decode() if proc.stdout else ''}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return Server(url, proc, f"127.0.0.1:{settings['grpc_port']}" if settings["grpc_port"] else "")
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server not ready within 180 s")


def spawned_children(pid: int) -> list[int]:
    """The multiprocessing-spawned children of ``pid`` (device workers; uvicorn's worker processes). A child
    that ends between the listing and the read of its command line is not one (CI met that race)."""
    found = []
    for child in os.popen(f"pgrep -P {pid}").read().split():
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    found.append(int(child))
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def ended(pid: int) -> bool:
    """Whether process ``pid`` is gone or a zombie (killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    s = start_server(max_body_bytes=80 << 20)
    yield s
    # No request of the whole suite may have been answered with a 500.
    metrics = httpx.get(f"{s.url}/metrics").text
    stop_server(s)
    assert 'vkact_errors_total{code="500"}' not in metrics, metrics


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def two_processes() -> Iterator[Server]:
    """One server with two HTTP processes (VKACT_WORKERS=2, each with its device worker) for the tests that
    need them and change nothing a later one reads back (graph models loaded are unloaded, a batching
    load is undone, a shared memory region unregistered): two such processes start slowly."""
    s = start_server(workers=2, max_graph_models=2)
    yield s
    metrics = httpx.get(f"{s.url}/metrics").text
    stop_server(s)
    assert 'vkact_errors_total{code="500"}' not in metrics, metrics
    assert s.process.stdout is not None and b"gRPC cannot listen" not in s.process.stdout.read()


@pytest.fixture(scope="session")
def emulated_64bit_server() -> Iterator[Server]:
    """A server whose kernels use no 64-bit device feature (VKACT_NATIVE_64BIT=0): what a device without
    shaderFloat64/shaderInt64 serves, on any device."""
    s = start_server(native_64bit="false")
    yield s
    stop_server(s)
