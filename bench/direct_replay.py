"""``python -m bench.direct_replay``: a repeated large job's replay with its kernel on the request's shared-memory
slot itself (engine_direct: the slot's pages imported, VK_EXT_external_memory_host) against the copying replay
(the slot's bytes into the engine's buffers, the dispatch, the answer back), on the device the engine picks.

What ``Tuning.slot_import_bytes`` rests on: on a CPU device both run on the same memory, so the copies are what
the import saves; on a discrete GPU the copying replay also moves the tensors to and from device memory, and
the kernel on the slot reads and writes host memory across the bus. The engine runs with ``slot_import`` 'on'
(any device that imports host memory), as the device worker replays a job: SHRINK on packed FLOAT32, the input
and the output in one anonymous shared mapping, each replayer's answer checked against the float64 reference
before and after the timed rounds. Rounds alternate the two replays; prints a markdown table of the median
milliseconds per replay.

    python -m bench.direct_replay [--log2 18,20,22,24] [--rounds 10] [--repeat 5]
"""
from __future__ import annotations

import argparse
import mmap
import pickle
import statistics
import time
from collections.abc import Callable

import numpy as np

from service.config import Settings
from service.engine import Engine

from .kernels import make_op

PAGE = 4096


def _page(engine: Engine) -> int:
    """The layout's unit: a page, or the device's import alignment where larger (a range past the imported
    part of the mapping would copy)."""
    return max(PAGE, engine.device.host_import_alignment)


def _replays(engine: Engine, log2: int, region: np.ndarray) -> tuple[Callable[[], object], Callable[[], object], Callable[[], None]]:
    """The copying and the direct replayer of one SHRINK job in ``region`` (the input in its first half, the
    output in its second) and a check of its answer."""
    n = 1 << log2
    nbytes = 4 * n
    op = make_op("shrink", n)
    key = pickle.dumps(op)
    out_at = region.nbytes // 2
    x, out = region[:nbytes], region[out_at : out_at + nbytes]
    values = np.random.default_rng(log2).standard_normal(n).astype(np.float32)
    x[:] = values.view(np.uint8)
    engine.execute(op, [x], out=out, key=key)
    copying = engine.replayer(op, [x], out, key)
    direct = engine.direct_replayer(op, region, [(0, nbytes)], (out_at, nbytes), key)
    if direct is None:
        raise SystemExit(f"{engine.device.name}: no replay on the slot for 2^{log2} elements (engine.direct_replayer said None)")
    want = op.reference(values.astype(np.float64)).astype(np.float32)

    def check() -> None:
        got = out.view(np.float32)
        for replay in (copying, direct):
            out[:] = 0xAB
            if replay() is None:
                raise SystemExit("a replayer was dropped by the engine mid-run")
            if not np.array_equal(got, want):
                raise SystemExit(f"2^{log2}: a replay's answer differs from the reference")

    return copying, direct, check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2", default="18,20,22,24", help="FLOAT32 elements per tensor, as powers of two")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5, help="replays of each kind per round")
    args = ap.parse_args()
    engine = Engine(Settings(slot_import="on"))
    if engine.slot_import_bytes is None:
        raise SystemExit(f"{engine.device.name} does not import host memory (VK_EXT_external_memory_host)")
    engine.slot_import_bytes = 1  # every size measured, below the service's threshold too
    print(f"device: {engine.device.name} ({engine.device.driver_name} {engine.device.driver_info}), memory={engine.memory}, "
          f"host import alignment {engine.device.host_import_alignment}")
    print("\n| elements | tensor | copying replay, ms | on the slot, ms | on the slot / copying | on the slot, GB/s in + out |")
    print("|---:|---:|---:|---:|---:|---:|")
    try:
        for log2 in (int(v) for v in args.log2.split(",")):
            nbytes = 4 << log2
            page = _page(engine)
            mm = mmap.mmap(-1, 2 * (-(-nbytes // page) * page))
            region = np.frombuffer(mm, np.uint8)
            copying = direct = check = None
            try:
                copying, direct, check = _replays(engine, log2, region)
                check()
                times: dict[str, list[float]] = {"copying": [], "direct": []}
                for r in range(args.rounds):
                    order = (("copying", copying), ("direct", direct)) if r % 2 == 0 else (("direct", direct), ("copying", copying))
                    for name, replay in order:
                        for _ in range(args.repeat):
                            started = time.perf_counter()
                            replay()
                            times[name].append(time.perf_counter() - started)
                check()
                c, d = (statistics.median(times[k]) * 1e3 for k in ("copying", "direct"))
                print(f"| 2^{log2} | {nbytes / (1 << 20):g} MiB | {c:.3f} | {d:.3f} | {d / c:.2f} | {2 * nbytes / d / 1e6:.1f} |", flush=True)
            finally:
                engine.release_region(region)
                copying = direct = check = region = mm = None  # the mapping goes with the last view of it
    finally:
        engine.close()


if __name__ == "__main__":
    main()
