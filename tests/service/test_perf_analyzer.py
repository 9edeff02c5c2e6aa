"""Triton's own perf_analyzer (PyPI's wheel, through scripts/perf-analyzer.sh: on Debian 12 it runs on
Debian 13's libc, fetched into a cache, never installed) against the service, in the modes Triton users
run: gRPC, gRPC streaming, HTTP, and each with system shared memory. A short measurement of a fixed
request count, two requests in flight, batch 2 (the model's config says it batches); each run must exit 0
and account for every request, checked against the server's own statistics read apart from perf_analyzer;
a run whose requests fail stops with the service's message.

Skipped, saying why, where perf_analyzer is not prepared and cannot be (no network for the download)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from tests.service.conftest import ROOT, Server
from tests.service.test_v2_errors import assert_still_serving

SCRIPT = os.path.join(ROOT, "scripts", "perf-analyzer.sh")
MODEL = "shrink"
REQUESTS = 24
BATCH = 2
ELEMENTS = 256


@pytest.fixture(scope="module")
def perf_analyzer() -> list[str]:
    """The command that runs perf_analyzer, prepared (downloaded once into the cache) if it is not yet."""
    try:  # within pytest's timeout of 300 s a test (pyproject.toml); it takes about 10 s with a network
        done = subprocess.run(["bash", SCRIPT, "--prepare"], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.skip("preparing perf_analyzer (scripts/perf-analyzer.sh --prepare) took over 240 s")
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"perf_analyzer is not prepared and cannot be (scripts/perf-analyzer.sh --prepare): {reason}")
    return ["bash", SCRIPT]


def successes(http: httpx.Client) -> tuple[int, int]:
    """The model's successful and failed requests as the server counts them."""
    stats = http.get(f"/v2/models/{MODEL}/stats").json()["model_stats"][0]["inference_stats"]
    return stats["success"]["count"], stats["fail"]["count"]


def reported(output: str, section: str, line: str) -> int:
    """A count perf_analyzer printed in its ``Client:`` or ``Server:`` section."""
    found = re.search(rf"{section}:\s*\n(?:.*\n)*?\s*{line}: (\d+)", output)
    assert found, f"no '{line}' under '{section}' in:\n{output}"
    return int(found.group(1))


@contextlib.contextmanager
def shared_memory_names(args: list[str]) -> Iterator[None]:
    """perf_analyzer names its shared memory objects after the tensors (/InputTensor_0_0, /OutputTensor),
    with no prefix: two runs on one machine at once (parallel test runs) would share them, and one's
    unlink could come between the other's creation and registration. Such runs take turns."""
    if "--shared-memory" not in args:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "vkact-perf-analyzer-shm.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


MODES = {
    "grpc": ["-i", "grpc"],
    "grpc-streaming": ["-i", "grpc", "--streaming"],
    "http": ["-i", "http"],
    "grpc-shm": ["-i", "grpc", "--shared-memory", "system"],
    "grpc-streaming-shm": ["-i", "grpc", "--streaming", "--shared-memory", "system"],
    "http-shm": ["-i", "http", "--shared-memory", "system"],
}


@pytest.mark.parametrize("mode", MODES)
def test_perf_analyzer_measures(mode: str, perf_analyzer: list[str], server: Server, http: httpx.Client) -> None:
    args = MODES[mode]
    url = server.grpc if "grpc" in args else server.url.removeprefix("http://")
    if "--shared-memory" in args:  # the output regions need a size: the model's outputs are variable
        args = [*args, "--output-shared-memory-size", str(BATCH * ELEMENTS * 4)]
    before = successes(http)
    with shared_memory_names(args):
        done = subprocess.run(
            [*perf_analyzer, "-m", MODEL, "-u", url, *args, "--shape", f"InputTensor:{ELEMENTS}", "-b", str(BATCH),
             "--concurrency-range", "2", "--request-count", str(REQUESTS)],
            capture_output=True, text=True, timeout=180,  # perf_analyzer --streaming once hung: fail, not wait
        )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    sent = reported(output, "Client", "Request count")
    assert sent == REQUESTS, output
    assert reported(output, "Server", "Successful request count") == sent, output
    succeeded, failed = successes(http)
    assert (succeeded - before[0], failed - before[1]) == (sent, 0), output


@pytest.mark.parametrize("mode", ["grpc-streaming-shm", "http-shm"])
def test_perf_analyzer_stops_on_the_services_error(mode: str, perf_analyzer: list[str], server: Server, http: httpx.Client) -> None:
    """Output regions too small for the answers: perf_analyzer stops at once with the service's own message
    (over a stream too, where it once waited for answers that never came), and the service goes on."""
    args = MODES[mode]
    url = server.grpc if "grpc" in args else server.url.removeprefix("http://")
    with shared_memory_names(args):
        done = subprocess.run(
            [*perf_analyzer, "-m", MODEL, "-u", url, *args, "--output-shared-memory-size", "16",
             "--shape", f"InputTensor:{ELEMENTS}", "--request-count", str(REQUESTS)],
            capture_output=True, text=True, timeout=180,
        )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert f"shared_memory_byte_size 16 is smaller than output 'OutputTensor' ({ELEMENTS * 4} bytes)" in output, output
    assert_still_serving(http)
