"""A/B of the sequential p50 of vkact checkouts beside the bare echo (issue 25's `/v1` target), as bench/triton.py
measures it: httpx `/v1/execute` binary frames (1,024 FLOAT32 SHRINK), one request at a time, and with --v2
tritonclient.http `/v2` binary; alternated blocks, so that drift on a shared machine lands on every target alike.
For a change's before/after, both servers up at once:

    .venv/bin/python -m bench.ab_latency [--rounds 20] [--block 100] [--v2] main=../main mine=.

Each checkout's server: CHECKOUT/.venv/bin/python (else this venv's) -m service --no-supervise, cwd CHECKOUT,
with this process's environment (VKACT_* pass through). The echo and the client: this checkout's bench.
Prints per target p50/p90 (ms), p50 over the echo's, the spread of the per-round ratios, and the load average.
Not part of ``python -m bench`` (it compares checkouts, not vkact with its peers)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import service as svc


def launch(name: str, checkout: Path, env: dict[str, str] | None = None) -> svc.Server:
    """vkact from ``checkout``, under its own venv's Python where it has one (its kp and native modules)."""
    python = checkout / ".venv/bin/python"
    return svc._launch(name, "service", root=checkout, python=str(python) if python.exists() else sys.executable, env=env)


def targets(specs: list[str]) -> dict[str, tuple[Path, dict[str, str]]]:
    """``NAME=CHECKOUT[,VAR=VALUE...]`` each: a checkout and its server's extra environment (e.g.
    ``off=.,VKACT_SLOT_IMPORT=off`` beside ``on=.``: one checkout, two settings)."""
    found = {}
    for spec in specs:
        name, rest = spec.split("=", 1)
        path, *assignments = rest.split(",")
        found[name] = (Path(path).resolve(), dict(a.split("=", 1) for a in assignments))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="+", help="NAME=CHECKOUT[,VAR=VALUE...]")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--v2", action="store_true", help="also tritonclient.http /v2 binary per checkout")
    args = ap.parse_args()
    servers = {name: launch(name, path, env) for name, (path, env) in targets(args.targets).items()}
    echo = svc._launch("echo", "bench.echo")
    load = [os.getloadavg()[0]]
    clients: list = []  # what to close: httpx clients and tritonclient callers
    try:
        svc._wait_ready(echo, "/")
        for s in servers.values():
            svc._wait_ready(s, "/health/ready")
        x = np.random.default_rng(2024).standard_normal(svc.SMALL, dtype=np.float32)
        tasks: dict[str, Callable[[], object]] = {}
        echo_http = svc._http(echo.url)
        clients.append(echo_http)
        p = svc.payload(echo.url, x, "binary")
        svc.check(svc.post(echo_http, p), p, True)
        tasks["echo v1"] = lambda: svc.post(echo_http, p)
        for name, s in servers.items():
            http = svc._http(s.url)
            clients.append(http)
            svc.check(svc.post(http, p), p, False)
            tasks[f"{name} v1"] = lambda http=http: svc.post(http, p)
        if args.v2:
            from .triton import HttpCaller
            for name, s in servers.items():
                call = HttpCaller(s.url, x)
                call.check()
                clients.append(call)
                tasks[f"{name} v2"] = call
        for task in tasks.values():
            for _ in range(args.warmup):
                task()
        samples: dict[str, list[float]] = {k: [] for k in tasks}
        per_round: dict[str, list[float]] = {k: [] for k in tasks}
        for r in range(args.rounds):
            keys = list(tasks) if r % 2 == 0 else list(reversed(tasks))
            for k in keys:
                task, got = tasks[k], []
                for _ in range(args.block):
                    t = time.perf_counter()
                    task()
                    got.append(time.perf_counter() - t)
                samples[k] += got
                per_round[k].append(statistics.median(got))
        load.append(os.getloadavg()[0])
        echo_p50 = statistics.median(samples["echo v1"])
        print(f"load {load[0]:.1f} -> {load[1]:.1f}; {args.rounds} rounds x {args.block} requests per target")
        print(f"{'target':<16}{'p50 ms':>9}{'p90 ms':>9}{'/echo':>8}{'rounds /echo min-max':>24}")
        for k, v in samples.items():
            q = statistics.quantiles(v, n=10)
            ratios = [a / b for a, b in zip(per_round[k], per_round["echo v1"])]
            print(f"{k:<16}{statistics.median(v) * 1e3:>9.3f}{q[8] * 1e3:>9.3f}{statistics.median(v) / echo_p50:>8.3f}"
                  f"{min(ratios):>12.3f}-{max(ratios):.3f}")
    finally:
        for c in clients:
            c.close()
        for s in [*servers.values(), echo]:
            svc._stop(s)


if __name__ == "__main__":
    main()
