"""``python -m bench.gpu_tuning [--log2 26] [--repeat 10]``: the choices device_tuning makes for a GPU, measured.

Workgroup size (Settings.local_size) x 16-byte units per invocation for a few packed FLOAT32 kernels (a cheap
one, two exp-based ones, a reduction), each local size on its own engine (the units varied on it) in interleaved rounds with that
engine's copy shader; then host against device memory, kernel alone and ``Engine.execute`` end to end.
Prints markdown tables: kernel ms (median), and GB/s where a byte count makes sense. A measurement tool for
a device nobody has tuned on yet, not a target.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from service.config import Settings
from service.engine import Engine

from .kernels import VkBench, make_op
from .timing import rounds

OPS = (("relu", None), ("sigmoid", None), ("gelu", None), ("softmax", 1024))
LOCAL_SIZES = (64, 128, 256, 512, 1024)
UNITS = (1, 2, 4, 8)
WARMUP = 2


def _median_ms(samples) -> float:
    return statistics.median(samples.seconds) * 1e3


def workgroups(log2: int, repeat: int) -> list[str]:
    n = 1 << log2
    lines = [f"### local size x units per invocation, 2^{log2} FLOAT32 (kernel ms, median of {repeat})", "",
             "| local size | units | copy | " + " | ".join(f"{o}{'/' + str(r) if r else ''}" for o, r in OPS) + " |",
             "|---:|---:|---:|" + "---:|" * len(OPS)]
    for local in LOCAL_SIZES:
        # One engine per local size, the units varied on it (they only set each dispatch's workgroup count):
        # on the H200 an engine per configuration saw no device after about twelve engines.
        engine = Engine(Settings(local_size=local))
        try:
            if engine.local_size != local:
                lines.append(f"| {local} | - | beyond the device's limit ({engine.local_size}) |" + " |" * len(OPS))
                break
            for units in UNITS:
                engine.units_per_invocation = units
                bench = VkBench(engine)
                tasks = [("copy", bench.copy(make_op("relu", n)))]
                tasks += [(f"{o}{r}", bench.kernel(make_op(o, n, r))) for o, r in OPS]
                got = rounds(tasks, WARMUP, repeat)
                lines.append(f"| {local} | {units} | " + " | ".join(f"{_median_ms(got[k]):.3f}" for k, _ in tasks) + " |")
                print(lines[-1], file=sys.stderr, flush=True)
                del bench, tasks, got
        finally:
            engine.close()
    return lines


def memory(log2s: list[int], repeat: int) -> list[str]:
    lines = ["### host against device memory (ms, median): relu kernel alone and Engine.execute end to end", "",
             "| elements | memory | kernel | end to end | end to end GB/s (in + out) |", "|---:|---|---:|---:|---:|"]
    for log2 in log2s:
        n = 1 << log2
        x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        op = make_op("relu", n)
        for mode in ("device", "host"):
            engine = Engine(Settings(memory=mode))
            bench = VkBench(engine)
            got = rounds([("kernel", bench.kernel(op)), ("e2e", bench.end_to_end(op, x))], WARMUP, repeat)
            e2e = _median_ms(got["e2e"])
            lines.append(f"| 2^{log2} | {mode} | {_median_ms(got['kernel']):.3f} | {e2e:.3f} | {2 * 4 * n / e2e / 1e6:.1f} |")
            print(lines[-1], file=sys.stderr, flush=True)
            del bench, got
            engine.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log2", type=int, default=26)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()
    probe = Engine()
    header = f"## {probe.device.name}: tuning sweep\n\nDriver {probe.device.driver_name}; type {probe.device.type}; subgroup {probe.device.subgroup_size}\n"
    probe.close()
    text = "\n".join([header, *workgroups(args.log2, args.repeat), "", *memory(sorted({16, 20, args.log2}), args.repeat), ""])
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
