"""bench/RESULTS.md: a preamble, then per Vulkan device a kernel section, a service section and a /v2
section (rendered by bench/v2.py), each between HTML comment markers. A run rewrites the preamble and
the sections it measured; other sections are kept verbatim (text outside any section is not: the bench
owns the file)."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .timing import Samples

if TYPE_CHECKING:
    from .service import Cpu, ServiceResult
    from .vulkan_peers import PeerRun

VULKAN_PEERS = ("ncnn", "wgpu", "IREE")

TARGET_THROUGHPUT = 0.50   # vkact's 16 MiB binary requests: at least this fraction of the bare echo's throughput
TARGET_LATENCY = 1.5       # vkact's 1,024-element requests: p50 at most this multiple of the bare echo's p50

PREAMBLE = f"""# vkact benchmark

Written by `make bench` (`python -m bench`; `--only kernels`, `--only service`, `--only v2`, `--only grpc`
or `--only types64`, `--only accuracy`, `--only graphs`, `--only triton` runs one part; `python -m bench.profile`
profiles the service). Each Vulkan device has a kernel
section, a service section, Open Inference Protocol sections (HTTP, gRPC), a section of the 64-bit
kernels (FLOAT64, INT64, UINT64, native and emulated in 32-bit words), FLOAT64's accuracy and a graphs
section (fused graphs against their nodes one by one); a run replaces only the sections it measured, on
the device it ran on.

## Kernels

Throughput is bytes read plus bytes written over wall time (GB = 10^9 bytes); GB/s is the best of the
timed runs, with the median in parentheses where shown.

- **kernel**: one dispatch of the operator's packed FLOAT32 kernel on the engine's own buffers and
  pipeline, without transfers.
- **kernel / copy**: kernel throughput over that of `glsl/bench/copy.comp` (a plain copy of 16-byte
  vectors, same buffers, same workgroup count: the device's own ceiling), the two timed alternately;
  the median of the ratios of adjacent runs. Information, not a target: kernels built on exp, tanh or
  erf are instruction-bound on a CPU driver and stay below the ceiling.
- **end-to-end**: `Engine.execute`: input copied into the device's buffer, dispatch, output copied
  out into a new array.
- **numpy, torch, onnxruntime**: the same operator in float32 on the CPU, output in a new array.
  End-to-end and peer runs are timed in blocks, not interleaved: each would otherwise inherit the
  allocator and cache state of its neighbour.
- **Vulkan peers** (`bench/vulkan_peers.py`): the other Vulkan stacks, from PyPI, on the same device
  (found by its name; never wgpu's OpenGL adapter), each with the same operator, formula, DirectML's
  default parameters and FLOAT32 elements, the input already on the device; timed: the kernel and the
  wait for it, in the same alternated rounds as vkact's kernel and the copy (medians).
  **ncnn** (`bench/ncnn_peer.py`): its own layers (ReLU, Sigmoid, TanH, ELU, CELU, SELU, HardSigmoid,
  HardSwish, Swish, Softplus, GELU, Shrink) with `use_vulkan_compute` and fp16/bf16 off; its Python
  binding runs a net only as upload, layers, download, so one kernel's time is the difference between
  a net of 1 + k copies of the layer and a net of 1, over k (k = 32 at 2^20, 8 at 2^24: ~1 GiB moved,
  as the transfers that both nets pay vary by several kernels' time); the later layers see the
  earlier ones' outputs, the ulp is the single layer's. **wgpu** (`bench/wgpu_peer.py`): a WGSL
  shader of the same formula over `vec4<f32>`, one dispatch, submit, wait. **IREE** (`bench/iree_peer.py`'s
  bodies): one `linalg.generic` compiled for `vulkan-spirv`, invoked on its `vulkan` driver.
  **peer / vkact**: the median over rounds of the peer's time over vkact's kernel time in the same
  round (above 1: vkact is faster). **ulp**: the largest error over all elements against the
  operator's float64 reference rounded to float32 (the tests' oracle; results below the smallest
  normal count as exact where the reference is too). A large ulp with a small absolute error comes
  from a tail or a zero crossing (tanh near 0, GELU below -5, HARD_SIGMOID where it reaches 0).
  "—": the peer has no like-for-like kernel for the operator (ncnn has no SOFTSIGN, SCALED_TANH,
  LINEAR or THRESHOLDED_RELU layer; WGSL has no erf, so no GELU); a peer that is not installed or
  cannot see the device is named in the section's header with the reason. All three run offline
  from their PyPI wheels (`make bench` installs the `[bench]` extra): ncnn carries its own glslang,
  wgpu-native its own WGSL compiler (naga), IREE compiles ahead of time with its own compiler.
- **target** (llvmpipe): vkact's kernel faster than every Vulkan peer on every operator they share, at
  every size measured (met or NOT met, per operator).

## Service end to end

`POST /v1/execute` of the real service (`python -m service` with its defaults, started by the bench on
a free loopback port) next to two ceilings measured in the same run (`bench/service.py`):

- **bare echo**: `bench/echo.py`, a raw ASGI callable (no Starlette or FastAPI) that returns the
  request's body, under uvicorn with the service's settings (httptools, uvloop, one process): the
  HTTP stack alone.
- **raw socket**: the same bytes over a TCP connection on 127.0.0.1 to another process, which reads them
  (`recv_into`) and sends them back (`sendall`): no HTTP.
- Requests: SHRINK (DirectML's defaults) on FLOAT32 data, the bodies that `client.Client` builds, sent
  by `httpx.Client` with one keep-alive connection per client; the echo gets vkact's binary frames
  byte for byte. **client.Client** rows time the Python client itself (its encoding and decoding
  included). Every target's answer is checked once before it is timed.
- **latency**: 1,024 elements, one request at a time: p50 and p99 of single requests as the client
  sees them; the targets alternate in blocks of 200 requests, 2,000 per target after 50 warm-up ones.
  CPU µs per request: user + system CPU time of the client (the bench's process), of the server's
  process (for the raw socket, its peer) and of vkact's device worker process, all threads included,
  over the timed requests (from /proc, 10 ms ticks: about ±5 µs per request). With one request at a
  time, the three add up to about the wall time per request when the CPUs are otherwise idle.
- **requests/s**: 8 client processes (not threads: one process's GIL would measure the client), each
  with its own connection, started together; 4,000 requests per target over 2 alternating rounds;
  all requests over the summed wall time of the rounds.
- **16 MiB**: 2^22 FLOAT32 elements in and out. tensor MB/s: 16 MiB in + 16 MiB out over the wall
  time of one request; wire MB/s: request body + response body bytes over the same time
  (MB = 10^6 bytes); best (median) of the timed requests. The socket, the echo and vkact's binary
  frames are timed alternately; the others in blocks. **vs echo**: the echo's time for the binary
  frame over this target's time for the same tensor (for vkact binary, the median over adjacent
  pairs).
- **targets**: 16 MiB binary requests at ≥ {TARGET_THROUGHPUT:.2f} of the echo's throughput; 1,024-element
  requests with p50 ≤ {TARGET_LATENCY:g}× the echo's p50 (PASS or BELOW).
- The clients, both servers, vkact's device worker and the raw socket's peer share the machine's
  CPUs (and with whatever else runs there: see the load average in each section's header).

## Open Inference Protocol (`/v2`) against MLServer

`POST /v2/models/shrink/infer` of the real service driven by `tritonclient.http` (`bench/v2.py`), next
to [Seldon MLServer](https://github.com/SeldonIO/MLServer) serving the same operator with numpy
(`bench/mlserver_model.py`, a custom runtime: `NumpyCodec` in, numpy SHRINK in float32, `NumpyCodec`
out) on the same machine, and next to the bare echo, all measured in one run:

- **vkact `/v2`, binary**: tritonclient's default, Triton's binary tensor data for the input and the
  output. **JSON**: `binary_data=False` for both, like for like with MLServer, whose HTTP path has
  JSON only (no binary extension). MLServer runs from its own virtual environment
  (`.cache/bench-mlserver-venv`, made on the first run: it pins fastapi, pydantic and uvicorn
  versions of its own); when it cannot be installed or started, the section says why. Two MLServers
  run side by side: `parallel_workers` 1 (its default: inference in a worker process fed through a
  queue) and 0 (inference in the HTTP server's process, faster for a model this light on few cores).
- **bare echo**: `bench/echo.py` sent tritonclient's binary request for vkact byte for byte, through
  tritonclient's own transport (geventhttpclient): the HTTP ceiling.
- Every timed request is `InferenceServerClient.infer` plus `as_numpy` of the output (the echo's:
  a POST and the body read). Requests, latency blocks, the 8 client processes and the 16 MiB sizes
  are those of the service section; requests/s: 3 rounds of 8 × 400 requests per target. 16 MiB:
  the echo and vkact binary alternate; the JSON targets run in blocks (seconds per request).
  Every target's answer is checked against numpy once before it is timed.
- **targets**: vkact `/v2` (binary) serves ≥ 2× MLServer's requests/s with 8 concurrent clients on
  1,024-element requests, and ≥ 5× its throughput on 16 MiB tensors, against the faster of the two
  MLServers in each measurement (PASS or BELOW).

## Open Inference Protocol over gRPC against MLServer's gRPC

`ModelInfer` on vkact's gRPC port (`bench/v2_grpc.py`), beside its HTTP `/v2` (binary, tritonclient.http)
and next to the same two MLServers' gRPC servers (messages up to 64 MiB), all measured in one run:

- **vkact gRPC, raw contents**: the input in `raw_input_contents`, the output read from
  `raw_output_contents` (what `tritonclient.grpc` sends and reads; MLServer answers raw to a raw
  request). **System shared memory**: each client registers a region of its own; the input is
  written there once, the output read back into numpy in every timed request.
- The gRPC clients are grpcio stubs (tritonclient's generated modules), one channel per client, the
  request message built once: a timed request is the RPC plus `np.frombuffer` of the answer, so the
  server is what is measured. Requests/s: 3 rounds of 8 × 400 requests per target, 8 client
  processes; 16 MiB: sequential requests in blocks, seconds per request (median).
- **h2load** (nghttp2's C load generator, `bench/h2load_grpc.py`): the same raw-contents request's
  bytes as a gRPC POST on 8 connections of one stream each, 3 alternated rounds of 5 s per target,
  vkact and both MLServers alike; every answer checked by its DATA bytes (a success's length, taken
  from a grpcio call checked against numpy). A grpcio client spends ~5x h2load's CPU per request on
  the same 2 cores as the servers, so these figures are the servers' own.
- **target**: vkact gRPC serves ≥ 3× the requests/s of the faster MLServer gRPC with 8 concurrent
  clients on 1,024-element requests (PASS or BELOW), judged on h2load's figures when h2load is there.

## vkact beside Triton Inference Server

`python -m bench --only triton` (`bench/triton.py`): Triton 2.51 from PyPI's `nvidia-pytriton` (its own
virtual environment, `~/.cache/vkact/triton`, made on the first run; the Python-backend stub of that
Python beside `libtriton_python.so`), serving SHRINK as a Triton user serves a custom operator: a
Python-backend `model.py` in numpy, FLOAT32, Bias 0.5, Threshold 0.5 (`bench/triton_server.py` writes
the model repository). vkact serves `shrink`, sent the same Bias and Threshold as request parameters;
both servers get the very same request bytes and are up at once, and every measurement alternates
them. Every answer is checked against numpy before anything is timed, and under load too (wrk's Lua
script compares every answer with the checked one; h2load's answers are checked by their bytes).

- **requests/s**: wrk (1 thread, 8 connections) on `/v2` HTTP, binary and JSON; h2load (8 connections
  of one stream) on gRPC ModelInfer; 1,024 FLOAT32 elements; 6 rounds of 4 s per target, the two
  servers in ABBA order; the ratio is the median of the rounds' ratios.
- **sequential**: tritonclient.http (binary) and tritonclient.grpc, one request at a time (p50, p99,
  CPU per request by process); vkact's `/v1` and the bare echo beside them.
- **16 MiB**: tritonclient.http with binary data and with system shared memory (tritonclient's shm
  utilities, a region registered with each server), MB/s each way, alternated rounds.
- **targets** (issue 25): `/v2` HTTP binary and gRPC requests/s ≥ 1.5× Triton's; sequential p50 no
  higher than Triton's (HTTP and gRPC); 16 MiB over HTTP ≥ 3× Triton's MB/s, and with shared memory
  ahead of Triton's; `/v1` p50 within 1.2× the bare echo's (PASS or BELOW). Without Triton (no
  network for its first set-up, a start that fails) the section says why and the other parts run.
  MLServer's ratios, measured alike with Python clients, are in the two sections above.

## Where a small request's CPU goes (profile)

`python -m bench.profile [--label before|after]` (`bench/profile.py`; py-spy from the bench extra,
linux-perf and wrk installed from Debian on first use): vkact under wrk (`/v2` HTTP binary) and h2load
(gRPC), 1,024 FLOAT32 elements, 8 connections; each process's CPU per request from `/proc` in a plain
run, divided by library with perf (kernel, interpreter, uvloop, lavapipe, ...) and by stage of the
request with py-spy (each Python stack to the stage of its deepest frame that a rule names). Each
section is named by its label, so the profile before issue 25's changes and the one after stand side
by side, each with its list of the biggest costs. On a loaded machine the microseconds per request
are the robust figures; the requests/s move with the load.

## FLOAT64 accuracy

Where the device has `shaderFloat64`: each operator's FLOAT64 kernel against its formula in mpmath,
rounded once to double (`bench/accuracy.py`, the cases `tests/engine/test_float64.py` asserts):
the worst error in ulp over each case's points, against issue 17's bound of 4 ulp (PASS or ABOVE).
"""

_SECTION = re.compile(r"<!-- (?P<kind>device|service|v2|grpc|types64|accuracy|graphs|triton|profile|gpu): (?P<name>.*?) -->\n.*?<!-- end (?P=kind) -->", re.S)


@dataclass
class OpResult:
    name: str
    kernel: Samples
    copy: Samples                  # the copy runs timed just before this operator's
    end_to_end: Samples
    peers: dict[str, Samples] = field(default_factory=dict)
    traffic: float = 1.0           # bytes this operator moves per copy byte (2-input operators: 1.5)
    vulkan: dict[str, PeerRun] = field(default_factory=dict)   # the Vulkan peers on this operator
    ulp: int | None = None         # vkact's max ulp against the float64 reference (elementwise only)

    @property
    def ratio(self) -> float:
        """Throughput over the copy's: the median over the runs of copy time / kernel time (times the
        traffic ratio), each kernel run against the copy run just before it: drift slower than one pair
        cancels, where a ratio of two minima would mix the quietest moment of one with that of the other."""
        return self.traffic * statistics.median(c / k for c, k in zip(self.copy.seconds, self.kernel.seconds))


@dataclass
class SizeResult:
    log2: int
    nbytes: int                    # read plus written by one operator (or one copy)
    memcpy: Samples
    ops: list[OpResult]

    @property
    def copy(self) -> Samples:
        return Samples([t for op in self.ops for t in op.copy.seconds])


def _gbps(samples: Samples, nbytes: int, with_median: bool = True) -> str:
    best = f"{samples.gbps(nbytes):.2f}"
    return f"{best} ({samples.gbps(nbytes, median=True):.2f})" if with_median else best


def _binary(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(size: SizeResult, peers: list[str]) -> list[str]:
    numpy = "numpy" in peers
    head = ["operator", "kernel GB/s", "kernel / copy", "end-to-end GB/s", *(f"{p} GB/s" for p in peers)]
    head += ["vkact e2e / numpy"] * numpy
    lines = [_row(head), _row(["---"] * len(head))]
    n = size.nbytes
    for op in size.ops:
        m = round(n * op.traffic)
        cells = [f"`{op.name}`", _gbps(op.kernel, m), f"{op.ratio:.2f}", _gbps(op.end_to_end, m, with_median=False)]
        cells += [_gbps(op.peers[p], m, with_median=False) if p in op.peers else "—" for p in peers]
        if numpy:
            cells.append(f"{op.peers['numpy'].best / op.end_to_end.best:.2f}" if "numpy" in op.peers else "—")
        lines.append(_row(cells))
    return lines


def _shared(op: OpResult) -> dict[str, float]:
    """peer -> its time over vkact's (median of the rounds' ratios), for the peers timed on this operator."""
    ratios = {p: run.ratio(op.kernel) for p, run in op.vulkan.items()}
    return {p: r for p, r in ratios.items() if r is not None}


def _vulkan_table(size: SizeResult) -> list[str]:
    """vkact's kernel beside the Vulkan peers' on the operators at least one of them has."""
    head = ["operator", "vkact ms", "vkact ulp"]
    for p in VULKAN_PEERS:
        head += [f"{p} ms", f"{p} / vkact", f"{p} ulp"]
    lines = [_row(head), _row(["---"] * len(head))]
    notes: list[str] = []
    for op in size.ops:
        if not _shared(op):
            continue
        cells = [f"`{op.name}`", _ms(op.kernel.median), "—" if op.ulp is None else str(op.ulp)]
        for p in VULKAN_PEERS:
            run = op.vulkan.get(p)
            if run is None or run.seconds is None:
                cells += ["—"] * 3
                if run is not None and run.why.startswith("failed"):
                    notes.append(f"- `{op.name}` on {p}: {run.why}")
                continue
            ratio = run.ratio(op.kernel)
            cells += [_ms(run.seconds.median), f"**{ratio:.2f}**" if ratio <= 1 else f"{ratio:.2f}", str(run.ulp)]
        lines.append(_row(cells))
    return lines + ([""] + notes if notes else [])


def vulkan_verdict(sizes: list[SizeResult]) -> str:
    """The target's verdict: per operator, vkact faster than every Vulkan peer at every size."""
    shared: dict[str, list[str]] = {}
    for size in sizes:
        for op in size.ops:
            for p, ratio in _shared(op).items():
                slower = shared.setdefault(op.name, [])
                if ratio <= 1:
                    slower.append(f"{p} {ratio:.2f} at 2^{size.log2}")
    if not shared:
        return "no operator shared with a Vulkan peer was measured"
    missed = {name: where for name, where in shared.items() if where}
    met = len(shared) - len(missed)
    if not missed:
        return f"**met** on all {len(shared)} operators shared"
    return (f"met on {met} of {len(shared)} operators shared; **NOT met** on "
            + "; ".join(f"`{name}` ({', '.join(where)})" for name, where in missed.items()))


def section(device_name: str, header: list[tuple[str, str]], sizes: list[SizeResult], peers: list[str], targets: bool = True) -> str:
    """This device's section: header facts, then one table per size and (``targets``: on the device the
    targets were set for) the verdict on the target."""
    lines = [f"<!-- device: {device_name} -->", f"## {device_name}", ""]
    lines += [f"- **{key}:** {value}" for key, value in header]
    for size in sizes:
        each = _binary(size.nbytes // 2)
        lines += ["", f"### 2^{size.log2} FLOAT32 elements ({each} read + {each} written)", ""]
        lines.append(
            f"Copy shader (device ceiling): **{_gbps(size.copy, size.nbytes)}** GB/s · "
            f"host memcpy (`numpy.copyto`, one thread): **{_gbps(size.memcpy, size.nbytes)}** GB/s"
        )
        lines += ["", *_table(size, peers)]
        if any(_shared(op) for op in size.ops):
            lines += ["", f"Vulkan peers on the same device, kernel time (median) at 2^{size.log2}:", "", *_vulkan_table(size)]
    if targets:
        lines += ["", f"**Target** (vkact faster than every Vulkan peer on every operator they share, at every size): "
                      f"{vulkan_verdict(sizes)}."]
    lines += ["", "<!-- end device -->", ""]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"


def _mb(nbytes: int, samples: Samples) -> str:
    return f"{nbytes / samples.best / 1e6:.0f} ({nbytes / samples.median / 1e6:.0f})"


def _cpu(cpu: Cpu) -> str:
    cells = [cpu.per_request(role) for role in ("client", "server", "worker")]
    return " / ".join("—" if c is None else f"{c * 1e6:.0f}" for c in cells)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "BELOW"


SERVICE_LABELS = {
    "socket": "raw socket",
    "echo": "bare echo (uvicorn + raw ASGI)",
    "vkact": "vkact `POST /v1/execute`, binary",
    "client": "vkact via `client.Client`, binary",
    "vkact binary": "vkact `POST /v1/execute`, binary",
    "vkact base64": "vkact `POST /v1/execute`, base64",
    "vkact json": "vkact `POST /v1/execute`, JSON",
    "client binary": "vkact via `client.Client`, binary",
}


def service_section(device_name: str, header: list[tuple[str, str]], r: ServiceResult, targets: bool = True) -> str:
    """This device's service section: header facts, latency, requests/s, 16 MiB throughput, and
    (``targets``) the targets' verdicts."""
    echo_p50 = r.latency["echo"].median
    lines = [f"<!-- service: {device_name} -->", f"## {device_name}: service end to end", ""]
    lines += [f"- **{key}:** {value}" for key, value in header]

    n_small = sum(len(s.seconds) for s in r.latency.values()) // len(r.latency)
    lines += ["", f"### Latency: 1,024 FLOAT32 elements, sequential ({n_small:,} requests per target)", "",
              f"Binary request body {r.small_bytes[0]:,} bytes, response body {r.small_bytes[1]:,} bytes "
              "(the raw socket sends the request's bytes and gets them back).", ""]
    head = ["target", "p50 ms", "p99 ms", "mean ms", "p50 / echo p50", "CPU µs per request: client / server / device worker"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key, samples in r.latency.items():
        ratio = f"{samples.median / echo_p50:.2f}"
        lines.append(_row([SERVICE_LABELS[key], _ms(samples.median), _ms(samples.percentile(99)),
                           _ms(statistics.fmean(samples.seconds)), f"**{ratio}**" if key == "vkact" else ratio,
                           _cpu(r.cpu[key])]))

    echo_rate = r.rates["echo"].per_second
    requests = r.rates["echo"].requests
    lines += ["", f"### Requests per second: 8 concurrent clients, 1,024 elements ({requests:,} requests per target)", ""]
    head = ["target", "requests/s", "p50 ms", "p99 ms", "vs echo"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key, rate in r.rates.items():
        lines.append(_row([SERVICE_LABELS[key], f"{rate.per_second:.0f}", _ms(rate.latency.median),
                           _ms(rate.latency.percentile(99)), f"{rate.per_second / echo_rate:.2f}"]))

    lines += ["", "### 16 MiB: 2^22 FLOAT32 elements in and out", ""]
    head = ["target", "timed requests", "request / response body", "tensor MB/s", "wire MB/s", "vs echo"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key, samples in r.large.items():
        body_in, body_out = r.large_bytes[key]
        ratio = f"{r.vs_echo(key):.2f}"
        lines.append(_row([
            SERVICE_LABELS[key], str(len(samples.seconds)),
            f"{body_in / 2**20:.2f} / {body_out / 2**20:.2f} MiB",
            "—" if key in ("socket", "echo") else _mb(r.tensor_bytes, samples),
            _mb(body_in + body_out, samples),
            f"**{ratio}**" if key == "vkact binary" else ratio,
        ]))

    if r.liveness:
        lines += ["", "### Liveness under load: `GET /health/live`, one probe at a time", "",
                  "While idle, while one 64 MiB request is read, computed and answered, while gzip bombs "
                  "and JSON texts of millions of values arrive eight at a time, and while 32 gzip bombs of 1 MB "
                  "(1 GiB inflated) arrive at once (bench/liveness.py); a Kubernetes "
                  "probe's default timeout is 1 s.", ""]
        head = ["condition", "probes", "p50 ms", "p99 ms", "max ms"]
        lines += [_row(head), _row(["---"] * len(head))]
        for condition, samples in r.liveness.items():
            lines.append(_row([condition, str(len(samples.seconds)), _ms(samples.median), _ms(samples.percentile(99)),
                               _ms(max(samples.seconds))]))

    throughput, latency = r.vs_echo("vkact binary"), r.small_ratio
    lines += [] if not targets else ["", "**Targets:**", "",
              f"- 16 MiB binary requests at ≥ {TARGET_THROUGHPUT:.2f} of the bare echo's throughput: "
              f"{throughput:.2f} → **{_verdict(throughput >= TARGET_THROUGHPUT)}**",
              f"- 1,024-element requests with p50 ≤ {TARGET_LATENCY:g}× the bare echo's: "
              f"{latency:.2f}× ({_ms(r.latency['vkact'].median)} ms against {_ms(echo_p50)} ms) → "
              f"**{_verdict(latency <= TARGET_LATENCY)}**"]
    lines += ["", "<!-- end service -->", ""]
    return "\n".join(lines)


def merge(existing: str, device_name: str, new_section: str, kind: str = "device") -> str:
    """``existing`` with this (kind, device)'s new section: in its old place if it had one, else next to the
    device's other sections (before them for the kernels; otherwise after them and the text written after
    them, before the next device's), else last. Everything else
    stays as it is, byte for byte: the preamble and the analyses written by hand between and after sections
    (a run used to rebuild the file from PREAMBLE and the sections alone, and lost them). A new file starts
    with PREAMBLE."""
    section = new_section.rstrip("\n")
    if not existing.strip():
        return PREAMBLE + "\n" + section + "\n"
    matches = list(_SECTION.finditer(existing))
    for m in matches:
        if (m["kind"], m["name"]) == (kind, device_name):
            return existing[:m.start()] + section + existing[m.end():]
    same = [m for m in matches if m["name"] == device_name]
    if same and kind == "device":
        return existing[:same[0].start()] + section + "\n\n" + existing[same[0].start():]
    after = [m for m in matches if same and m.start() > same[-1].end()]
    if after:  # past the device's last section and what was written after it, before the next device's
        return existing[:after[0].start()] + section + "\n\n" + existing[after[0].start():]
    return existing.rstrip("\n") + "\n\n" + section + "\n"
