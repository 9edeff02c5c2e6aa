"""gRPC requests/s from h2load (nghttp2's C load generator, Debian's nghttp2-client), for both servers alike.

Eight Python gRPC client processes on the same 2 cores as the server spend CPU of their own on every
request (grpcio's channel, its completion-queue thread, protobuf), which the server then lacks: every
ratio is pressed toward 1. h2load sends one fixed HTTP/2 POST, a gRPC call as the wire carries it
(``content-type: application/grpc``, ``te: trailers``, the body a length-prefixed ModelInferRequest),
on ``-c`` connections with one stream each, for a fixed duration (no h2load warm-up: its DATA count
would include the warm-up's answers; the server is warm from the checks before).

h2load does not read gRPC's status trailers (an error is HTTP 200 too), so every run's answers are
checked by their bytes: a successful answer carries one DATA payload of a known length (the prefix and
the serialized ModelInferResponse, asked once from a grpcio stub and checked against numpy), an error
none; a run counts only when the DATA bytes are exactly ``done x`` that length."""
from __future__ import annotations

import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PATH = "/inference.GRPCInferenceService/ModelInfer"
HEADERS = ("content-type: application/grpc", "te: trailers")


class Unavailable(RuntimeError):
    """h2load is not installed (``apt-get install nghttp2-client``) or its answers are not all gRPC successes."""


def grpc_frame(message: bytes) -> bytes:
    """A gRPC message as the HTTP/2 body carries it: uncompressed flag, big-endian length, message."""
    return b"\0" + len(message).to_bytes(4, "big") + message


@dataclass(frozen=True)
class H2Run:
    requests: int          # answered, all checked successes
    seconds: float         # h2load's measured duration (after its warm-up)
    cpu_seconds: float     # h2load's own user + system CPU

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def client_cpu_us(self) -> float:
        return self.cpu_seconds / self.requests * 1e6


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(address: str, request: bytes, answer_bytes: int, clients: int, seconds: float) -> H2Run:
    """h2load against ``address`` (host:port) for ``seconds``: ``clients`` connections, one stream each,
    every one sending ``request`` (a serialized ModelInferRequest); ``answer_bytes``: the length of a
    successful answer's serialized ModelInferResponse."""
    h2load = shutil.which("h2load")
    if h2load is None:
        raise Unavailable("h2load not found (Debian package nghttp2-client; scripts/setup.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="vkact-h2load-") as tmp:
        body = Path(tmp) / "request.grpc"
        body.write_bytes(grpc_frame(request))
        argv = [h2load, "-c", str(clients), "-m", "1", "-D", f"{seconds:g}", "-d", str(body)]
        for header in HEADERS:
            argv += ["-H", header]
        cpu = _children_cpu()
        done = subprocess.run(argv + [f"http://{address}{PATH}"], capture_output=True, text=True, timeout=seconds + 60)
        cpu = _children_cpu() - cpu
    out = done.stdout
    finished = re.search(r"finished in ([\d.]+)(m?s)", out)
    counts = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
    traffic = re.search(r"traffic: .*\((\d+)\) data", out)
    if done.returncode != 0 or not (finished and counts and traffic):
        raise Unavailable(f"h2load failed ({done.returncode}): {(done.stderr or out)[-400:]}")
    answered, succeeded, failed, errored = (int(v) for v in counts.groups())
    data = int(traffic.group(1))
    expected = answered * (5 + answer_bytes)
    if answered == 0 or succeeded != answered or failed or errored or data != expected:
        raise Unavailable(f"not every answer was a gRPC success: {answered} done, {succeeded} HTTP 2xx, "
                          f"{data} DATA bytes against {expected} for that many successes")
    elapsed = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    return H2Run(answered, elapsed, cpu)
