"""``python -m bench.gpu_diag``: where a dispatch's wall time goes on a GPU, for a device nobody has profiled yet.

For RELU (packed FLOAT32) at several sizes: the wall time of one ``eval`` of one dispatch (what the kernel bench
times), of one ``eval`` of ten dispatches recorded in one command buffer (per dispatch: the submission, fence
and wake-up paid once), and the GPU's own time of one dispatch from timestamp queries (ticks; NVIDIA's
timestampPeriod is 1 ns). Then the host side of ``Engine.execute``: numpy copies into and out of the mapped
memory the engine uses (the staging buffer in device memory mode, the buffer itself in host mode), whose
speed depends on the memory type the driver gives it (write-combined, cached). Between them, whether the
dispatch's time is the GPU's clocks (its GPU time in a burst of ten, before and after back-to-back evals). Prints markdown.
"""
from __future__ import annotations

import statistics
import time

import kp
import numpy as np

from service.config import Settings
from service.engine import Engine

from .kernels import make_op

REPEAT = 20


def _median_ms(fn, repeat: int = REPEAT) -> float:
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def dispatch_table(engine: Engine, log2s: list[int]) -> list[str]:
    lines = ["| elements | one dispatch per eval, wall ms | ten per eval, wall ms per dispatch | GPU time per dispatch (timestamps), ms | GB/s by GPU time | GB/s by one-dispatch wall |",
             "|---:|---:|---:|---:|---:|---:|"]
    for log2 in log2s:
        n = 1 << log2
        op = make_op("relu", n)
        prepared = engine.prepare(op)
        dispatch = kp.OpAlgoDispatch(prepared.algorithm, prepared.push)
        one = engine.sequence()
        one.record(dispatch)
        ten = engine.sequence()
        for _ in range(10):
            ten.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
        wall_one = _median_ms(one.eval)
        wall_ten = _median_ms(ten.eval) / 10
        gpu = []
        try:
            stamped = engine._mgr.sequence(0, 1)
            stamped.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
            gpu = [_gpu_ms(stamped, 1)[0] for _ in range(REPEAT)]
        except Exception as exc:  # noqa: BLE001 - a device without timestamps: the column says so
            gpu = []
            print(f"timestamps: {exc}")
        gpu_ms = statistics.median(gpu) if gpu else float("nan")
        nbytes = 2 * 4 * n
        lines.append(f"| 2^{log2} | {wall_one:.4f} | {wall_ten:.4f} | {gpu_ms:.4f} | {nbytes / gpu_ms / 1e6:.0f} | {nbytes / wall_one / 1e6:.0f} |")
        print(lines[-1], flush=True)
    return lines


def _gpu_ms(seq, dispatches: int) -> list[float]:
    """One eval of ``seq`` (``dispatches`` dispatches, a timestamp after each): each dispatch's GPU ms."""
    seq.eval()
    ticks = seq.get_timestamps()
    return [(b - a) / 1e6 for a, b in zip(ticks[:dispatches], ticks[1:dispatches + 1])]


def warm_table(engine: Engine, log2: int, seconds: float = 1.5) -> list[str]:
    """Whether the per-dispatch time is the GPU's clocks: each dispatch's GPU time in a command buffer of ten
    (the first against the rest), and one dispatch per eval before and after ``seconds`` of back-to-back evals."""
    n = 1 << log2
    prepared = engine.prepare(make_op("relu", n))
    one = engine.sequence()
    one.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
    stamped = engine._mgr.sequence(0, 2)
    stamped.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
    ten = engine._mgr.sequence(0, 11)
    for _ in range(10):
        ten.record(kp.OpAlgoDispatch(prepared.algorithm, prepared.push))
    lines = [f"2^{log2} RELU, GPU ms of each of ten dispatches in one command buffer: "
             + ", ".join(f"{t:.4f}" for t in _gpu_ms(ten, 10))]
    cold = (_median_ms(one.eval), statistics.median(_gpu_ms(stamped, 1)[0] for _ in range(REPEAT)))
    end = time.perf_counter() + seconds
    evals = 0
    while time.perf_counter() < end:
        one.eval()
        evals += 1
    warm = (_median_ms(one.eval), statistics.median(_gpu_ms(stamped, 1)[0] for _ in range(REPEAT)))
    lines.append(f"one dispatch per eval, wall / GPU ms: {cold[0]:.4f} / {cold[1]:.4f} at first, "
                 f"{warm[0]:.4f} / {warm[1]:.4f} after {evals} evals back to back in {seconds} s")
    lines.append("GPU ms of each of ten dispatches, after that: " + ", ".join(f"{t:.4f}" for t in _gpu_ms(ten, 10)))
    for line in lines:
        print(line, flush=True)
    return lines


def host_copies(log2: int) -> list[str]:
    n = 1 << log2
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    lines = ["| memory mode | numpy into mapped memory GB/s | numpy out of mapped memory into a new array GB/s | "
             "the same into an array written before GB/s | execute end to end ms |", "|---|---:|---:|---:|---:|"]
    for mode in ("device", "host"):
        engine = Engine(Settings(memory=mode))
        op = make_op("relu", n)
        engine.execute(op, [x])
        prepared = engine.prepare(op)
        tensors = prepared.algorithm.get_tensors()
        mapped_in = tensors[0].data().view(np.float32)[:n]
        mapped_out = tensors[-1].data().view(np.float32)[:n]
        into = _median_ms(lambda: np.copyto(mapped_in, x), 5)
        out = _median_ms(lambda: mapped_out.copy(), 5)
        kept = np.ones_like(x)   # its pages already touched: a new array's first touch is not in this column
        out_kept = _median_ms(lambda: np.copyto(kept, mapped_out), 5)
        e2e = _median_ms(lambda: engine.execute(op, [x]), 5)
        lines.append(f"| {mode} | {4 * n / into / 1e6:.1f} | {4 * n / out / 1e6:.1f} | {4 * n / out_kept / 1e6:.1f} | {e2e:.2f} |")
        print(lines[-1], flush=True)
        engine.close()
    return lines


def main() -> None:
    engine = Engine()
    print(f"## {engine.device.name}: dispatch diagnostics (memory {engine.memory}, local size {engine.local_size})\n")
    text = dispatch_table(engine, [16, 20, 24, 26, 28])
    print("\n".join(text))
    print()
    warm_table(engine, 26)
    engine.close()
    print()
    print("\n".join(host_copies(26)))


if __name__ == "__main__":
    main()
