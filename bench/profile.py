"""Where one small request spends vkact's CPU under load: ``python -m bench.profile [--label before]``.

vkact (``python -m service``, its defaults) is put under the load of bench/triton.py (1,024 FLOAT32
elements, 8 connections: wrk on ``/v2`` HTTP binary, h2load on gRPC ModelInfer), three times per
protocol, each run of the same length:

1. **plain**: no profiler; each process's CPU time per request, by thread (``/proc/PID/task``), and the
   requests/s. These are the microseconds the other two runs divide up.
2. **perf** (Debian's linux-perf) on both processes, without call graphs (they cost more than the
   request): every sample by thread and by the library it fell in (the interpreter, the kernel, uvloop,
   httptools, kp, lavapipe and its JIT code, libnghttp2, ...); shares times each process's CPU. A thread
   with a tenth of its samples in the interpreter is a Python thread; the others are native (lavapipe's).
3. **py-spy** (PyPI, the bench extra) on the HTTP process and the device worker: every sampled Python
   stack goes to one stage, the stage of its deepest frame that a rule of ``HTTP_STAGES`` or
   ``WORKER_STAGES`` names (a frame's native callees, socket syscalls included, count with it). The
   stages' shares of a process's samples times the CPU of its Python threads are its microseconds per
   request by stage.

The section goes to bench/RESULTS.md (kind ``profile``, the label in its name: a ``before`` and an
``after`` profile stand side by side), and is printed."""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from . import h2load_grpc as h2
from . import service as svc
from . import tools
from . import triton as tr
from . import wrk

SAMPLE_HZ = 250          # py-spy (each sample stops the process for a few µs) and perf
TOP_STAGES = 12

EVENT_LOOP = "event loop: epoll, socket reads, task steps (uvloop, self time)"
# (stage, pattern over one py-spy frame, "function (file:line)"), per process; the first rule that
# matches the deepest matching frame wins.
HTTP_STAGES: list[tuple[str, str]] = [
    # uvicorn's send, or the whole frame written straight to the transport (send_whole, hoth's branch)
    ("answer: headers and socket write (uvicorn send, uvloop)",
     r"RequestResponseCycle\.send \(uvicorn|send_whole \(api/execution|FrameResponse"),
    ("answer: response object (starlette)", r"starlette/responses\.py"),
    ("answer: output frame (outputs, codec)", r"api/v2/outputs\.py|client/codec\.py|binary_frame \(api/execution"),
    ("gRPC: transport (h2grpc C + its Python)", r"api/grpc/transport\.py|h2grpc"),
    ("gRPC: message parse, ModelInfer to /v2 request", r"api/grpc/(infer|server|messages)\.py|google/protobuf"),
    ("hand-off: the job to the worker (worker.py submit, framing write, slots)",
     r"(write|send|encode\w*) \(framing\.py|(_submit|_send|_dispatch) \(worker\.py|slots\.py"),
    ("hand-off: the worker's answer back (worker_replies.py, framing read)",
     r"DeviceWorker\.run \(worker\.py|\(worker_(replies|lifecycle)\.py|framing\.py"),
    ("data plane: execute, run_on_device, the wait for the answer",
     r"dataplane/execution\.py|run_on_device \(api/execution|asyncio/locks\.py|\(worker\.py"),
    ("header JSON (header cache, json_text, orjson)", r"header_cache\.py|json_text\.py|orjson|json/"),
    ("decode and validation (codec, descriptors, operators, pydantic)", r"api/v2/codec\.py|descriptors/|operators/|pydantic|client/buffers\.py"),
    ("body read and budget (execution, inflight)", r"api/execution\.py|inflight\.py"),
    ("route handler (/v2 infer, models, runtime)", r"^(?!RequestIdMiddleware).*api/v2/routes\.py|_Parsed|dataplane/models\.py|api/runtime\.py|api/v2/encoding\.py|api/v2/shm\.py"),
    ("routing and middleware (hot routes, request id, proxy headers)", r"hot_routes\.py|RequestIdMiddleware|proxy_headers\.py|uuid\.py|starlette/"),
    ("HTTP parse and ASGI cycle (httptools or h1http, uvicorn, http_guard)", r"uvicorn/protocols|http_guard\.py|http_native\.py"),
    # the loop's own C (uvloop: epoll, socket reads, callbacks, task steps) below any Python frame
    (EVENT_LOOP, r"Runner\.run \(asyncio"),
]
LEAF_ONLY = {EVENT_LOOP}   # stages of a frame's own time only: every stack has the loop at its root
WORKER_STAGES: list[tuple[str, str]] = [
    ("dispatch: inputs in, submit, fence, output out (kp, lavapipe)", r"_Plan\.(run|_dispatch) \(engine_plan\.py"),
    ("engine: plan and cache look-up, checks", r"engine(_plan|_direct|_graph)?\.py|dispatch_geometry\.py|layout\.py|buckets\.py|operators/|descriptors/"),
    ("answer: socket write (framing)", r"(write|send|encode\w*) \(framing\.py"),
    ("receive: socket read and decode (framing)", r"framing\.py"),
    ("job handling and batching (worker_process, worker_engines)", r"worker_(process|engines)\.py"),
]

# perf: a sample's library -> category
LIBRARIES: list[tuple[str, str]] = [
    ("Python interpreter", r"libpython|/python3[.\d]*$"),
    ("kernel (syscalls, TCP loopback, scheduling)", r"kernel|vmlinux|\[vdso\]"),
    ("uvloop / asyncio (C)", r"uvloop|loop\.cpython|_asyncio"),
    ("httptools (llhttp)", r"httptools|parser\.cpython|url_parser"),
    ("vkact native (h2grpc, h1http) and libnghttp2", r"h2grpc|h1http|_native|nghttp2"),
    ("protobuf / grpc", r"protobuf|_message|cygrpc|upb"),
    ("numpy", r"numpy|_multiarray"),
    ("orjson / pydantic-core", r"orjson|pydantic_core"),
    ("pickle", r"_pickle"),
    ("kp (Kompute)", r"kp\.cpython|libkompute"),
    ("lavapipe and its JIT code", r"lvp|LLVM|\[JIT\]|perf-\d+\.map|libvulkan|gallium|mesa"),
    ("libc (memcpy, malloc, locks)", r"libc\.so|libm\.so|ld-linux|libstdc"),
]


@dataclass
class ProcessProfile:
    name: str
    cpu_us: float                                   # per request, whole process (plain run)
    threads: dict[str, float]                       # per request: main, other Python, native threads
    python_us: float                                # the CPU of the threads py-spy sees
    stages: dict[str, float] = field(default_factory=dict)      # µs per request by stage (py-spy)
    libraries: dict[str, float] = field(default_factory=dict)   # µs per request by library (perf)
    samples: int = 0
    top_frames: list[tuple[str, float]] = field(default_factory=list)   # self time by frame, µs per request
    top_symbols: list[tuple[str, float]] = field(default_factory=list)  # perf, µs per request
    tids: dict[int, float] = field(default_factory=dict)                # CPU µs per request by thread id


@dataclass
class Protocol:
    name: str
    rate: float                                     # requests/s, plain run
    rate_profiled: dict[str, float]                 # with py-spy, with perf
    processes: list[ProcessProfile]


def _threads(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (thread name, CPU seconds)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _stage(frames: list[str], rules: list[tuple[str, re.Pattern[str]]]) -> str:
    for depth, frame in enumerate(reversed(frames)):
        for stage, pattern in rules:
            if (depth == 0 or stage not in LEAF_ONLY) and pattern.search(frame):
                return stage
    return "other"


def _pyspy(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        raise tools.Missing("py-spy not installed (the bench extra: pip install -e '.[bench]')")
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", str(SAMPLE_HZ),
                             "--format", "raw", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _read_pyspy(path: Path, rules: list[tuple[str, str]]) -> tuple[collections.Counter, collections.Counter, int]:
    compiled = [(stage, re.compile(p)) for stage, p in rules]
    stages: collections.Counter = collections.Counter()
    leaves: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        stages[_stage(frames, compiled)] += n
        leaves[re.sub(r":\d+\)$", ")", frames[-1])] += n
        total += n
    return stages, leaves, total


def _read_perf(data: Path) -> list[tuple[int, str, str]]:
    """(tid, symbol, library) per sample."""
    done = subprocess.run(["perf", "script", "-i", str(data), "-F", "tid,ip,sym,dso"], capture_output=True, text=True, timeout=300)
    samples = []
    for line in done.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+[0-9a-f]+\s+(.*?)\s*\((.*)\)\s*$", line)
        if m:
            samples.append((int(m.group(1)), m.group(2) or "?", m.group(3)))
    return samples


def _library(dso: str) -> str:
    for category, pattern in LIBRARIES:
        if re.search(pattern, dso):
            return category
    return f"other ({Path(dso).name or dso})"


def profile(name: str, load: Callable[[float], object], pids: dict[str, int], seconds: float,
            log: Callable[[str], None], keep: Path | None = None) -> Protocol:
    """The three runs of one protocol: ``load(seconds)`` returns a WrkRun or an H2Run."""
    load(2.0)  # warm: the replay templates, the connections' first requests
    before = {role: _threads(pid) for role, pid in pids.items()}
    plain = load(seconds)
    after = {role: _threads(pid) for role, pid in pids.items()}
    requests = plain.requests
    processes: dict[str, ProcessProfile] = {}
    for role, pid in pids.items():
        tids = {tid: (cpu - before[role].get(tid, (tname, 0.0))[1]) / requests * 1e6
                for tid, (tname, cpu) in after[role].items()}
        processes[role] = ProcessProfile(role, sum(tids.values()), {}, 0.0, tids=tids)
    log(f"profile: {name}: {plain.per_second:.0f} req/s; CPU µs per request: "
        + ", ".join(f"{p.name} {p.cpu_us:.0f}" for p in processes.values()))

    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vkact-profile-") as tmp:
        # perf first: its samples tell the Python threads (the interpreter's) from the native ones
        # (lavapipe's), whose CPU py-spy cannot see
        data = Path(tmp) / "perf.data"
        perf = subprocess.Popen(["perf", "record", "-F", str(SAMPLE_HZ), "-o", str(data), "-p", ",".join(map(str, pids.values())),
                                 "--", "sleep", str(seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        rates["perf"] = load(seconds - 1).per_second
        _, err = perf.communicate(timeout=120)
        tid_role = {tid: role for role, pid in pids.items() for tid in _threads(pid)}
        libraries = {role: collections.Counter() for role in pids}
        symbols = {role: collections.Counter() for role in pids}
        interpreter: collections.Counter = collections.Counter()
        per_tid: collections.Counter = collections.Counter()
        for tid, sym, dso in _read_perf(data):
            role = tid_role.get(tid)
            if role is None:
                continue
            lib = _library(dso)
            libraries[role][lib] += 1
            symbols[role][f"{sym} ({Path(dso).name})"] += 1
            per_tid[tid] += 1
            interpreter[tid] += lib == "Python interpreter"
        if not per_tid:
            raise RuntimeError(f"perf recorded no samples: {err.strip()[-300:]}")
        for role, p in processes.items():
            total = sum(libraries[role].values())
            if total:
                p.libraries = {k: v / total * p.cpu_us for k, v in libraries[role].most_common()}
                p.top_symbols = [(k, v / total * p.cpu_us) for k, v in symbols[role].most_common(8)]
            # a Python thread: a tenth or more of its samples in the interpreter, or the main thread
            python = {tid for tid in p.tids if tid == pids[role] or (per_tid[tid] and interpreter[tid] / per_tid[tid] >= 0.1)}
            p.python_us = sum(p.tids[tid] for tid in python)
            p.threads = {"main thread": p.tids.get(pids[role], 0.0),
                         "other Python threads": sum(us for tid, us in p.tids.items() if tid in python and tid != pids[role]),
                         "native threads": sum(us for tid, us in p.tids.items() if tid not in python)}

        spies = {role: _pyspy(pid, seconds, Path(tmp) / f"{role}.txt") for role, pid in pids.items()}
        time.sleep(0.5)   # py-spy attached
        rates["py-spy"] = load(seconds - 1).per_second
        for role, spy in spies.items():
            _, err = spy.communicate(timeout=60)
            path = Path(tmp) / f"{role}.txt"
            if not path.exists():
                raise RuntimeError(f"py-spy wrote nothing for the {role} process: {err.strip()[-300:]}")
            if keep is not None:
                shutil.copy(path, keep / f"{name.split()[0].strip('/')}-{role.replace(' ', '-')}.pyspy.txt")
            p = processes[role]
            counts, leaves, total = _read_pyspy(path, HTTP_STAGES if role == "HTTP process" else WORKER_STAGES)
            p.samples = total
            p.stages = {k: v / total * p.python_us for k, v in counts.most_common()}
            p.top_frames = [(k, v / total * p.python_us) for k, v in leaves.most_common(8)]
    return Protocol(name, plain.per_second, rates, list(processes.values()))


def run(seconds: float, log: Callable[[str], None] = print, keep: Path | None = None) -> tuple[dict, list[Protocol], tuple[float, float]]:
    import httpx

    tools.ensure("wrk", "perf")
    loadavg = os.getloadavg()[0]
    x = np.random.default_rng(2025).standard_normal(svc.SMALL, dtype=np.float32)
    with svc.servers() as (vkact, _echo):
        device = httpx.get(vkact.url + "/v1/device", timeout=30).json()
        pids = {"HTTP process": vkact.process.pid, "device worker": svc.device_worker(vkact.process.pid)}
        if pids["device worker"] is None:
            raise RuntimeError("vkact's device worker process not found")
        call = tr.HttpCaller(vkact.url, x)
        try:
            body, headers = call.request()
        finally:
            call.close()
        answer = tr.answer_of(vkact.url, body, headers, x)
        url = f"{vkact.url}/v2/models/{tr.MODEL}/infer"
        raw, grpc_answer = tr.GrpcCaller(vkact.grpc, x).wire()
        protocols = [
            profile("/v2 HTTP binary (wrk, 1 thread, 8 connections)",
                    lambda s: wrk.run(url, body, headers, answer, tr.CONNECTIONS, s), pids, seconds, log, keep),
            profile("gRPC ModelInfer (h2load, 8 connections)",
                    lambda s: h2.run(vkact.grpc, raw, len(grpc_answer), tr.CONNECTIONS, s), pids, seconds, log, keep),
        ]
    return device, protocols, (loadavg, os.getloadavg()[0])


# -- the report --------------------------------------------------------------------------------------


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


# stages of the crossing between the HTTP process and the device worker, in either process
CROSSING = ("hand-off", "data plane", "receive", "answer: socket write")


def _biggest(proto: Protocol) -> list[str]:
    """The list of the biggest costs: the stages and the native threads by microseconds per request, and
    the crossing of the process boundary summed over both processes."""
    costs = [(us, f"{p.name}: {stage}") for p in proto.processes for stage, us in p.stages.items()]
    costs += [(p.threads.get("native threads", 0.0), f"{p.name}: native threads (lavapipe's, their wake-ups included)")
              for p in proto.processes]
    total = sum(p.cpu_us for p in proto.processes)
    crossing = sum(us for p in proto.processes for stage, us in p.stages.items() if stage.startswith(CROSSING))
    interpreter = sum(p.libraries.get("Python interpreter", 0.0) for p in proto.processes)
    kernel = sum(us for p in proto.processes for lib, us in p.libraries.items() if lib.startswith("kernel"))
    lines = [f"Biggest costs, of {total:.0f} µs of CPU per request in both processes:", ""]
    lines += [f"{i}. {what}: {us:.0f} µs" for i, (us, what) in enumerate(sorted(costs, reverse=True)[:6], 1)]
    lines += [f"- crossing between the processes (the job out, the answer back, both sides' socket work and "
              f"waits): {crossing:.0f} µs; the Python interpreter (perf): {interpreter:.0f} µs; the kernel: {kernel:.0f} µs", ""]
    return lines


def section(device_name: str, label: str, device: dict, protocols: list[Protocol], loadavg: tuple[float, float],
            seconds: float, machine: str) -> str:
    name = f"{device_name} ({label})"
    lines = [f"<!-- profile: {name} -->", f"## {device_name}: where a small request's CPU goes ({label})", "",
             f"- **Date (UTC):** {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M')}",
             f"- **Machine:** {machine}; 1-minute load average {loadavg[0]:.1f} at the start, {loadavg[1]:.1f} at the end",
             f"- **Device:** {device['name']}; driver {device['driver']['name']} {device['driver']['info']}",
             f"- **Runs:** per protocol, {seconds:g} s plain (CPU per request from /proc), then {seconds - 1:g} s under "
             f"perf ({SAMPLE_HZ} Hz, samples by library), then {seconds - 1:g} s under py-spy ({SAMPLE_HZ} Hz, Python "
             "stacks by stage, scaled to the Python threads' CPU); 1,024 FLOAT32 elements, `shrink` (Bias 0.5, Threshold 0.5); `python -m bench.profile`"]
    for proto in protocols:
        rates = ", ".join(f"{k} {v:,.0f}" for k, v in proto.rate_profiled.items())
        lines += ["", f"### {proto.name}: {proto.rate:,.0f} requests/s unprofiled (profiled: {rates})", ""]
        lines += _biggest(proto)
        for p in proto.processes:
            threads = ", ".join(f"{k} {v:.0f}" for k, v in sorted(p.threads.items(), key=lambda kv: -kv[1]) if v >= 0.5)
            lines += [f"**{p.name}: {p.cpu_us:.0f} µs of CPU per request** (by thread: {threads}; py-spy sees "
                      f"{p.python_us:.0f} of them, {p.samples:,} samples)", ""]
            lines += [_row(["stage (py-spy)", "µs / request", "share"]), _row(["---", "---:", "---:"])]
            for stage, us in list(p.stages.items())[:TOP_STAGES]:
                lines.append(_row([stage, f"{us:.0f}", f"{us / p.python_us:.0%}" if p.python_us else "—"]))
            lines += ["", _row(["library (perf)", "µs / request", "share"]), _row(["---", "---:", "---:"])]
            for lib, us in p.libraries.items():
                if us >= 0.5:
                    lines.append(_row([lib, f"{us:.0f}", f"{us / p.cpu_us:.0%}"]))
            lines += ["", "Deepest Python frames (self time, µs per request): "
                      + "; ".join(f"`{k}` {v:.0f}" for k, v in p.top_frames), "",
                      "Hottest native symbols (perf, µs per request): "
                      + "; ".join(f"`{k}` {v:.0f}" for k, v in p.top_symbols), ""]
    lines += ["<!-- end profile -->", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from .__main__ import _machine, _write

    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="before", help="names the section, e.g. before or after (default before)")
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each run (default 12)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "RESULTS.md")
    parser.add_argument("--keep", type=Path, default=None, help="a folder to keep py-spy's raw stacks in (flamegraph.pl input)")
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    device, protocols, loadavg = run(args.seconds, keep=args.keep)
    name = device["name"]
    _write(args.out, f"{name} ({args.label})",
           section(name, args.label, device, protocols, loadavg, args.seconds, _machine()), "profile")


if __name__ == "__main__":
    main()
