"""The Open Inference Protocol end to end: vkact's ``/v2`` driven by ``tritonclient``, next to Seldon
MLServer serving the same operator with numpy, and next to the bare echo, all on this machine in one run.

- **vkact**: the real service (``python -m service``, its defaults, a free loopback port), model
  ``shrink`` (DirectML's defaults: Bias 0, Threshold 0.5), through ``tritonclient.http`` with binary
  tensor data (tritonclient's default, ``binary_data=True`` for the input and the output) and, like
  for like with MLServer, in JSON (``binary_data=False``).
- **MLServer**: ``mlserver start`` on a custom runtime (``bench/mlserver_model.py``: ``NumpyCodec``,
  numpy SHRINK in float32), from a virtual environment of its own (``.cache/bench-mlserver-venv``,
  created on the first run: MLServer pins fastapi, pydantic and uvicorn versions other than vkact's).
  Its HTTP path is JSON only: it has no binary tensor extension. The same tritonclient drives it, in JSON.
- **bare echo**: ``bench/echo.py`` (uvicorn, httptools, uvloop, a raw ASGI callable that returns the
  body), sent the very bytes tritonclient sends vkact in binary, by tritonclient's own HTTP client
  (geventhttpclient): the HTTP stack and the client's transport, without any inference.

Requests are those of ``bench/service.py``: 1,024 FLOAT32 elements (sequential latency, then requests
per second with 8 client processes) and 2^22 (16 MiB in, 16 MiB out). Every target's answer is
checked against numpy once before it is timed. The clients and all the servers share this machine's
CPUs: on a 2-core machine they compete for them, and the figures say so much about that as about the
servers.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import service as svc
from .timing import Samples, blocks, rounds

ROOT = svc.ROOT
MODEL = "shrink"
SMALL, LARGE = svc.SMALL, svc.LARGE

# MLServer in a virtual environment of its own. uvloop < 0.22: with 0.22, MLServer 1.7.1's inference
# workers die at start-up (asyncio.get_event_loop() raises in them; SeldonIO/MLServer#2286) and no model
# loads. httptools: the HTTP parser vkact's uvicorn uses, so that both servers parse HTTP alike
# (without it uvicorn falls back to h11, which is slower).
MLSERVER_VERSION = "1.7.1"
MLSERVER_REQUIREMENTS = [f"mlserver=={MLSERVER_VERSION}", "numpy", "uvloop<0.22", "httptools"]
MLSERVER_VENV = Path(os.environ.get("VKACT_BENCH_MLSERVER_VENV", ROOT / ".cache" / "bench-mlserver-venv"))
MLSERVER_INSTALL_TIMEOUT_S = 900
# Two MLServers, by parallel_workers: its default, 1 (inference in a worker process, requests passed to
# it through a queue, as vkact passes them to its device worker), and 0 (inference in the HTTP server's
# own process: for a model as light as this one, on few cores, its faster setting). The targets are
# judged against the faster of the two, per measurement.
MLSERVER_WORKERS = {"mlserver json": 1, "mlserver-0 json": 0}

WARMUP_REQUESTS = svc.WARMUP_REQUESTS      # per target and client, before any timed small request
CLIENTS = svc.CLIENTS                      # 8 concurrent client processes
CONCURRENT_ROUNDS, CONCURRENT_EACH = 3, 400  # 3 x 8 x 400 = 9,600 requests per target: rounds long enough that the start and the stragglers at the end weigh little
LARGE_BINARY_REPEAT = 8                    # echo and vkact binary, alternately
LARGE_JSON_REPEAT = 3                      # vkact JSON and MLServer JSON, in blocks (seconds each)
NETWORK_TIMEOUT_S = 600.0                  # a 16 MiB JSON request to MLServer takes seconds

TARGET_RATE = 2.0          # vkact /v2 (binary) requests/s with 8 clients over MLServer's: at least this
TARGET_THROUGHPUT = 5.0    # vkact /v2 (binary) 16 MiB throughput over MLServer's: at least this

LABELS = {
    "vkact binary": "vkact `/v2`, binary (tritonclient default)",
    "vkact json": "vkact `/v2`, JSON",
    "mlserver json": f"MLServer {MLSERVER_VERSION} (numpy), JSON, parallel_workers 1 (its default)",
    "mlserver-0 json": f"MLServer {MLSERVER_VERSION} (numpy), JSON, parallel_workers 0 (in-process)",
    "echo": "bare echo (uvicorn + raw ASGI), vkact's binary request",
}


def reference(x: np.ndarray) -> np.ndarray:
    """SHRINK with Bias 0 and Threshold (lambd) 0.5, in float32."""
    return np.where(x < np.float32(-0.5), x, np.where(x > np.float32(0.5), x, np.float32(0)))


# -- MLServer's environment and server --------------------------------------------------------------


@dataclass
class MLServerEnv:
    venv: Path
    versions: dict[str, str]
    install_seconds: float | None     # None: the cached environment was used

    @property
    def executable(self) -> Path:
        return self.venv / "bin" / "mlserver"


class Unavailable(Exception):
    """MLServer cannot be measured here; the message says why."""


def _venv_versions(python: Path) -> dict[str, str]:
    names = ["mlserver", "fastapi", "starlette", "uvicorn", "pydantic", "uvloop", "httptools", "orjson", "numpy"]
    code = ("import json, importlib.metadata as m\n"
            f"names = {names!r}\n"
            "out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise Unavailable(f"its environment at {python.parent.parent} does not run: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def _tail(text: str, lines: int = 6) -> str:
    kept = [line for line in text.splitlines() if line.strip() and not line.startswith("WARNING: Location")]
    return " / ".join(kept[-lines:])[-800:] or "no output"


def make_venv(venv: Path, requirements: list[str], timeout: float) -> None:
    """A new virtual environment at ``venv`` (``python -m venv`` with this interpreter, then pip install
    ``requirements`` within ``timeout`` seconds), replacing a partial or outdated one of ours; raises
    Unavailable with the reason (no network, no venv module, ...), leaving nothing behind."""
    python = venv / "bin" / "python"
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    try:
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            raise Unavailable(f"python -m venv failed: {_tail(made.stderr + made.stdout)}")
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
               "--timeout", "30", "--retries", "2", *requirements]
        installed = subprocess.run(pip, capture_output=True, text=True, timeout=timeout)
        if installed.returncode != 0:
            raise Unavailable(f"pip install {' '.join(requirements)} failed: {_tail(installed.stderr + installed.stdout)}")
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(venv, ignore_errors=True)
        raise Unavailable(f"installing it took over {exc.timeout:.0f} s") from None
    except Unavailable:
        shutil.rmtree(venv, ignore_errors=True)
        raise


def mlserver_env(log: Callable[[str], None] = print) -> MLServerEnv:
    """The cached environment, or a new one (``python -m venv``, then pip); raises Unavailable with the
    reason when it cannot be made (no network, no venv module, ...)."""
    venv, python = MLSERVER_VENV, MLSERVER_VENV / "bin" / "python"
    stamp = venv / ".vkact-bench-stamp"
    wanted = "\n".join(MLSERVER_REQUIREMENTS) + "\n"
    if stamp.exists() and stamp.read_text() == wanted and (venv / "bin" / "mlserver").exists():
        return MLServerEnv(venv, _venv_versions(python), None)
    log(f"v2: creating MLServer's environment in {venv} ({', '.join(MLSERVER_REQUIREMENTS)}) ...")
    started = time.perf_counter()
    make_venv(venv, MLSERVER_REQUIREMENTS, MLSERVER_INSTALL_TIMEOUT_S)
    stamp.write_text(wanted)
    seconds = time.perf_counter() - started
    log(f"v2: MLServer's environment ready in {seconds:.0f} s")
    return MLServerEnv(venv, _venv_versions(python), seconds)


def _stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a server started in its own session: SIGTERM to it (MLServer then stops its workers), and if
    it or any process it started is still there after ``timeout``, SIGKILL to its process group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group is ours (start_new_session): its leftovers only
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(10)


@contextmanager
def mlserver(env: MLServerEnv, workers: int) -> Iterator[svc.Server]:
    """``mlserver start`` on a temporary model folder, HTTP on a free loopback port (gRPC on another, up
    to 64 MiB messages; metrics off), ``workers`` inference processes (0: inference in the server's process), ready when
    the model is; stopped on the way out."""
    folder = Path(tempfile.mkdtemp(prefix="vkact-bench-mlserver-"))
    proc = None
    try:
        shutil.copy(Path(__file__).with_name("mlserver_model.py"), folder / "mlserver_model.py")
        port, grpc_port = svc.free_port(), svc.free_port()
        # gRPC on its own port, its message limit raised from grpcio's 4 MiB default so 16 MiB tensors pass
        settings = {"host": "127.0.0.1", "http_port": port, "grpc_port": grpc_port, "grpc_max_message_length": 64 << 20,
                    "metrics_endpoint": None, "metrics_port": svc.free_port(), "debug": False,
                    "parallel_workers": workers, "metrics_dir": str(folder / ".metrics")}
        (folder / "settings.json").write_text(json.dumps(settings, indent=2))
        (folder / "model-settings.json").write_text(json.dumps(
            {"name": MODEL, "implementation": "mlserver_model.Shrink", "parameters": {"version": "1"}}, indent=2))
        env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("MLSERVER_", "VKACT_", "PYTHON"))}
        log = folder / "mlserver.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([str(env.executable), "start", str(folder)], cwd=folder, env=env_vars,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        server = svc.Server("mlserver", f"http://127.0.0.1:{port}", proc, log, f"127.0.0.1:{grpc_port}")
        try:
            svc._wait_ready(server, f"/v2/models/{MODEL}/ready")
        except RuntimeError as exc:
            raise Unavailable(f"it did not start: {_tail(str(exc), 8)}") from None
        yield server
    finally:
        if proc is not None:
            _stop_group(proc)
        shutil.rmtree(folder, ignore_errors=True)


# -- clients ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    key: str          # a LABELS key
    url: str          # http://127.0.0.1:port
    binary: bool      # tritonclient's binary_data for the input and the output
    echo: bool = False

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")


class Caller:
    """One client of one target, its input encoded once: a call sends one request and returns what
    the user gets (the output as a numpy array; for the echo, the response body). tritonclient's
    InferenceServerClient, one connection; the echo gets tritonclient's binary request for vkact,
    byte for byte, through tritonclient's own transport (geventhttpclient)."""

    def __init__(self, target: Target, x: np.ndarray) -> None:
        import tritonclient.http as triton
        from geventhttpclient import HTTPClient

        self.target = target
        inp = triton.InferInput("InputTensor", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=target.binary or target.echo)
        out = triton.InferRequestedOutput("OutputTensor", binary_data=target.binary or target.echo)
        self._inputs, self._outputs = [inp], [out]
        if target.echo:
            body, header_length = triton.InferenceServerClient.generate_request_body([inp], outputs=[out])
            self.body = bytes(body)
            self._headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
            self._http = HTTPClient.from_url(target.url, concurrency=1, connection_timeout=60,
                                             network_timeout=NETWORK_TIMEOUT_S)
            self._client = None
        else:
            self._client = triton.InferenceServerClient(target.host, connection_timeout=60,
                                                        network_timeout=NETWORK_TIMEOUT_S)

    def __call__(self) -> Any:
        if self._client is not None:
            result = self._client.infer(MODEL, self._inputs, outputs=self._outputs)
            return result.as_numpy("OutputTensor")
        response = self._http.post(f"/v2/models/{MODEL}/infer", body=self.body, headers=self._headers)
        content = response.read()
        if response.status_code != 200:
            raise RuntimeError(f"echo: {response.status_code}")
        return content

    def check(self, x: np.ndarray, through_infer: bool = True) -> tuple[int, int]:
        """One request, its answer checked (numpy's SHRINK; for the echo, the body sent); returns the
        request and response body sizes. The same request tritonclient sends, posted by its transport
        and parsed by its own ``parse_response_body`` (tritonclient keeps no body sizes); then, with
        ``through_infer``, once more through ``infer()`` as timed (a 16 MiB JSON request takes seconds:
        the small requests have checked that path)."""
        import tritonclient.http as triton
        from geventhttpclient import HTTPClient

        if self.target.echo:
            got = self()
            if got != self.body:
                raise RuntimeError("the echo server did not return the request's body")
            return len(self.body), len(got)
        assert self._client is not None
        body, header_length = triton.InferenceServerClient.generate_request_body(self._inputs, outputs=self._outputs)
        headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
        http = HTTPClient.from_url(self.target.url, concurrency=1, network_timeout=NETWORK_TIMEOUT_S)
        try:
            response = http.post(f"/v2/models/{MODEL}/infer", body=body, headers=headers)
            content = response.read()
        finally:
            http.close()
        if response.status_code != 200:
            raise RuntimeError(f"{self.target.key}: {response.status_code} {content[:500]!r}")
        answer_length = response.get("Inference-Header-Content-Length")
        result = triton.InferenceServerClient.parse_response_body(
            content, header_length=None if answer_length is None else int(answer_length))
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), reference(x),
                                      err_msg=f"{self.target.key}: wrong SHRINK output")
        if through_infer:
            np.testing.assert_array_equal(self(), reference(x), err_msg=f"{self.target.key}: wrong SHRINK output (infer)")
        return len(body), len(content)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        else:
            self._http.close()


def load_client(index: int, make: Callable[[Any, np.ndarray], Any], phases: list[tuple[Any, int]], x: np.ndarray,
                barrier: Any, results: Any) -> None:
    """One of the concurrent client processes: per phase, warm up its connection to the phase's target
    (``make(target, x)``: a Caller of this module or of v2_grpc), wait for the others, then send its
    requests one after the other."""
    callers: dict[str, Any] = {}
    try:
        for phase, (target, count) in enumerate(phases):
            warmup = 5  # a connection idle through the other targets' phases
            if target.key not in callers:
                callers[target.key], warmup = make(target, x), WARMUP_REQUESTS
            call = callers[target.key]
            for _ in range(warmup):
                call()
            svc.timed_phase(call, count, (index, phase), barrier, results)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        barrier.abort()
        results.put((index, -1, 0.0, 0.0, repr(exc)))
    finally:
        for call in callers.values():
            call.close()


def concurrent(targets: list[Target], x: np.ndarray) -> dict[str, svc.Rate]:
    """CLIENTS processes, each sending CONCURRENT_EACH requests per target and round, the targets in
    turn over CONCURRENT_ROUNDS rounds; requests/s: all of a target's requests over the summed wall
    times of its rounds (first client's start to last client's end), as bench/service.py counts them."""
    phases = [(t, CONCURRENT_EACH) for _ in range(CONCURRENT_ROUNDS) for t in targets]
    return svc.run_load_clients(load_client, (Caller, phases, x), [t.key for t, _ in phases], "bench-v2-client")


# -- perf_analyzer ----------------------------------------------------------------------------------


PERF_ANALYZER_NOTE = (
    "not run: no `perf_analyzer` executable here. PyPI's `perf-analyzer` has one release, 0.1.0, a "
    "placeholder (a pure-Python wheel whose only content is a `hello()` function, no executable; checked "
    "with `pip download --no-deps perf-analyzer==0.1.0`); the real one ships with Triton's SDK container "
    "and its C++ client builds.")


def perf_analyzer(url: str) -> str:
    """perf_analyzer's figures for ``shrink`` with 1,024 elements and 8 concurrent requests on vkact's
    /v2 over HTTP, when an executable is found (PATH or the project's venv); else why not."""
    exe = shutil.which("perf_analyzer") or shutil.which("perf_analyzer", path=str(Path(sys.executable).parent))
    if exe is None:
        return PERF_ANALYZER_NOTE
    with tempfile.TemporaryDirectory(prefix="vkact-bench-pa-") as tmp:
        report = Path(tmp) / "pa.csv"
        cmd = [exe, "-m", MODEL, "-u", url.removeprefix("http://"), "-i", "http", "--shape", f"InputTensor:{SMALL}",
               "--concurrency-range", str(CLIENTS), "--measurement-interval", "3000", "-f", str(report)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            return f"`{exe}` ran over 180 s; no figures"
        if done.returncode != 0 or not report.exists():
            return f"`{exe}` failed ({done.returncode}): {_tail(done.stderr + done.stdout, 4)}"
        rows = list(csv.DictReader(report.open()))
    if not rows:
        return f"`{exe}` wrote no figures"
    row = rows[-1]

    def us(name: str) -> str:
        value = row.get(name)
        return "—" if value in (None, "") else f"{float(value) / 1e3:.2f} ms"

    return (f"`{MODEL}`, {SMALL:,} FP32 elements, HTTP with binary data, concurrency {row.get('Concurrency', CLIENTS)}: "
            f"**{float(row.get('Inferences/Second', 'nan')):.0f} inferences/s**, p50 {us('p50 latency')}, "
            f"p99 {us('p99 latency')} (`{exe}`)")


# -- the run ----------------------------------------------------------------------------------------


@dataclass
class V2Result:
    device: dict[str, Any]
    vkact_version: str
    mlserver: MLServerEnv | None
    mlserver_reason: str | None                 # why MLServer is missing, when it is
    small_bytes: dict[str, tuple[int, int]]     # request / response body per target, 1,024 elements
    latency: dict[str, Samples]
    cpu: dict[str, svc.Cpu]
    rates: dict[str, svc.Rate]
    large_bytes: dict[str, tuple[int, int]]
    tensor_bytes: int                           # 16 MiB in + 16 MiB out
    large: dict[str, Samples]
    perf_analyzer: str
    versions: dict[str, str]
    load: tuple[float, float]
    seconds: float

    @property
    def fastest_rate(self) -> str | None:
        """The MLServer with the most requests/s (the one the target is judged against)."""
        keys = [k for k in MLSERVER_WORKERS if k in self.rates]
        return max(keys, key=lambda k: self.rates[k].per_second) if keys else None

    @property
    def fastest_large(self) -> str | None:
        """The MLServer with the shortest median 16 MiB request."""
        keys = [k for k in MLSERVER_WORKERS if k in self.large]
        return min(keys, key=lambda k: self.large[k].median) if keys else None

    def rate_ratio(self, key: str = "vkact binary", against: str | None = None) -> float | None:
        """This target's requests/s over the fastest MLServer's (or ``against``'s)."""
        against = against or self.fastest_rate
        if against is None or against not in self.rates:
            return None
        return self.rates[key].per_second / self.rates[against].per_second

    def throughput_ratio(self, key: str = "vkact binary", against: str | None = None) -> float | None:
        """The fastest MLServer's (or ``against``'s) median time for a 16 MiB request over this target's."""
        against = against or self.fastest_large
        if against is None or against not in self.large:
            return None
        return self.large[against].median / self.large[key].median


def _versions() -> dict[str, str]:
    import importlib.metadata as m

    names = ["tritonclient", "geventhttpclient", "fastapi", "starlette", "uvicorn", "pydantic", "uvloop", "httptools", "numpy"]
    return {n: m.version(n) for n in names}


def run(log: Callable[[str], None] = print) -> V2Result:
    started, load = time.perf_counter(), os.getloadavg()[0]
    env: MLServerEnv | None
    reason: str | None = None
    try:
        env = mlserver_env(log)
    except (Unavailable, OSError) as exc:
        env, reason = None, str(exc)
        log(f"v2: MLServer not available: {reason}")
    rng = np.random.default_rng(2024)
    small_x = rng.standard_normal(SMALL, dtype=np.float32)
    large_x = rng.standard_normal(LARGE, dtype=np.float32)

    with svc.servers() as (vkact, echo), _maybe_mlservers(env) as (mls, ml_reason):
        import httpx

        reason = reason or ml_reason
        if ml_reason:
            log(f"v2: MLServer not available: {ml_reason}")
        device = httpx.get(vkact.url + "/v1/device", timeout=30).json()
        vkact_version = httpx.get(vkact.url + "/v2", timeout=30).json().get("version", "?")
        targets = [Target("vkact binary", vkact.url, True), Target("vkact json", vkact.url, False)]
        targets += [Target(key, ml.url, False) for key, ml in mls.items()]
        targets.append(Target("echo", echo.url, True, echo=True))
        log(f"v2: vkact at {vkact.url}, echo at {echo.url}" + "".join(f", {k} at {ml.url}" for k, ml in mls.items()))

        pids = {"vkact binary": vkact.process.pid, "vkact json": vkact.process.pid, "echo": echo.process.pid}
        pids |= {key: ml.process.pid for key, ml in mls.items()}
        small = {t.key: Caller(t, small_x) for t in targets}
        try:
            small_bytes = {key: call.check(small_x) for key, call in small.items()}
            log(f"v2: latency, {SMALL} elements, {svc.LATENCY_BLOCKS * svc.LATENCY_BLOCK} sequential requests per target")
            latency, cpu = svc._latency({
                key: (call, {"server": pids[key], "worker": svc.device_worker(pids[key])} if key != "echo"
                      else {"server": pids[key]})
                for key, call in small.items()})
        finally:
            for call in small.values():
                call.close()

        log(f"v2: {CLIENTS} concurrent clients, {CONCURRENT_ROUNDS * CLIENTS * CONCURRENT_EACH} requests per target")
        rates = concurrent(targets, small_x)

        log(f"v2: 16 MiB ({LARGE} elements); JSON requests take seconds each")
        large = {t.key: Caller(t, large_x) for t in targets}
        try:
            sizes: dict[str, tuple[int, int]] = {}
            for key, call in large.items():  # the check is each target's warm-up
                t = time.perf_counter()
                sizes[key] = call.check(large_x, through_infer=False)
                log(f"v2:   {key}: checked ({time.perf_counter() - t:.1f} s)")
            timed = rounds([("echo", large["echo"]), ("vkact binary", large["vkact binary"])], 0, LARGE_BINARY_REPEAT)
            timed |= blocks([(k, large[k]) for k in ("vkact json", *mls)], 0, LARGE_JSON_REPEAT)
        finally:
            for call in large.values():
                call.close()

        log("v2: perf_analyzer")
        pa = perf_analyzer(vkact.url)
    return V2Result(device, vkact_version, env, reason, small_bytes, latency, cpu, rates, sizes, 2 * large_x.nbytes,
                    {k: timed[k] for k in large}, pa, _versions(), (load, os.getloadavg()[0]),
                    time.perf_counter() - started)


@contextmanager
def _maybe_mlservers(env: MLServerEnv | None) -> Iterator[tuple[dict[str, svc.Server], str | None]]:
    """The MLServers of MLSERVER_WORKERS, started side by side; none, and why, when one cannot start."""
    if env is None:
        yield {}, None
        return
    with ExitStack() as stack:
        try:
            servers = {key: stack.enter_context(mlserver(env, workers)) for key, workers in MLSERVER_WORKERS.items()}
        except Unavailable as exc:
            stack.close()
            yield {}, str(exc)
            return
        yield servers, None


# -- the report ---------------------------------------------------------------------------------------


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return f"{value:.2f}× → **{'PASS' if value >= target else 'BELOW'}**"


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n:,} B"


def section(device_name: str, header: list[tuple[str, str]], r: V2Result, targets: bool = True) -> str:
    """``targets``: on the device the targets were set for (llvmpipe), their verdicts; elsewhere figures only."""
    lines = [f"<!-- v2: {device_name} -->", f"## {device_name}: Open Inference Protocol (`/v2`) against MLServer", ""]
    lines += [f"- **{key}:** {value}" for key, value in header]
    if r.mlserver is None:
        lines += ["", f"**MLServer not available: {r.mlserver_reason}** (its rows and the targets are missing)."]

    keys = list(r.latency)
    n_small = len(r.latency[keys[0]].seconds)
    lines += ["", f"### 1,024 FLOAT32 elements: sequential latency ({n_small:,} requests per target) "
                  f"and {CLIENTS} concurrent clients ({r.rates[keys[0]].requests:,} requests per target)", ""]
    head = ["target", "request / response body", "p50 ms", "p99 ms", "CPU µs per request: client / server / worker",
            f"requests/s, {CLIENTS} clients", "p50 / p99 ms under load", "req/s vs the faster MLServer"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key in keys:
        s, rate = r.latency[key], r.rates[key]
        cpu = " / ".join("—" if c is None else f"{c * 1e6:.0f}" for c in (r.cpu[key].per_request(role) for role in ("client", "server", "worker")))
        ratio = None if key == "echo" else r.rate_ratio(key)
        vs = "—" if ratio is None else f"{ratio:.2f}"
        if key == "vkact binary" and vs != "—":
            vs = f"**{vs}**"
        lines.append(_row([LABELS[key], f"{r.small_bytes[key][0]:,} / {r.small_bytes[key][1]:,} B", _ms(s.median),
                           _ms(s.percentile(99)), cpu, f"{rate.per_second:.0f}",
                           f"{_ms(rate.latency.median)} / {_ms(rate.latency.percentile(99))}", vs]))

    lines += ["", "### 16 MiB: 2^22 FLOAT32 elements in and out", ""]
    head = ["target", "timed requests", "request / response body", "seconds per request", "tensor MB/s", "wire MB/s",
            "vs the faster MLServer"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key, samples in r.large.items():
        body_in, body_out = r.large_bytes[key]
        tensor = "—" if key == "echo" else f"{r.tensor_bytes / samples.best / 1e6:.0f} ({r.tensor_bytes / samples.median / 1e6:.0f})"
        wire = f"{(body_in + body_out) / samples.best / 1e6:.0f} ({(body_in + body_out) / samples.median / 1e6:.0f})"
        ratio = r.throughput_ratio(key) if key != "echo" else None
        vs = "—" if ratio is None else (f"**{ratio:.2f}**" if key == "vkact binary" else f"{ratio:.2f}")
        lines.append(_row([LABELS[key], str(len(samples.seconds)), f"{_size(body_in)} / {_size(body_out)}",
                           f"{samples.median:.3f}", tensor, wire, vs]))

    rate, like_rate = r.rate_ratio(), r.rate_ratio("vkact json")
    put, like_put = r.throughput_ratio(), r.throughput_ratio("vkact json")
    echo_put = r.large["echo"].median / r.large["vkact binary"].median
    echo_rate = r.rates["vkact binary"].per_second / r.rates["echo"].per_second

    def which(key: str | None) -> str:
        return "" if key is None else f" (against parallel_workers {MLSERVER_WORKERS[key]}, the faster here)"

    default = "mlserver json"
    if targets:
        lines += ["", "**Targets** (vkact `/v2` with tritonclient's default binary data; MLServer with its only HTTP "
                      "encoding, JSON, whichever of its two settings is faster):", "",
                  f"- requests/s with {CLIENTS} concurrent clients, 1,024 elements, ≥ {TARGET_RATE:g}× MLServer's: "
                  f"{_verdict(rate, TARGET_RATE)}{which(r.fastest_rate)}",
                  f"- 16 MiB throughput ≥ {TARGET_THROUGHPUT:g}× MLServer's: {_verdict(put, TARGET_THROUGHPUT)}{which(r.fastest_large)}"]
    if rate is not None and default in r.rates:
        lines += ["", f"Against MLServer's default setting alone (parallel_workers 1): {r.rate_ratio(against=default):.2f}× "
                      f"the requests/s, {r.throughput_ratio(against=default):.2f}× the 16 MiB throughput. Like for like "
                      f"(vkact `/v2` in JSON against the faster MLServer): {like_rate:.2f}× the requests/s, "
                      f"{like_put:.2f}× the 16 MiB throughput."]
    lines += ["", f"Against the bare echo, vkact `/v2` binary reaches {echo_rate:.2f} of its requests/s and "
                  f"{echo_put:.2f} of its 16 MiB throughput.",
              "", f"**perf_analyzer:** {r.perf_analyzer}"]
    lines += ["", "<!-- end v2 -->", ""]
    return "\n".join(lines)


def header(r: V2Result, machine: str) -> list[tuple[str, str]]:
    from datetime import datetime, timezone

    from service.config import Settings

    d, v = r.device, r.versions
    if r.mlserver is None:
        ml = "not available (below)"
    else:
        mv = r.mlserver.versions
        others = ", ".join(f"{n} {mv[n]}" for n in ("fastapi", "uvicorn", "pydantic", "uvloop", "httptools", "orjson", "numpy") if n in mv)
        installed = ("cached" if r.mlserver.install_seconds is None
                     else f"created by this run in {r.mlserver.install_seconds:.0f} s")
        ml = (f"{mv.get('mlserver', '?')} with {others}; custom runtime `bench/mlserver_model.py` (NumpyCodec, numpy "
              f"float32); two servers, parallel_workers 1 (its default: inference in a worker process) and 0 "
              f"(inference in the HTTP server's process); debug off (no access log), gRPC on its own port, metrics "
              f"off; environment `{_rel(r.mlserver.venv)}` ({installed}; uvloop < 0.22: with 0.22 MLServer "
              f"1.7.1's workers die at start-up, SeldonIO/MLServer#2286; httptools as vkact's uvicorn has it)")
    return [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{machine}; 1-minute load average {r.load[0]:.1f} at the start, {r.load[1]:.1f} at the end"),
        ("Device", f"{d['name']}; type {d['type']}; driver {d['driver']['name']} {d['driver']['info']}; "
                   f"Vulkan {d['vulkan_api_version']}; tensors in {d['memory']} memory"),
        ("vkact", f"{r.vkact_version}: fastapi {v['fastapi']}, uvicorn {v['uvicorn']}, httptools {v['httptools']}, "
                  f"uvloop {v['uvloop']}, pydantic {v['pydantic']}, one process; device worker in its own process at "
                  f"nice {Settings().worker_nice}; `shrink` with its defaults (Bias 0, Threshold 0.5)"),
        ("MLServer", ml),
        ("Clients", f"tritonclient {v['tritonclient']} (`tritonclient.http`, over geventhttpclient {v['geventhttpclient']}), "
                    f"one connection per client, output decoded to numpy (`as_numpy`) in every timed request; "
                    f"{CLIENTS} client processes for requests/s"),
        ("CPUs", f"{os.cpu_count()}, shared by the clients, the four servers and the two inference worker processes"
                 + (": clients and servers compete for them, so requests/s measure the whole machine's work per request"
                    if (os.cpu_count() or 0) <= 4 else "")),
        ("Runtime", f"{r.seconds:.1f} s"),
    ]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
