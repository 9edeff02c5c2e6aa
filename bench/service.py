"""The service end to end: vkact's ``POST /v1/execute`` over loopback HTTP, next to two ceilings
measured in the same run.

- **bare echo**: ``bench.echo``, a raw ASGI callable that returns the request's body, under uvicorn
  with the service's own settings (httptools, uvloop, one process): the HTTP stack and nothing else.
- **raw socket**: the same bytes sent over a TCP connection on 127.0.0.1 to another process, which
  reads them all (``recv_into``) and sends them back (``sendall``): no HTTP at all.

Every HTTP target is driven by the same client, ``httpx.Client`` with one keep-alive connection per
client, sending the same bytes: the bodies that ``client.Client`` builds (its request builder,
``_BaseClient._build_execute``), for SHRINK with DirectML's default parameters on FLOAT32 data. The echo
is sent vkact's binary frames byte for byte. ``client.Client`` itself is timed as well (its own encoding
and decoding included), to show what the library adds.

Measurements:

- latency: 1,024 elements, one request at a time; the targets alternate in blocks so that drift on
  a shared machine lands on all of them alike;
- requests per second: 8 client *processes* (8 threads of one process would be bound by its GIL and
  measure the client), each with its own connection, started together behind a barrier;
- throughput: 16 MiB of FLOAT32 (2^22 elements) in and out; the echo and vkact's binary frames are
  timed alternately, the other encodings and the client in blocks;
- liveness under load: ``GET /health/live`` while idle, during a 64 MiB request and during gzip bombs
  (``bench.liveness``).

Servers, clients and vkact's device worker share this machine's CPUs; on a small machine they compete
for them, and the numbers say as much about that as about the service.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from client import Client
from client.codec import HEADER_LENGTH

from . import liveness
from .timing import Samples, blocks, rounds

ROOT = Path(__file__).resolve().parent.parent
OPERATOR = "shrink"            # DirectML's defaults: Bias 0, Threshold 0.5
SMALL = 1 << 10                # elements of a latency / requests-per-second request
LARGE = 1 << 22                # elements of a throughput request: 16 MiB of FLOAT32

WARMUP_REQUESTS = 50           # per target and per client, before any timed request
LATENCY_BLOCKS, LATENCY_BLOCK = 10, 200        # 2,000 sequential requests per target
CLIENTS, CONCURRENT_ROUNDS, CONCURRENT_EACH = 8, 2, 250   # 2 x 8 x 250 = 4,000 requests per target
LARGE_WARMUP = 1
LARGE_REPEAT = {"binary": 10, "base64": 5, "json": 3}     # timed 16 MiB requests per encoding
READY_TIMEOUT_S = 120
BARRIER_TIMEOUT_S = 120       # a load client waits at most this long for the others


# -- servers ---------------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen
    log: Path
    grpc: str = ""  # host:port of its gRPC server, when it has one


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(name: str, module: str, *args: str, root: Path = ROOT, python: str = sys.executable,
            env: dict[str, str] | None = None) -> Server:
    """``python -m module --port P [args]`` in ``root`` (this checkout, or another one: bench.ab_latency) on a
    free loopback port (as tests/service/conftest.py does), ``env`` added to the environment; its output goes
    to a log file that is shown if it fails."""
    port, grpc_port = free_port(), free_port()  # gRPC: vkact's own port (bench.echo has none), not the default 8001
    fd, log = tempfile.mkstemp(prefix=f"vkact-bench-{name}-", suffix=".log")
    with os.fdopen(fd, "wb") as out:
        # vkact unsupervised: its process is then the HTTP server, whose CPU time the benchmark reads
        extra = (["--no-supervise"] if module == "service" else []) + list(args)
        proc = subprocess.Popen([python, "-m", module, "--port", str(port), "--log-level", "warning", *extra],
                                cwd=root, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {}), "VKACT_GRPC_PORT": str(grpc_port)})
    return Server(name, f"http://127.0.0.1:{port}", proc, Path(log), f"127.0.0.1:{grpc_port}" if module == "service" else "")


def _wait_ready(server: Server, path: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} server exited ({server.process.returncode}):\n{server.log.read_text()}")
        try:
            if httpx.get(server.url + path, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{server.name} server not ready within {READY_TIMEOUT_S} s:\n{server.log.read_text()}")


def _stop(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
    server.log.unlink(missing_ok=True)


@contextmanager
def servers() -> Iterator[tuple[Server, Server]]:
    """vkact (``python -m service``: its own defaults and VKACT_* environment) and the bare echo,
    started side by side; both are stopped on the way out."""
    started: list[Server] = []
    try:
        started.append(_launch("vkact", "service"))
        started.append(_launch("echo", "bench.echo"))
        vkact, echo = started
        _wait_ready(echo, "/")
        _wait_ready(vkact, "/health/ready")
        yield vkact, echo
    finally:
        for server in started:
            _stop(server)


# -- requests --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payload:
    """One request body as ``client.Client`` builds it, and what checking its answer needs."""

    encoding: str
    body: bytes
    headers: dict[str, str]
    x: np.ndarray | None = field(default=None, repr=False)   # the input tensor
    call: Any = field(default=None, repr=False)  # client._client._Call: decodes a response as the client does


def payload(url: str, x: np.ndarray, encoding: str) -> Payload:
    with Client(url, encoding=encoding) as c:
        call = c._build_execute(OPERATOR, [x], None, False, None, None, None)
    wanted = {"content-type", HEADER_LENGTH.lower()}
    headers = {k: v for k, v in call.request.headers.items() if k.lower() in wanted}
    return Payload(encoding, call.request.content, headers, x, call)


def reference(x: np.ndarray) -> np.ndarray:
    """SHRINK with Bias 0 and Threshold 0.5."""
    return np.where(np.abs(x) > np.float32(0.5), x, np.float32(0))


def post(http: httpx.Client, p: Payload) -> httpx.Response:
    response = http.post("/v1/execute", content=p.body, headers=p.headers)
    if response.status_code != 200:
        raise RuntimeError(f"{http.base_url}: {response.status_code} {response.text[:500]}")
    return response


def check(response: httpx.Response, p: Payload, echo: bool) -> None:
    """vkact's answer against numpy, the echo's against the body sent: once per target, after its
    warm-up, so that no timed run is of a broken path."""
    if echo:
        if response.content != p.body:
            raise RuntimeError("the echo server did not return the request's body")
        return
    assert p.x is not None
    got = Client._read_execute(response, p.call)
    np.testing.assert_array_equal(got, reference(p.x), err_msg=f"vkact {p.encoding}: wrong SHRINK output")


def _http(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120)


# -- raw loopback socket ---------------------------------------------------------------------------


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def _socket_peer(conn: Connection) -> None:
    """The far end: read a length (8 bytes), then that many bytes; send them back; until length 0."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        conn.send(listener.getsockname()[1])
        sock, _ = listener.accept()
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(1 << 16)
        head = memoryview(bytearray(8))
        while True:
            _recv_exactly(sock, head)
            (n,) = struct.unpack("<Q", head)
            if n == 0:
                return
            if n > len(buffer):
                buffer = bytearray(n)
            view = memoryview(buffer)[:n]
            _recv_exactly(sock, view)
            sock.sendall(view)


@contextmanager
def socket_peer() -> Iterator[tuple[Callable[[bytes], Callable[[], None]], int]]:
    """A peer process and a connection to it; yields ``roundtrip(data)`` (a callable that sends data
    there and reads it back into a buffer allocated once) and the peer's pid."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_socket_peer, args=(child,), name="bench-socket-peer", daemon=True)
    proc.start()
    try:
        sock = socket.create_connection(("127.0.0.1", parent.recv()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def roundtrip(data: bytes) -> Callable[[], None]:
            head, back = struct.pack("<Q", len(data)), memoryview(bytearray(len(data)))

            def run() -> None:
                sock.sendall(head)
                sock.sendall(data)
                _recv_exactly(sock, back)
            return run

        with sock:
            assert proc.pid is not None
            yield roundtrip, proc.pid
            sock.sendall(struct.pack("<Q", 0))
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()


# -- concurrent clients ----------------------------------------------------------------------------


@dataclass
class Rate:
    requests: int = 0
    seconds: float = 0.0                    # wall time, first start to last end, summed over rounds
    latency: Samples = field(default_factory=Samples)

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds


def timed_phase(call: Callable[[], object], count: int, where: tuple[int, int], barrier: Any, results: Any) -> None:
    """One load client's timed phase: wait for the others, make ``count`` calls one after the other,
    report (client index, phase, start, end, latencies) to run_load_clients."""
    barrier.wait()
    latency = []
    started = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    for _ in range(count):
        t = time.perf_counter()
        call()
        latency.append(time.perf_counter() - t)
    results.put((*where, started, time.perf_counter(), latency))


def _load_client(index: int, phases: list[tuple[str, bytes, dict[str, str], int]], barrier: Any, results: Any) -> None:
    """One of the concurrent clients: per phase, warm up its connection, wait for the others, then send
    its requests one after the other."""
    clients: dict[str, httpx.Client] = {}
    try:
        for phase, (url, body, headers, count) in enumerate(phases):
            p = Payload("binary", body, headers)
            warmup = 5  # a connection idle for the other target's phase
            if url not in clients:
                clients[url], warmup = _http(url), WARMUP_REQUESTS
            http = clients[url]
            for _ in range(warmup):
                post(http, p)
            timed_phase(lambda: post(http, p), count, (index, phase), barrier, results)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        barrier.abort()
        results.put((index, -1, 0.0, 0.0, repr(exc)))
    finally:
        for http in clients.values():
            http.close()


def concurrent(targets: dict[str, tuple[str, Payload]]) -> dict[str, Rate]:
    """CLIENTS processes, each sending CONCURRENT_EACH requests per target and round; the targets
    alternate over CONCURRENT_ROUNDS rounds. Requests per second: all requests of a target over the sum
    of its rounds' wall times (the first client's start to the last one's end)."""
    keys = [key for _ in range(CONCURRENT_ROUNDS) for key in targets]
    phases = [(targets[k][0], targets[k][1].body, targets[k][1].headers, CONCURRENT_EACH) for k in keys]
    return run_load_clients(_load_client, (phases,), keys, "bench-client")


def run_load_clients(client: Callable[..., None], args: tuple, phase_keys: list[str], name: str) -> dict[str, Rate]:
    """Start CLIENTS processes running ``client(index, *args, barrier, results)``, each reporting one
    (index, phase, start, end, latencies) tuple per phase (phase -1 with an error message on failure),
    and sum them into one Rate per key of ``phase_keys`` (the key of each phase, in order)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(CLIENTS, timeout=BARRIER_TIMEOUT_S), ctx.Queue()
    procs = [ctx.Process(target=client, args=(i, *args, barrier, results), name=f"{name}-{i}", daemon=True)
             for i in range(CLIENTS)]
    for proc in procs:
        proc.start()
    got: list[tuple] = []
    try:
        while len(got) < CLIENTS * len(phase_keys):
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                if all(not proc.is_alive() for proc in procs) and results.empty():
                    raise RuntimeError("the load clients exited before reporting all their requests") from None
            if got and got[-1][1] < 0:
                break
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    errors = [r[4] for r in got if r[1] < 0]
    if errors:
        raise RuntimeError(f"a load client ({name}) failed: {errors[0]}")
    rates = {key: Rate() for key in dict.fromkeys(phase_keys)}
    for phase, key in enumerate(phase_keys):
        mine = [r for r in got if r[1] == phase]
        rate = rates[key]
        rate.seconds += max(r[3] for r in mine) - min(r[2] for r in mine)
        for r in mine:
            rate.requests += len(r[4])
            rate.latency.seconds += r[4]
    return rates


# -- CPU time ----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads included (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return math.nan


def device_worker(server_pid: int) -> int | None:
    """The pid of vkact's device worker: the multiprocessing child of the server's process."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == server_pid \
                    and b"spawn_main" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


@dataclass
class Cpu:
    """CPU seconds spent during a target's timed requests, by role: the client (this process), the
    server, vkact's device worker."""

    requests: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def per_request(self, role: str) -> float | None:
        value = self.seconds.get(role)
        return None if value is None or math.isnan(value) else value / self.requests


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class ServiceResult:
    device: dict[str, Any]
    small_bytes: tuple[int, int]            # request and response body of a 1,024-element binary request
    latency: dict[str, Samples]
    cpu: dict[str, Cpu]                      # during the latency runs
    rates: dict[str, Rate]
    large_bytes: dict[str, tuple[int, int]]  # request and response body per 16 MiB target
    tensor_bytes: int                        # 16 MiB in + 16 MiB out
    large: dict[str, Samples]
    large_ratio: float                       # vkact binary / echo throughput, median of paired runs
    versions: dict[str, str]
    load: tuple[float, float]                # 1-minute load average at the start and at the end
    seconds: float
    liveness: dict[str, Samples] = field(default_factory=dict)  # /health/live latency by condition (bench.liveness)

    @property
    def small_ratio(self) -> float:
        """vkact's p50 over the echo's, 1,024 elements."""
        return self.latency["vkact"].median / self.latency["echo"].median

    def vs_echo(self, key: str) -> float:
        """The echo's time for a 16 MiB binary request over this target's time for the same tensor
        (median of adjacent pairs for vkact's binary frames, else a ratio of medians)."""
        if key == "vkact binary":
            return self.large_ratio
        return self.large["echo"].median / self.large[key].median


def _latency(tasks: dict[str, tuple[Callable[[], object], dict[str, int | None]]]) -> tuple[dict[str, Samples], dict[str, Cpu]]:
    """Every task WARMUP_REQUESTS times, then LATENCY_BLOCKS rounds of one block of LATENCY_BLOCK
    requests per task; each request timed on its own. Each task comes with the pids of its server's
    processes by role, whose CPU time (and this process's, the client's) is added up over its blocks."""
    samples = {key: Samples() for key in tasks}
    cpu = {key: Cpu() for key in tasks}
    for task, _ in tasks.values():
        for _ in range(WARMUP_REQUESTS):
            task()
    for _ in range(LATENCY_BLOCKS):
        for key, (task, pids) in tasks.items():
            seconds = samples[key].seconds
            before = {role: cpu_seconds(pid) if pid else math.nan for role, pid in pids.items()}
            client = time.process_time()
            for _ in range(LATENCY_BLOCK):
                t = time.perf_counter()
                task()
                seconds.append(time.perf_counter() - t)
            spent = cpu[key].seconds
            spent["client"] = spent.get("client", 0.0) + time.process_time() - client
            for role, pid in pids.items():
                spent[role] = spent.get(role, 0.0) + (cpu_seconds(pid) if pid else math.nan) - before[role]
            cpu[key].requests += LATENCY_BLOCK
    return samples, cpu


def _versions() -> dict[str, str]:
    import httptools
    import uvicorn
    import uvloop

    return {"uvicorn": uvicorn.__version__, "httptools": httptools.__version__, "uvloop": uvloop.__version__,
            "httpx": httpx.__version__}


def run(log: Callable[[str], None] = print) -> ServiceResult:
    started, load = time.perf_counter(), os.getloadavg()[0]
    rng = np.random.default_rng(2024)
    small_x = rng.standard_normal(SMALL, dtype=np.float32)
    large_x = rng.standard_normal(LARGE, dtype=np.float32)
    with servers() as (vkact, echo), _http(vkact.url) as vk_http, _http(echo.url) as echo_http, \
            Client(vkact.url, encoding="binary", timeout=120) as client, socket_peer() as (roundtrip, peer):
        device = vk_http.get("/v1/device").json()
        log(f"service: vkact on {device['name']} at {vkact.url}, echo at {echo.url}")

        small = payload(vkact.url, small_x, "binary")
        for http, is_echo in ((vk_http, False), (echo_http, True)):
            check(post(http, small), small, is_echo)
        np.testing.assert_array_equal(client.shrink(small_x), reference(small_x))
        small_bytes = (len(small.body), len(post(vk_http, small).content))

        log(f"service: latency, {SMALL} elements, {LATENCY_BLOCKS * LATENCY_BLOCK} sequential requests per target")
        vk_pids = {"server": vkact.process.pid, "worker": device_worker(vkact.process.pid)}
        latency, cpu = _latency({
            "socket": (roundtrip(small.body), {"server": peer}),
            "echo": (lambda: post(echo_http, small), {"server": echo.process.pid}),
            "vkact": (lambda: post(vk_http, small), vk_pids),
            "client": (lambda: client.shrink(small_x), vk_pids),
        })

        log(f"service: {CLIENTS} concurrent clients, {CONCURRENT_ROUNDS * CLIENTS * CONCURRENT_EACH} requests per target")
        rates = concurrent({"echo": (echo.url, small), "vkact": (vkact.url, small)})

        log(f"service: throughput, {LARGE} elements ({4 * LARGE >> 20} MiB)")
        large = {enc: payload(vkact.url, large_x, enc) for enc in LARGE_REPEAT}
        binary = large["binary"]
        check(post(echo_http, binary), binary, True)
        sizes: dict[str, tuple[int, int]] = {"socket": (len(binary.body),) * 2, "echo": (len(binary.body),) * 2}
        for enc, p in large.items():
            response = post(vk_http, p)
            check(response, p, False)
            sizes[f"vkact {enc}"] = (len(p.body), len(response.content))
        sizes["client binary"] = sizes["vkact binary"]
        np.testing.assert_array_equal(client.shrink(large_x), reference(large_x))
        paired = rounds([
            ("socket", roundtrip(binary.body)),
            ("echo", lambda: post(echo_http, binary)),
            ("vkact binary", lambda: post(vk_http, binary)),
        ], LARGE_WARMUP, LARGE_REPEAT["binary"])
        # Each of these has just run once, checked: that was its warm-up.
        others = blocks([("client binary", lambda: client.shrink(large_x))], 0, LARGE_REPEAT["binary"])
        for enc in ("base64", "json"):
            p = large[enc]
            others |= blocks([(f"vkact {enc}", lambda p=p: post(vk_http, p))], 0, LARGE_REPEAT[enc])
        live = liveness.run(vkact.url, device["limits"]["max_body_bytes"], log)
    ratio = statistics.median(e / v for e, v in zip(paired["echo"].seconds, paired["vkact binary"].seconds))
    return ServiceResult(device, small_bytes, latency, cpu, rates, sizes, 2 * large_x.nbytes, paired | others, ratio,
                         _versions(), (load, os.getloadavg()[0]), time.perf_counter() - started, live)
