"""A/B of vkact checkouts on 16 MiB `/v2` HTTP binary requests (2^22 FLOAT32 each way, SHRINK), as bench/triton.py
sends them: from a raw socket and from tritonclient.http, both servers up at once, rounds alternated, so that
drift on a shared machine lands on every target alike:

    .venv/bin/python -m bench.ab_large [--rounds 8] [--block 4] main=../main mine=.
    .venv/bin/python -m bench.ab_large copies=.,VKACT_SLOT_IMPORT=off direct=.

Each checkout's server as bench.ab_latency launches it. Prints per target the MB/s each way (tensor bytes over
the median seconds per request), the HTTP process's and the device worker's CPU per request (/proc, all rounds: 10 ms ticks), the ratios of the other
targets over the first one per round (median and spread) and the load average. Not part of ``python -m bench``."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

from . import service as svc
from .ab_latency import launch, targets
from .triton import LARGE, HttpCaller, RawHttpCaller


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="NAME=CHECKOUT[,VAR=VALUE...]")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--block", type=int, default=4)
    args = ap.parse_args()
    servers = {name: launch(name, path, env) for name, (path, env) in targets(args.targets).items()}
    load = [os.getloadavg()[0]]
    callers: dict[str, tuple[object, int]] = {}
    try:
        for s in servers.values():
            svc._wait_ready(s, "/health/ready")
        x = np.random.default_rng(2024).standard_normal(LARGE, dtype=np.float32)
        for name, s in servers.items():
            for kind, cls in (("raw", RawHttpCaller), ("tritonclient", HttpCaller)):
                call = cls(s.url, x)
                call.check()
                call()  # warm: its header seen, its slot's pages touched
                callers[f"{name} {kind}"] = (call, s.process.pid)
        workers = {s.process.pid: svc.device_worker(s.process.pid) for s in servers.values()}
        seconds: dict[str, list[float]] = {k: [] for k in callers}
        cpu: dict[str, list[float]] = {k: [] for k in callers}
        worker_cpu: dict[str, list[float]] = {k: [] for k in callers}
        per_round: dict[str, list[float]] = {k: [] for k in callers}
        for r in range(args.rounds):
            keys = list(callers) if r % 2 == 0 else list(reversed(callers))
            for k in keys:
                call, pid = callers[k]
                got = []
                worker = workers[pid]
                before, worker_before = svc.cpu_seconds(pid), svc.cpu_seconds(worker) if worker else 0.0
                for _ in range(args.block):
                    t = time.perf_counter()
                    call()
                    got.append(time.perf_counter() - t)
                cpu[k].append((svc.cpu_seconds(pid) - before) / args.block)
                worker_cpu[k].append(((svc.cpu_seconds(worker) - worker_before) / args.block) if worker else math.nan)
                seconds[k] += got
                per_round[k].append(statistics.median(got))
        load.append(os.getloadavg()[0])
    finally:
        for call, _ in callers.values():
            call.close()  # type: ignore[attr-defined]
        for s in servers.values():
            svc._stop(s)
    first = list(servers)[0]
    mb = x.nbytes / 1e6
    for k in callers:
        name, kind = k.split()
        base = f"{first} {kind}"
        ratios = [b / a for a, b in zip(per_round[k], per_round[base])]  # MB/s over the first target's
        print(f"{k:24s} {mb / statistics.median(seconds[k]):7.0f} MB/s each way  HTTP process {1e3 * statistics.fmean(cpu[k]):6.1f}, "
              f"device worker {1e3 * statistics.fmean(worker_cpu[k]):6.1f} ms CPU/request"
              f"  /{first}: {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    print(f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; {args.rounds} rounds of {args.block}")


if __name__ == "__main__":
    main()
