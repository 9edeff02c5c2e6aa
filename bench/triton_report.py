"""The Markdown section of ``python -m bench --only triton`` (bench/triton.py's figures)."""
from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from datetime import datetime, timezone

from . import triton as tr
from . import triton_server as ts


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**PASS**" if ok else "**BELOW**")


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _tool_version(name: str, flag: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        return f"{name} not installed"
    done = subprocess.run([exe, flag], capture_output=True, text=True, timeout=10)
    first = (done.stdout or done.stderr).strip().split()
    return " ".join(first[:2]) if first else name   # "wrk debian/4.1.0-3+b2", "h2load nghttp2/1.52.0"


def header(r: tr.TritonResult, machine: str) -> list[tuple[str, str]]:
    d = r.device
    if r.env is None:
        triton = f"not available: {r.reason}"
    else:
        made = "cached" if r.env.install_seconds is None else f"created by this run in {r.env.install_seconds:.0f} s"
        triton = (f"tritonserver {r.env.version} from PyPI's nvidia-pytriton {ts.PYTRITON_VERSION} (environment "
                  f"`{r.env.venv}`, {made}); Python backend, the stub of this Python beside libtriton_python.so; "
                  f"model: `model.py` doing SHRINK in numpy (FLOAT32, Bias {ts.BIAS}, Threshold {ts.THRESHOLD}), one CPU "
                  f"instance, max_batch_size 0; its defaults otherwise (metrics off)")
    return [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{machine}; 1-minute load average {r.loadavg[0]:.1f} at the start, {r.loadavg[1]:.1f} at the end"),
        ("Device", f"{d['name']}; driver {d['driver']['name']} {d['driver']['info']}; tensors in {d['memory']} memory"),
        ("vkact", f"`python -m service` (its defaults), model `shrink` sent Bias {ts.BIAS} and Threshold {ts.THRESHOLD} "
                  "as request parameters; the bare echo (bench/echo.py) beside it for `/v1`"),
        ("Triton", triton),
        ("Load", f"{_tool_version('wrk', '-v')}, 1 thread, {tr.CONNECTIONS} connections; {_tool_version('h2load', '--version')}, "
                 f"{tr.CONNECTIONS} connections of one stream; {tr.LOAD_ROUNDS} rounds of {tr.LOAD_SECONDS:g} s per target, "
                 "the targets alternated (ABBA); req/s: all rounds' requests over their time"),
        ("CPUs", f"{os.cpu_count()}, shared by the load generator, both servers, vkact's device worker and Triton's stub"),
        ("Runtime", f"{r.seconds:.1f} s"),
    ]


LOAD_LABELS = {"http binary": "`/v2` HTTP, binary (wrk)", "http json": "`/v2` HTTP, JSON (wrk)",
               "grpc": "gRPC ModelInfer, raw contents (h2load)"}
LATENCY_LABELS = {"http": "`/v2` HTTP binary, tritonclient.http", "grpc": "gRPC, tritonclient.grpc"}
LARGE_LABELS = {"binary": "`/v2` HTTP binary, tritonclient.http", "raw": "`/v2` HTTP binary, the same request from a raw socket (no client wall)", "shm": "`/v2` HTTP, system shared memory (input and output)"}


def section(device_name: str, header_rows: list[tuple[str, str]], r: tr.TritonResult, targets: bool = True) -> str:
    lines = [f"<!-- triton: {device_name} -->", f"## {device_name}: vkact beside Triton Inference Server", ""]
    lines += [f"- **{k}:** {v}" for k, v in header_rows]
    if r.env is None:
        lines += ["", f"**Triton not available: {r.reason}** (its columns and the targets are missing)."]

    lines += ["", f"### 1,024 FLOAT32 elements, {tr.CONNECTIONS} connections: requests/s", ""]
    head = ["load", "vkact req/s", "Triton req/s", "vkact / Triton (median of the rounds' ratios)",
            "p50 / p99 ms under load (wrk, median of rounds): vkact", "Triton",
            "CPU µs per request under load, server / worker: vkact", "Triton (worker: its stub)"]
    lines += [_row(head), _row(["---"] * len(head))]
    for kind, label in LOAD_LABELS.items():
        if kind in r.load_reason:
            lines.append(_row([label, f"not measured: {r.load_reason[kind]}", *[""] * (len(head) - 2)]))
            continue
        v, t = r.load.get(f"vkact {kind}"), r.load.get(f"triton {kind}")

        def under(load: tr.Load | None) -> str:
            return "—" if load is None or not load.p50 else f"{_ms(statistics.median(load.p50))} / {_ms(statistics.median(load.p99))}"

        def cpu(load: tr.Load | None) -> str:
            return "—" if load is None else " / ".join(
                "—" if us is None else f"{us:.0f}" for us in (load.cpu_us("server"), load.cpu_us("worker")))
        lines.append(_row([label, "—" if v is None else f"{v.per_second:,.0f}", "—" if t is None else f"{t.per_second:,.0f}",
                           _ratio(r.ratio(kind)), under(v), under(t), cpu(v), cpu(t)]))

    lines += ["", "### 1,024 FLOAT32 elements, one request at a time", ""]
    head = ["client", "p50 ms", "p99 ms", "CPU µs per request: client / server / worker (Triton: its stub)", "p50 vs Triton"]
    lines += [_row(head), _row(["---"] * len(head))]
    for key, s in r.latency.items():
        server, kind = key.split(" ", 1)
        who = {"vkact": "vkact", "triton": "Triton", "echo": "bare echo"}[server]
        label = f"{who} {LATENCY_LABELS[kind]}" if kind in LATENCY_LABELS else f"{who}: `/v1/execute` binary frames, httpx"
        cpu = " / ".join("—" if c is None else f"{c * 1e6:.0f}"
                         for c in (r.cpu[key].per_request(role) for role in ("client", "server", "worker")))
        vs = _ratio(r.p50_ratio(kind)) if server == "vkact" and kind in LATENCY_LABELS else "—"
        lines.append(_row([label, _ms(s.median), _ms(s.percentile(99)), cpu, vs]))

    lines += ["", f"### 16 MiB: 2^22 FLOAT32 elements in and out, {tr.LARGE_REPEAT} alternated rounds", ""]
    head = ["path", "vkact MB/s each way", "Triton MB/s each way", "vkact / Triton (median of adjacent pairs)"]
    lines += [_row(head), _row(["---"] * len(head))]
    each = r.tensor_bytes / 2
    for kind, label in LARGE_LABELS.items():
        v, t = r.large.get(f"vkact {kind}"), r.large.get(f"triton {kind}")
        lines.append(_row([label, "—" if v is None else f"{each / v.median / 1e6:.0f}",
                           "—" if t is None else f"{each / t.median / 1e6:.0f}", _ratio(r.large_ratio(kind))]))
    ceiling = r.large.get("ceiling binary")
    ceiling_ratio = r.large_ratio("binary", "ceiling")
    if ceiling is not None:
        vkact = r.large.get("vkact binary")
        share = "" if vkact is None else f"; vkact's tritonclient.http figure is {ceiling.median / vkact.median:.0%} of it"
        lines += ["", f"tritonclient.http's own ceiling: {each / ceiling.median / 1e6:.0f} MB/s each way against bench.canned, "
                  f"a server that replays vkact's checked answer from memory ({_ratio(ceiling_ratio)} Triton's){share}. "
                  "No server passes it with that client"
                  + (f", so {tr.TARGET_LARGE:g}× Triton with tritonclient.http is out of any server's reach on this machine."
                     if ceiling_ratio is not None and ceiling_ratio < tr.TARGET_LARGE else ".")]
    triton_large = r.large.get("triton binary")
    if ceiling is not None and triton_large is not None and r.large_device_s is not None:
        allowed = triton_large.median / tr.TARGET_LARGE  # seconds a request at the target
        lines += ["", f"At {tr.TARGET_LARGE:g}× Triton's MB/s a tritonclient.http request takes {allowed * 1e3:.1f} ms; "
                  f"the client alone (the ceiling) takes {ceiling.median * 1e3:.1f} ms of it, which leaves a server "
                  f"{(allowed - ceiling.median) * 1e3:.1f} ms a request. vkact's device time alone (the statistics "
                  f"extension's compute_infer: the kernel's dispatch and its wait, nothing copied) was "
                  f"{r.large_device_s * 1e3:.1f} ms a 16 MiB request in these rounds."]
    if r.client_faults:
        named = {"vkact binary": "vkact", "triton binary": "Triton", "ceiling binary": "the ceiling"}
        counts = ", ".join(f"{named.get(key, key)} {count:,.0f}" for key, count in r.client_faults.items())
        lines += ["", f"The client process's minor page faults per tritonclient.http request: {counts}. About 12,300 means "
                  "its three 16 MiB buffers (the request body, the answer read, its copy in `as_numpy`) were mapped fresh "
                  "each request, near 0 that glibc's heap kept them: which of the two a run gets is the allocator's doing, "
                  "not the server's, and it moves the client's own time per request by 15-25 ms, the ceiling with it."]

    if targets:
        def at_least(value: float | None, bound: float) -> bool | None:
            return None if value is None else value >= bound

        def at_most(value: float | None, bound: float) -> bool | None:
            return None if value is None else value <= bound

        p50_http, p50_grpc = r.p50_ratio("http"), r.p50_ratio("grpc")
        lines += ["", "**Targets** (issue 25, vkact against Triton in this run):", "",
                  f"- `/v2` HTTP binary requests/s ≥ {tr.TARGET_RATE:g}× Triton's: {_ratio(r.ratio('http binary'))} → "
                  f"{_verdict(at_least(r.ratio('http binary'), tr.TARGET_RATE))}",
                  f"- gRPC requests/s ≥ {tr.TARGET_RATE:g}× Triton's: {_ratio(r.ratio('grpc'))} → "
                  f"{_verdict(at_least(r.ratio('grpc'), tr.TARGET_RATE))}",
                  f"- sequential p50 no higher than Triton's: HTTP {_ratio(p50_http)} → {_verdict(at_most(p50_http, 1.0))}, "
                  f"gRPC {_ratio(p50_grpc)} → {_verdict(at_most(p50_grpc, 1.0))}",
                  f"- 16 MiB over HTTP ≥ {tr.TARGET_LARGE:g}× Triton's MB/s: tritonclient.http {_ratio(r.large_ratio('binary'))} → "
                  f"{_verdict(at_least(r.large_ratio('binary'), tr.TARGET_LARGE))} (the client's own ceiling: {_ratio(ceiling_ratio)}); "
                  f"raw socket {_ratio(r.large_ratio('raw'))} → {_verdict(at_least(r.large_ratio('raw'), tr.TARGET_LARGE))}",
                  f"- 16 MiB with system shared memory ahead of Triton's: {_ratio(r.large_ratio('shm'))} → "
                  f"{_verdict(at_least(r.large_ratio('shm'), 1.0))}",
                  f"- `/v1` p50 within {tr.TARGET_V1_ECHO:g}× the bare echo's: {_ratio(r.v1_echo)} → "
                  f"{_verdict(at_most(r.v1_echo, tr.TARGET_V1_ECHO))}"]
    lines += ["", "<!-- end triton -->", ""]
    return "\n".join(lines)
