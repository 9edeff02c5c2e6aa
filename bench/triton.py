"""vkact beside Triton Inference Server 2.51 (``python -m bench --only triton``): both up at once on this
machine, every measurement in alternated rounds, every answer checked against numpy before it is timed.

Triton serves SHRINK as a Triton user serves a custom operator (bench/triton_server.py: a Python-backend
model in numpy, FLOAT32, Bias 0.5, Threshold 0.5); vkact serves its ``shrink`` model, sent the same Bias
and Threshold as request parameters. Both get the very same request bytes.

- **HTTP requests/s**: wrk (bench/wrk.py), 1 thread, 8 connections, ``POST /v2/models/shrink/infer``
  with tritonclient's own request body for 1,024 FLOAT32 elements, binary tensor data and JSON;
  every answer compared with the checked one.
- **gRPC requests/s**: h2load (bench/h2load_grpc.py), 8 connections of one stream, the
  ModelInferRequest tritonclient.grpc sends (raw contents); every answer checked by its bytes.
- **sequential latency**: one request at a time through tritonclient.http (binary) and tritonclient.grpc
  (``infer`` plus ``as_numpy``); vkact's ``/v1/execute`` and the bare echo (bench/echo.py, sent /v1's
  bytes) alongside, for /v1's target.
- **16 MiB** (2^22 FLOAT32 in and out): tritonclient.http with binary data, the same request from a raw
  socket (a client that is not the wall: tritonclient spends ~45 ms of CPU decoding each answer), and with system shared memory
  (tritonclient's shm utilities: a region per server, registered, the input written once, the output
  read back into numpy in every timed request); and tritonclient.http against bench.canned, a server that
  replays vkact's checked answer from memory: the client's own ceiling, which no server passes.
"""
from __future__ import annotations

import math
import os
import resource
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import h2load_grpc as h2
from . import service as svc
from . import triton_server as ts
from . import wrk
from .timing import Samples, rounds

MODEL = ts.MODEL
SMALL, LARGE = svc.SMALL, svc.LARGE
PARAMETERS = {"Bias": ts.BIAS, "Threshold": ts.THRESHOLD}
CONNECTIONS = 8
LOAD_ROUNDS, LOAD_SECONDS = int(os.environ.get("VKACT_BENCH_TRITON_ROUNDS", 6)), float(os.environ.get("VKACT_BENCH_TRITON_SECONDS", 4))       # wrk and h2load: per target and round, the targets alternated
LARGE_WARMUP, LARGE_REPEAT = 1, 6        # 16 MiB requests per target, alternated
SERVERS = ("vkact", "triton")

# The targets (vkact over Triton, or its bound)
TARGET_RATE = 1.5          # HTTP binary and gRPC requests/s: at least this
TARGET_LARGE = 3.0         # 16 MiB over HTTP, MB/s: at least this
TARGET_V1_ECHO = 1.2       # /v1 p50 over the bare echo's: at most this


def reference(x: np.ndarray) -> np.ndarray:
    """SHRINK with Bias 0.5 and Threshold 0.5, in float32 (numpy: the oracle for both servers)."""
    b, t = np.float32(ts.BIAS), np.float32(ts.THRESHOLD)
    return np.where(x < -t, x + b, np.where(x > t, x - b, np.float32(0))).astype(np.float32)


# -- clients ------------------------------------------------------------------------------------------


class HttpCaller:
    """tritonclient.http, one connection; ``binary``: binary tensor data for the input and the output;
    ``shm``: both in a system shared memory region of this caller's, registered with the server."""

    def __init__(self, url: str, x: np.ndarray, binary: bool = True, shm: bool = False) -> None:
        import tritonclient.http as th

        self.x, self._region = x, None
        self.faults: list[int] = []  # this process's minor page faults in each call (the client's own state)
        self.client = th.InferenceServerClient(url.removeprefix("http://"), connection_timeout=60, network_timeout=600)
        inp = th.InferInput("InputTensor", list(x.shape), "FP32")
        out = th.InferRequestedOutput("OutputTensor", binary_data=binary)
        if shm:
            import tritonclient.utils.shared_memory as shmu

            self._shm, self.name = shmu, f"bench_{uuid.uuid4().hex[:12]}"
            self._region = shmu.create_shared_memory_region(self.name, f"/{self.name}", 2 * x.nbytes)
            shmu.set_shared_memory_region(self._region, [x])
            self.client.register_system_shared_memory(self.name, f"/{self.name}", 2 * x.nbytes)
            inp.set_shared_memory(self.name, x.nbytes)
            out.set_shared_memory(self.name, x.nbytes, offset=x.nbytes)
        else:
            inp.set_data_from_numpy(x, binary_data=binary)
        self._inputs, self._outputs = [inp], [out]

    def __call__(self) -> np.ndarray:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        result = self.client.infer(MODEL, self._inputs, outputs=self._outputs, parameters=PARAMETERS)
        if self._region is not None:
            answer = self._shm.get_contents_as_numpy(self._region, np.float32, list(self.x.shape), offset=self.x.nbytes)
        else:
            answer = result.as_numpy("OutputTensor")
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return answer

    def request(self) -> tuple[bytes, dict[str, str]]:
        """The body and headers tritonclient sends (what wrk is given)."""
        import tritonclient.http as th

        body, header_length = th.InferenceServerClient.generate_request_body(self._inputs, self._outputs, parameters=PARAMETERS)
        headers = {"Content-Type": "application/octet-stream"}
        if header_length is not None:
            headers["Inference-Header-Content-Length"] = str(header_length)
        return bytes(body), headers

    def check(self) -> None:
        np.testing.assert_array_equal(self(), reference(self.x), err_msg="wrong SHRINK output")

    def close(self) -> None:
        if self._region is not None:
            self.client.unregister_system_shared_memory(self.name)
            self._shm.destroy_shared_memory_region(self._region)
        self.client.close()


class RawHttpCaller:
    """The request tritonclient.http sends (HttpCaller.request), over a plain socket, the answer read into
    one buffer: a client that costs little CPU per byte, so the servers' own speed shows, where
    tritonclient's decoding is the wall for 16 MiB."""

    def __init__(self, url: str, x: np.ndarray) -> None:
        import socket

        self.x = x
        host, port = url.removeprefix("http://").rsplit(":", 1)
        caller = HttpCaller(url, x)
        body, headers = caller.request()
        caller.close()
        self._head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
                      + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode()
        self._body = body
        self._sock = socket.create_connection((host, int(port)), timeout=600)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray(len(body) + (1 << 16))

    def __call__(self) -> np.ndarray:
        self._sock.sendall(self._head)
        self._sock.sendall(self._body)
        view, n = memoryview(self._buffer), 0
        while (end := self._buffer.find(b"\r\n\r\n", 0, n)) < 0:
            got = self._sock.recv_into(view[n:])
            if not got:
                raise ConnectionError("the server closed the connection")
            n += got
        lines = bytes(self._buffer[:end]).decode("latin-1").lower().split("\r\n")
        if not lines[0].startswith("http/1.1 200"):
            raise RuntimeError(f"answered {lines[0]!r}")
        fields = dict(line.split(": ", 1) for line in lines[1:])
        total = end + 4 + int(fields["content-length"])
        if total > len(self._buffer):
            raise RuntimeError(f"a {total}-byte answer")
        while n < total:
            got = self._sock.recv_into(view[n:total])
            if not got:
                raise ConnectionError("the server closed the connection")
            n += got
        return np.frombuffer(self._buffer, np.float32, self.x.size, end + 4 + int(fields["inference-header-content-length"]))

    def check(self) -> None:
        np.testing.assert_array_equal(self(), reference(self.x), err_msg="wrong SHRINK output")

    def close(self) -> None:
        self._sock.close()


class GrpcCaller:
    """tritonclient.grpc, one channel, raw contents in and out."""

    def __init__(self, address: str, x: np.ndarray) -> None:
        import tritonclient.grpc as tg

        self.x, self.address = x, address
        self.client = tg.InferenceServerClient(address)
        inp = tg.InferInput("InputTensor", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        self._inputs, self._outputs = [inp], [tg.InferRequestedOutput("OutputTensor")]

    def __call__(self) -> np.ndarray:
        return self.client.infer(MODEL, self._inputs, outputs=self._outputs, parameters=PARAMETERS).as_numpy("OutputTensor")

    def wire(self) -> tuple[bytes, bytes]:
        """The serialized ModelInferRequest tritonclient sends and the server's serialized answer, checked."""
        import grpc
        from tritonclient.grpc import service_pb2

        request = service_pb2.ModelInferRequest(model_name=MODEL)
        request.inputs.add(name="InputTensor", datatype="FP32", shape=list(self.x.shape))
        request.outputs.add(name="OutputTensor")
        for key, value in PARAMETERS.items():
            request.parameters[key].double_param = value
        request.raw_input_contents.append(self.x.tobytes())
        raw = request.SerializeToString()
        with grpc.insecure_channel(self.address) as channel:
            answer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(raw)
        out = service_pb2.ModelInferResponse.FromString(answer).raw_output_contents[0]
        np.testing.assert_array_equal(np.frombuffer(out, np.float32), reference(self.x), err_msg="wrong SHRINK output")
        return raw, answer

    def check(self) -> None:
        np.testing.assert_array_equal(self(), reference(self.x), err_msg="wrong SHRINK output")

    def close(self) -> None:
        self.client.close()


def answer_of(url: str, body: bytes, headers: dict[str, str], x: np.ndarray) -> bytes:
    """The server's answer to this exact request, checked against numpy (tritonclient's own parser)."""
    return _checked_answer(url, body, headers, x).content


def canned_response(url: str, x: np.ndarray) -> bytes:
    """The whole HTTP response (head and body) the server at ``url`` gives tritonclient.http's binary request
    for ``x``, checked: what bench.canned replays."""
    caller = HttpCaller(url, x)
    try:
        body, headers = caller.request()
    finally:
        caller.close()
    answer = _checked_answer(url, body, headers, x)
    head = "".join(f"{k}: {answer.headers[k]}\r\n" for k in ("Content-Type", "Inference-Header-Content-Length") if k in answer.headers)
    return f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(answer.content)}\r\n\r\n".encode() + answer.content


def _checked_answer(url: str, body: bytes, headers: dict[str, str], x: np.ndarray) -> Any:
    import httpx
    import tritonclient.http as th

    response = httpx.post(f"{url}/v2/models/{MODEL}/infer", content=body, headers={**headers, "Accept-Encoding": "identity"}, timeout=60)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
    length = response.headers.get("Inference-Header-Content-Length")
    result = th.InferenceServerClient.parse_response_body(response.content, header_length=None if length is None else int(length))
    np.testing.assert_array_equal(result.as_numpy("OutputTensor"), reference(x), err_msg=f"{url}: wrong SHRINK output")
    return response


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class Load:
    """Summed wrk or h2load runs of one target."""
    requests: int = 0
    seconds: float = 0.0
    rounds: list[float] = field(default_factory=list)   # requests/s, per round
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by role ("server", "worker") over the rounds
    p50: list[float] = field(default_factory=list)   # wrk's, per round
    p99: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    def cpu_us(self, role: str) -> float | None:
        """CPU per request of one of the server's processes under this load."""
        value = self.cpu.get(role)
        return None if value is None or math.isnan(value) else value / self.requests * 1e6


@dataclass
class TritonResult:
    device: dict[str, Any]
    env: ts.TritonEnv | None
    reason: str | None                      # why Triton is missing, when it is
    load: dict[str, Load]                   # "vkact http binary", "triton grpc", ...
    load_reason: dict[str, str]             # per kind ("http binary", "grpc", ...), why it has no figures
    latency: dict[str, Samples]
    cpu: dict[str, svc.Cpu]
    large: dict[str, Samples]
    # tritonclient.http's 16 MiB targets: the client process's minor page faults per request (median of the
    # timed ones): about 12,300 where its three 16 MiB buffers are mapped fresh each request, near 0 where its
    # heap keeps them; which one a run gets is glibc's doing, and it moves the client's own time by 15-25 ms
    client_faults: dict[str, float]
    tensor_bytes: int
    # vkact's own device time per 16 MiB request over those rounds (the statistics extension's compute_infer:
    # the kernel's dispatch and wait), None where its statistics did not answer
    large_device_s: float | None
    loadavg: tuple[float, float]
    seconds: float

    def ratio(self, kind: str) -> float | None:
        """vkact's requests/s over Triton's for one kind of load: the median of the rounds' ratios (each
        round's two runs side by side; on a shared machine the load drifts between rounds)."""
        v, t = self.load.get(f"vkact {kind}"), self.load.get(f"triton {kind}")
        return None if v is None or t is None else statistics.median(a / b for a, b in zip(v.rounds, t.rounds))

    def p50_ratio(self, kind: str) -> float | None:
        """vkact's sequential p50 over Triton's (below 1: vkact answers sooner)."""
        v, t = self.latency.get(f"vkact {kind}"), self.latency.get(f"triton {kind}")
        return None if v is None or t is None else v.median / t.median

    def large_ratio(self, kind: str, server: str = "vkact") -> float | None:
        """vkact's (or the ceiling's) 16 MiB MB/s over Triton's: the median of the rounds' ratios (adjacent requests)."""
        v, t = self.large.get(f"{server} {kind}"), self.large.get(f"triton {kind}")
        return None if v is None or t is None else statistics.median(b / a for a, b in zip(v.seconds, t.seconds))

    @property
    def v1_echo(self) -> float:
        return self.latency["vkact v1"].median / self.latency["echo v1"].median


def _stub_pid(server_pid: int) -> int | None:
    """Triton's Python-backend stub: the child process of tritonserver that runs the model."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == server_pid \
                    and b"triton_python_backend_stub" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


@contextmanager
def _maybe_triton(log: Callable[[str], None]) -> Iterator[tuple[svc.Server | None, ts.TritonEnv | None, str | None]]:
    """Triton started, or None and why not (only its start is guarded: an error while measuring propagates)."""
    with ExitStack() as stack:
        try:
            env = ts.environment(log)
            server = stack.enter_context(ts.server(env))
        except (ts.Unavailable, OSError) as exc:
            log(f"triton: not available: {exc}")
            stack.close()
            yield None, None, str(exc)
            return
        yield server, env, None


def _load_rounds(plans: dict[str, Callable[[], Any]], pids: dict[str, dict[str, int | None]], log: Callable[[str], None]
                 ) -> tuple[dict[str, Load], str | None]:
    """LOAD_ROUNDS rounds, each target once per round in turn; ``plans``: target -> one timed run;
    ``pids``: target -> its processes by role, whose CPU time during the runs is added up."""
    out: dict[str, Load] = {}
    try:
        for r in range(LOAD_ROUNDS):
            order = list(plans.items())
            for key, run in order[::-1] if r % 2 else order:   # ABBA: neither target always goes first
                before = {role: svc.cpu_seconds(pid) if pid else math.nan for role, pid in pids[key].items()}
                done = run()
                load = out.setdefault(key, Load())
                for role, pid in pids[key].items():
                    load.cpu[role] = load.cpu.get(role, 0.0) + (svc.cpu_seconds(pid) if pid else math.nan) - before[role]
                load.requests += done.requests
                load.seconds += done.seconds
                load.rounds.append(done.per_second)
                if isinstance(done, wrk.WrkRun):
                    load.p50.append(done.p50_s)
                    load.p99.append(done.p99_s)
            log(f"triton:   round {r + 1}: " + ", ".join(f"{k} {v.rounds[-1]:.0f}/s" for k, v in out.items()))
    except (wrk.Failed, h2.Unavailable) as exc:
        return {}, str(exc)
    return out, None


def measure(vkact: svc.Server, echo: svc.Server, triton: svc.Server | None, log: Callable[[str], None] = print
            ) -> tuple[dict[str, Load], dict[str, str], dict[str, Samples], dict[str, svc.Cpu], dict[str, Samples], dict[str, float], float | None]:
    """Every measurement on the servers given (Triton's rows missing without it)."""
    from . import tools

    rng = np.random.default_rng(2025)
    small_x, large_x = rng.standard_normal(SMALL, dtype=np.float32), rng.standard_normal(LARGE, dtype=np.float32)
    servers = {"vkact": vkact} | ({"triton": triton} if triton else {})

    pids: dict[str, dict[str, int | None]] = {
        "vkact": {"server": vkact.process.pid, "worker": svc.device_worker(vkact.process.pid)}}
    if triton:
        pids["triton"] = {"server": triton.process.pid, "worker": _stub_pid(triton.process.pid)}
    reasons: dict[str, str] = {}
    plans: dict[str, dict[str, Callable[[], Any]]] = {}
    try:
        tools.ensure("wrk")
    except tools.Missing as exc:
        reasons["http"] = str(exc)
    for encoding, binary in (("binary", True), ("json", False)):
        kind = f"http {encoding}"
        if "http" in reasons:
            break
        plan = plans.setdefault(kind, {})
        for name, server in servers.items():
            call = HttpCaller(server.url, small_x, binary)
            try:
                body, headers = call.request()
                call.check()
            finally:
                call.close()
            answer = answer_of(server.url, body, headers, small_x)
            url = f"{server.url}/v2/models/{MODEL}/infer"
            plan[f"{name} {kind}"] = lambda url=url, body=body, headers=headers, answer=answer: wrk.run(
                url, body, headers, answer, CONNECTIONS, LOAD_SECONDS)
    grpc_plan: dict[str, Callable[[], Any]] = {}
    for name, server in servers.items():
        raw, answer = GrpcCaller(server.grpc, small_x).wire()
        grpc_plan[f"{name} grpc"] = lambda address=server.grpc, raw=raw, n=len(answer): h2.run(address, raw, n, CONNECTIONS, LOAD_SECONDS)
    plans["grpc"] = grpc_plan

    load: dict[str, Load] = {}
    for kind, plan in plans.items():
        log(f"triton: {kind}, {CONNECTIONS} connections, {LOAD_ROUNDS} rounds of {LOAD_SECONDS:g} s per target")
        got, why = _load_rounds(plan, {key: pids[key.split()[0]] for key in plan}, log)
        load |= got
        if why:
            reasons[kind] = why

    log(f"triton: sequential latency, {SMALL} elements")
    callers: dict[str, Any] = {}
    v1 = svc.payload(vkact.url, small_x, "binary")
    with svc._http(vkact.url) as vk_http, svc._http(echo.url) as echo_http:
        svc.check(svc.post(vk_http, v1), v1, False)
        svc.check(svc.post(echo_http, v1), v1, True)
        try:
            for name, server in servers.items():
                callers[f"{name} http"] = HttpCaller(server.url, small_x)
                callers[f"{name} grpc"] = GrpcCaller(server.grpc, small_x)
            for call in callers.values():
                call.check()
            tasks = {key: (call, pids[key.split()[0]]) for key, call in callers.items()}
            tasks["vkact v1"] = (lambda: svc.post(vk_http, v1), pids["vkact"])
            tasks["echo v1"] = (lambda: svc.post(echo_http, v1), {"server": echo.process.pid})
            latency, cpu = svc._latency(tasks)
        finally:
            for call in callers.values():
                call.close()

    log(f"triton: 16 MiB ({LARGE} elements), binary and system shared memory, {LARGE_REPEAT} alternated rounds")
    large_callers: dict[str, HttpCaller | RawHttpCaller] = {}
    with _canned(vkact.url, large_x) as canned:
        try:
            for name, server in servers.items():
                large_callers[f"{name} binary"] = HttpCaller(server.url, large_x)
                large_callers[f"{name} raw"] = RawHttpCaller(server.url, large_x)
                large_callers[f"{name} shm"] = HttpCaller(server.url, large_x, shm=True)
                if name == "vkact":  # between the servers, not in the wake of Triton's last request
                    large_callers["ceiling binary"] = HttpCaller(canned.url, large_x)
            for call in large_callers.values():
                call.check()
            device_before = _compute_infer(vkact.url)
            large = rounds(list(large_callers.items()), LARGE_WARMUP, LARGE_REPEAT)
            device_after = _compute_infer(vkact.url)
            large_device_s = None if device_before is None or device_after is None or device_after[0] <= device_before[0] \
                else (device_after[1] - device_before[1]) / (device_after[0] - device_before[0]) * 1e-9
            faults = {key: statistics.median(call.faults[-LARGE_REPEAT:]) for key, call in large_callers.items()
                      if key.endswith("binary") and isinstance(call, HttpCaller)}
        finally:
            for call in large_callers.values():
                call.close()
    return load, reasons, latency, cpu, large, faults, large_device_s


def _compute_infer(url: str) -> tuple[int, int] | None:
    """vkact's compute_infer (count, nanoseconds) for the bench's model, from the statistics extension."""
    import httpx

    try:
        stats = httpx.get(f"{url}/v2/models/{MODEL}/stats", timeout=30).json()
        spent = stats["model_stats"][0]["inference_stats"]["compute_infer"]
        return int(spent["count"]), int(spent["ns"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


@contextmanager
def _canned(url: str, x: np.ndarray) -> Iterator[svc.Server]:
    """bench.canned replaying the answer of the server at ``url`` to the 16 MiB request: tritonclient's ceiling."""
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="vkact-bench-canned-", suffix=".http") as answer:
        answer.write(canned_response(url, x))
        answer.flush()
        server = svc._launch("canned", "bench.canned", "--answer", answer.name)
        try:
            svc._wait_ready(server, "/")
            yield server
        finally:
            svc._stop(server)


def run(log: Callable[[str], None] = print) -> TritonResult:
    import httpx

    started, loadavg = time.perf_counter(), os.getloadavg()[0]
    with svc.servers() as (vkact, echo), _maybe_triton(log) as (triton, env, reason):
        device = httpx.get(vkact.url + "/v1/device", timeout=30).json()
        log(f"triton: vkact at {vkact.url} (gRPC {vkact.grpc})"
            + (f", Triton {env.version} at {triton.url} (gRPC {triton.grpc})" if triton and env else ""))
        load, reasons, latency, cpu, large, faults, large_device_s = measure(vkact, echo, triton, log)
    return TritonResult(device, env, reason, load, reasons, latency, cpu, large, faults, 2 * LARGE * 4, large_device_s,
                        (loadavg, os.getloadavg()[0]), time.perf_counter() - started)
