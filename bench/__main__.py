"""``python -m bench [--only kernels|service|v2|grpc|types64|accuracy|graphs|triton|gpu] [--driver swiftshader] [--sizes 20,24] [--repeat N] [--ops shrink,celu] [--out PATH]``"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from service.engine import Engine

from . import vulkan_peers
from .kernels import cases, VkBench, make_op, operators
from .peers import PEERS, Compute, host_memcpy
from .report import OpResult, SizeResult, merge, section, service_section
from .timing import Samples, blocks, rounds

WARMUP = 2


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Kernel and end-to-end throughput of every operator against the device's copy ceiling, "
        "a host memcpy and CPU peers; then the HTTP service end to end (latency, requests/s, 16 MiB "
        "throughput) against a bare uvicorn echo and a raw loopback socket; then /v2 with tritonclient against "
        "MLServer and the echo; writes a Markdown report.")
    parser.add_argument("--only", choices=tuple(PARTS), default=None,
                        help="run one part only (default: kernels, then service, then v2, then grpc, then types64: the 64-bit "
                        "kernels, then accuracy: FLOAT64's ulp against mpmath, then graphs, then triton: vkact beside Triton Inference Server; "
                        "gpu, only when asked: the kernels beside PyTorch CUDA, scripts/gpu-run.sh)")
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in _csv(s)], default=[20, 24], help="kernels: log2 element counts (default 20,24)")
    parser.add_argument("--repeat", type=int, default=10, help=f"kernels: timed runs of each measurement, after {WARMUP} warm-up runs")
    parser.add_argument("--ops", type=_csv, default=None, help="kernels: operators by short name, e.g. shrink,celu (default: all)")
    parser.add_argument("--driver", choices=sorted(DRIVERS), default=None,
                        help="the Vulkan driver to measure, by its ICD (default: what the loader finds; the section is "
                        "the device's own, and targets are judged only on llvmpipe, where they were set)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "RESULTS.md",
                        help="report to write; the sections of other devices, and of a part not run, are kept (default bench/RESULTS.md)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.driver:
        icd = DRIVERS[args.driver]()
        if icd is None:
            parser.error(f"no {args.driver} ICD installed")
        # Read by the loader when this process (and the service's, which inherit it) creates an instance.
        os.environ["VK_ICD_FILENAMES"] = os.environ["VK_DRIVER_FILES"] = icd
    return args


def _icd(pattern: str) -> str | None:
    found = sorted(Path("/").glob(pattern.lstrip("/")))
    return str(found[0]) if found else None


DRIVERS = {
    "lavapipe": lambda: _icd("/usr/share/vulkan/icd.d/lvp_icd.*.json"),
    "swiftshader": lambda: _icd("/usr/lib/chromium/vk_swiftshader_icd.json"),   # Debian's chromium-common
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _check(name: str, peer: str, vkact: np.ndarray, other: object) -> None:
    """vkact's output against a peer's, once per operator and size: a benchmark of a broken kernel
    would be meaningless (accuracy itself is the tests' business, hence the loose tolerance)."""
    got, want = vkact.view(np.float32), np.asarray(other, dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{name}: vkact and {peer} disagree")


def measure(engine: Engine, vk: VkBench, names: list[str], log2: int, peers: list[str], repeat: int,
            vulkan: vulkan_peers.Opened) -> SizeResult:
    n = 1 << log2
    x = np.random.default_rng(log2).standard_normal(n, dtype=np.float32) * np.float32(3)
    bound: dict[tuple[str, str], Compute] = {}
    results: dict[str, OpResult] = {}
    e2e_tasks: list[tuple[tuple[str, str], Compute]] = [(("memcpy", ""), host_memcpy(4 * n))]
    for label, name, row_len in cases(names):
        print(f"kernels: 2^{log2} {label}", file=sys.stderr, flush=True)
        op = make_op(name, n, row_len)
        out = engine.execute(op, [x] * len(op.inputs))  # builds the slot and pipeline that the kernel runs reuse
        for peer in PEERS:
            compute = peer.bind(op, x) if peer.name in peers else None
            if compute is not None:
                _check(label, peer.name, out, compute())
                bound[(peer.name, label)] = compute
        # The Vulkan peers (elementwise operators, one input): bound, checked and timed one operator
        # at a time, so that a 2^24 tensor is held by one operator's peers at once.
        ulp, on_device, runs = None, {}, {}
        if row_len is None and len(op.inputs) == 1:
            reference = op.reference(x)
            ulp = vulkan_peers.max_ulp(out.view(np.float32), reference)
            on_device, runs = vulkan_peers.bind(vulkan, name, op, x, reference)
        # Kernel runs alternate with copy runs and the Vulkan peers' (copy, op, peers, copy, op, ...)
        # so that each ratio compares runs made side by side; end-to-end and CPU peer runs go in
        # blocks (see timing).
        kernels = rounds([(("copy", ""), vk.copy(op)), (("kernel", ""), vk.kernel(op)), *vulkan_peers.tasks(on_device)], WARMUP, repeat)
        runs = vulkan_peers.collect(on_device, runs, kernels)
        del on_device
        results[label] = OpResult(label, kernels[("kernel", "")], kernels[("copy", "")], Samples(), {},
                                  (len(op.inputs) + 1) / 2, vulkan=runs, ulp=ulp)
        e2e_tasks.append((("vkact", label), vk.end_to_end(op, x)))
        e2e_tasks += [(key, bound[key]) for key in ((p, label) for p in peers) if key in bound]
    e2e = blocks(e2e_tasks, WARMUP, repeat)
    for label, result in results.items():
        result.end_to_end = e2e[("vkact", label)]
        result.peers = {p: e2e[(p, label)] for p in peers if (p, label) in e2e}
    return SizeResult(log2, 8 * n, e2e[("memcpy", "")], list(results.values()))


def _machine() -> str:
    return f"{platform.platform()}; {_cpu_model()}; {os.cpu_count()} CPUs"


def _write(out: Path, device_name: str, text: str, kind: str) -> None:
    print(text, end="")
    existing = out.read_text() if out.exists() else ""
    out.write_text(merge(existing, device_name, text, kind))
    print(f"\nwritten to {out}")


def _engine_header(engine: Engine, load: float, timing: str) -> list[tuple[str, str]]:
    """Date, machine (with the load average at the start and now), device and kernel lines of a kernel
    section; ``timing`` says how the kernels were timed."""
    d = engine.device
    return [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{_machine()}; 1-minute load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"),
        ("Device", f"{d.name}; type {d.type}; driver {d.driver_name} {d.driver_info}; Vulkan {d.api_version}; tensors in {engine.memory} memory"),
        ("Kernels", f"local size {engine.local_size}, {engine.units_per_invocation} × 16-byte units per invocation; {timing}"),
    ]


def run_kernels(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    names = operators(args.ops)
    versions = {peer.name: peer.version() for peer in PEERS}
    peers = [name for name, version in versions.items() if version]
    load = os.getloadavg()[0]
    engine = Engine()
    try:
        engine.load_shaders()
        vk = VkBench(engine)
        vulkan = vulkan_peers.open_peers(engine.device.name)
        sizes = [measure(engine, vk, names, log2, peers, args.repeat, vulkan) for log2 in args.sizes]
    finally:
        engine.close()
    d = engine.device
    header = [
        *_engine_header(engine, load, f"best (median) of {args.repeat} runs after {WARMUP} warm-up runs"),
        ("Peers", "; ".join(f"{name} {v}" if v else f"{name} not installed" for name, v in versions.items())
                  + " (numpy runs on one thread; the others use their default thread pools)"),
        ("Vulkan peers", "; ".join(f"{name}: {status}" for name, status in vulkan.status.items())
                         + f" (on the device above; {vulkan_peers.settings()})"),
        ("Runtime", f"{time.perf_counter() - started:.1f} s"),
    ]
    _write(args.out, d.name, section(d.name, header, sizes, peers, targets=d.driver_name == "llvmpipe"), "device")


def run_service(args: argparse.Namespace) -> None:
    from service.config import Settings

    from . import service as svc

    result = svc.run()
    d, v, settings = result.device, result.versions, Settings()
    header = [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{_machine()}; 1-minute load average {result.load[0]:.1f} at the start, {result.load[1]:.1f} at the end"),
        ("Device", f"{d['name']}; type {d['type']}; driver {d['driver']['name']} {d['driver']['info']}; "
                   f"Vulkan {d['vulkan_api_version']}; tensors in {d['memory']} memory"),
        ("Servers", f"uvicorn {v['uvicorn']}, httptools {v['httptools']}, uvloop {v['uvloop']}, one process each; "
                    f"vkact's device worker in its own process at nice {settings.worker_nice}"),
        ("Clients", f"httpx {v['httpx']}, one keep-alive connection per client; {svc.CLIENTS} processes for requests/s"),
        ("CPUs", f"{os.cpu_count()}, shared by the clients, both servers, vkact's device worker and the socket's peer"),
        ("Runtime", f"{result.seconds:.1f} s"),
    ]
    _write(args.out, d["name"], service_section(d["name"], header, result, targets=d["driver"]["name"] == "llvmpipe"), "service")


def _targets_apply(device: dict) -> bool:
    """The targets were set on llvmpipe; another device's sections carry figures only."""
    return device["driver"]["name"] == "llvmpipe"


def run_v2(args: argparse.Namespace) -> None:
    from . import v2

    result = v2.run()
    name = result.device["name"]
    _write(args.out, name, v2.section(name, v2.header(result, _machine()), result, _targets_apply(result.device)), "v2")


def run_grpc(args: argparse.Namespace) -> None:
    from . import v2_grpc

    result = v2_grpc.run()
    name = result.device["name"]
    _write(args.out, name, v2_grpc.section(name, _machine(), result, _targets_apply(result.device)), "grpc")


def run_types64(args: argparse.Namespace) -> None:
    from . import types64

    started, load = time.perf_counter(), os.getloadavg()[0]
    engine, rows = types64.measure(args.repeat, WARMUP)
    d = engine.device
    header = [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{_machine()}; 1-minute load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"),
        ("Device", f"{d.name}; driver {d.driver_name} {d.driver_info}; reports {', '.join(d.features) or 'no 64-bit feature'}; tensors in {engine.memory} memory"),
        ("Runs", f"best (median) of {args.repeat} after {WARMUP} warm-up runs; {time.perf_counter() - started:.1f} s in all"),
    ]
    _write(args.out, d.name, types64.section(d.name, header, rows), "types64")


def run_accuracy(args: argparse.Namespace) -> None:
    """FLOAT64's worst ulp per operator against mpmath (bench/accuracy.py), where the device has the
    native FLOAT64 kernels."""
    from client.buffers import to_buffer, view

    from . import accuracy

    engine = Engine()
    if "shaderFloat64" not in engine.kernel_features:
        print(f"{engine.device.name}: no shaderFloat64, no FLOAT64 accuracy to measure")
        engine.close()
        return

    def execute(case, x: np.ndarray) -> np.ndarray:
        op = accuracy.descriptor(case, x.shape)
        out = engine.execute(op, [to_buffer(x, None, op.inputs[0].total_bytes)])
        return np.array(view(out, np.float64, op.output.Sizes, op.output.strides))

    results = [accuracy.measure(execute, c) for c in accuracy.CASES] + [accuracy.measure_rows(execute, c) for c in accuracy.ROW_CASES]
    _write(args.out, engine.device.name, accuracy.section(engine.device.name, results), "accuracy")
    engine.close()


def _iree_graphs(device_name: str) -> str:
    """The graphs section's IREE line: what ran, or why its column is empty."""
    from . import iree_aot, iree_peer

    v = iree_peer.version()
    if v is None:
        return (f"not installed (make bench installs it: pip install -e '.[bench]'; without the compiler, {iree_aot.ENV} "
                "names a folder of modules compiled ahead of time: python -m bench.iree_aot)")
    if iree_peer.device(device_name) is None:
        return f"{v}; not compared: its Vulkan driver does not see {device_name} (it sees {iree_peer.devices()})"
    return v


def run_graphs(args: argparse.Namespace) -> None:
    from . import graphs, iree_peer

    started = time.perf_counter()
    log2 = max(args.sizes)
    engine = Engine()
    try:
        engine.load_shaders()
        results = graphs.measure(engine, log2, args.repeat)
        exact = graphs.exactness(engine, log2, args.repeat)
    finally:
        engine.close()
    d = engine.device
    header = [
        ("Date (UTC)", datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("Machine", f"{_machine()}; 1-minute load average {os.getloadavg()[0]:.1f} at the end (the CPUs are shared: medians of {args.repeat} interleaved rounds after {WARMUP} warm-up rounds)"),
        ("Device", f"{d.name}; driver {d.driver_name} {d.driver_info}; tensors in {engine.memory} memory"),
        ("IREE", _iree_graphs(d.name)),
        ("Runtime", f"{time.perf_counter() - started:.1f} s"),
    ]
    _write(args.out, d.name, graphs.section(d.name, header, log2, results, exact), "graphs")


def run_gpu(args: argparse.Namespace) -> None:
    """Every one-input operator's kernel against the copy shader and PyTorch CUDA (bench/gpu.py); not in the
    default run: it measures something only where torch sees a CUDA device (scripts/gpu-run.sh runs it)."""
    from . import gpu, torch_cuda_peer

    started, load = time.perf_counter(), os.getloadavg()[0]
    engine = Engine()
    try:
        engine.load_shaders()
        results = [gpu.measure(engine, operators(args.ops), log2, args.repeat, WARMUP) for log2 in args.sizes]
    finally:
        engine.close()
    d = engine.device
    header = [
        *_engine_header(engine, load, f"{args.repeat} interleaved rounds after {WARMUP} warm-up rounds; each timed call dispatches and waits"),
        ("PyTorch", torch_cuda_peer.status()[1]),
        ("Accuracy", f"max ulp against the float64 reference over the first {gpu.ULP_ELEMENTS:,} elements (whole rows)"),
        ("Runtime", f"{time.perf_counter() - started:.1f} s"),
    ]
    _write(args.out, d.name, gpu.section(d.name, header, results), "gpu")


def run_triton(args: argparse.Namespace) -> None:
    from . import triton, triton_report

    result = triton.run()
    name = result.device["name"]
    _write(args.out, name, triton_report.section(name, triton_report.header(result, _machine()), result,
                                                 _targets_apply(result.device)), "triton")


PARTS = {"kernels": run_kernels, "service": run_service, "v2": run_v2, "grpc": run_grpc,
         "types64": run_types64, "accuracy": run_accuracy, "graphs": run_graphs, "triton": run_triton, "gpu": run_gpu}
# Parts that the default run (no --only) leaves out.
ONLY_ASKED = {"gpu"}


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    # A terminated bench unwinds as an interrupted one does: the servers it started (vkact, Triton, MLServer,
    # the echo) are stopped by their context managers instead of being left running (seen with kill).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = _args(argv)
    for part in [args.only] if args.only else [p for p in PARTS if p not in ONLY_ASKED]:
        PARTS[part](args)


if __name__ == "__main__":
    main()
