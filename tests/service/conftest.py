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


@dataclass
class Server:
    url: str
    process: subprocess.Popen

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(wrap: tuple[str, ...] = (), supervised: bool = False, **settings: object) -> Server:
    """``wrap``: a command that execs the server's command line given as its arguments (unshare ...).
    Unsupervised by default: the process is then the HTTP server itself, which tests look into."""
    port = free_port()
    env = {**os.environ, **{f"VKACT_{k.upper()}": str(v) for k, v in settings.items()}}
    proc = subprocess.Popen(
        [*wrap, sys.executable, "-m", "service", "--port", str(port), "--log-level", "warning", *([] if supervised else ["--no-supervise"])],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stdout.read().decode() if proc.stdout else ''}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return Server(url, proc)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server not ready within 60 s")


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
