"""The other Vulkan stacks on vkact's own device, for the kernel section: ncnn (its activation layers,
bench/ncnn_peer.py), wgpu (WGSL shaders of the same formulas, bench/wgpu_peer.py) and IREE (one
``linalg.generic`` per operator compiled for ``vulkan-spirv``, bench/iree_peer.py's bodies).

Each peer binds an operator to the input, already on its device, and gives a ``Bound``: the timed
call (dispatch and wait) and the output of the last call, checked against vkact's float64 reference
(max ulp). A peer that is not installed, cannot see the device or fails on an operator says so in its
column, and the bench goes on."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.operators import OperatorDesc

from . import iree_peer
from .timing import Samples


@dataclass
class Bound:
    run: Callable[[], object]                     # timed: the kernel(s), waited for
    output: Callable[[], np.ndarray]              # the result of the last run, on the host, flat float32
    baseline: Callable[[], object] | None = None  # timed beside run; its time is taken off (ncnn)
    per: int = 1                                  # kernels in run beyond the baseline

    def kernel_seconds(self, run: Samples, baseline: Samples | None) -> Samples:
        """One kernel's time per round: (run - baseline) / per, round by round."""
        base = baseline.seconds if baseline else [0.0] * len(run.seconds)
        return Samples([(r - b) / self.per for r, b in zip(run.seconds, base)])


def max_ulp(got: np.ndarray, want: np.ndarray) -> int:
    """The largest distance in float32 ulp (+0 and -0 alike, NaN against NaN 0, NaN against a number
    2^31); a result below the smallest normal where the reference is too counts as exact, as the
    tests allow (Vulkan may flush float32 subnormals)."""
    def ordered(a: np.ndarray) -> np.ndarray:
        i = np.ascontiguousarray(a, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    d = np.abs(ordered(got) - ordered(want))
    tiny = np.finfo(np.float32).tiny
    d = np.where((np.abs(got) < tiny) & (np.abs(want) < tiny), 0, d)
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    d = np.where(nan_got & nan_want, 0, np.where(nan_got | nan_want, 1 << 31, d))
    return int(d.max()) if d.size else 0


def _defaults(op: OperatorDesc) -> bool:
    fields = type(op).model_fields
    return all(float(getattr(op, f)) == float(fields[f].default) for f in op.scalar_fields())


# bench/iree_peer.py's bodies hold DirectML's defaults except LINEAR's (the graphs' 0.5, 0.1); these
# add the operators it lacks, at DirectML's defaults too.
IREE_BODIES = {
    **iree_peer.BODIES,
    "LINEAR": ["%c1 = arith.constant 1.0 : f32", "%c2 = arith.constant 0.0 : f32", "%m = arith.mulf %a, %c1 : f32", "%r = arith.addf %m, %c2 : f32"],
    "TANH": ["%r = math.tanh %a : f32"],
    "CELU": ["%z = arith.constant 0.0 : f32", "%e = math.expm1 %a : f32", "%p = arith.maximumf %a, %z : f32",
             "%n = arith.minimumf %e, %z : f32", "%r = arith.addf %p, %n : f32"],
    "SCALED_ELU": ["%z = arith.constant 0.0 : f32", "%al = arith.constant 1.67326319217681884765625 : f32",
                   "%g = arith.constant 1.05070102214813232421875 : f32", "%e = math.expm1 %a : f32", "%m = arith.mulf %e, %al : f32",
                   "%gt = arith.cmpf ogt, %a, %z : f32", "%s = arith.select %gt, %a, %m : f32", "%r = arith.mulf %s, %g : f32"],
    "HARD_SWISH": ["%al = arith.constant 0.16666667163372039794921875 : f32", "%be = arith.constant 0.5 : f32",
                   "%z = arith.constant 0.0 : f32", "%one = arith.constant 1.0 : f32", "%m = arith.mulf %a, %al : f32",
                   "%s = arith.addf %m, %be : f32", "%lo = arith.minimumf %s, %one : f32", "%h = arith.maximumf %lo, %z : f32",
                   "%r = arith.mulf %a, %h : f32"],
    "SWISH": ["%one = arith.constant 1.0 : f32", "%n = arith.negf %a : f32", "%e = math.exp %n : f32",
              "%d = arith.addf %one, %e : f32", "%r = arith.divf %a, %d : f32"],
    "SOFTPLUS": ["%e = math.exp %a : f32", "%r = math.log1p %e : f32"],
    "GELU": ["%one = arith.constant 1.0 : f32", "%h = arith.constant 0.5 : f32", "%c = arith.constant 0.70710678118654752 : f32",
             "%s = arith.mulf %a, %c : f32", "%er = math.erf %s : f32", "%p = arith.addf %one, %er : f32",
             "%m = arith.mulf %a, %p : f32", "%r = arith.mulf %m, %h : f32"],
}


class IreePeer:
    name = "IREE"

    def version(self) -> str | None:
        return iree_peer.version()

    def open(self, device_name: str) -> str | None:
        """None where IREE's ``vulkan`` driver sees vkact's device (it then runs there), else why not."""
        self._device = iree_peer.device(device_name)
        if self._device is None:
            return f"IREE's Vulkan driver does not see {device_name} ({iree_peer.devices()})"
        return None

    def bind(self, name: str, op: OperatorDesc, x: np.ndarray) -> Bound | None:
        kind = name.upper()
        # IDENTITY alone: IREE folds x + (-0) to x and answers with its input, no dispatch (measured on
        # llvmpipe: 0.14 ms at 2^24 against 28 for a copy), so there is no kernel to compare.
        if kind not in IREE_BODIES or kind == "IDENTITY" or not _defaults(op):
            return None
        vmfb = iree_peer.module(iree_peer.mlir([kind], x.size, IREE_BODIES))
        if vmfb is None:   # no compiler, and not among the modules compiled ahead of time
            return None
        chain = iree_peer.IreeChain(vmfb, x, self._device)
        return Bound(run=chain.run, output=chain.output)


def _peers() -> list:
    from .ncnn_peer import NcnnPeer
    from .wgpu_peer import WgpuPeer

    return [NcnnPeer(), WgpuPeer(), IreePeer()]


NAMES = ("ncnn", "wgpu", "IREE")


def settings() -> str:
    from .ncnn_peer import chain
    from .wgpu_peer import WORKGROUP

    return ("ncnn: its own layers, fp16 and bf16 storage, packing and arithmetic off, one kernel's time = "
            f"(a net of 1 + k layers - a net of 1) / k, k = {chain(1 << 20)} at 2^20, {chain(1 << 24)} at 2^24; wgpu: WGSL over vec4<f32>, workgroups of {WORKGROUP}, "
            "its Vulkan backend; IREE: one linalg.generic compiled for vulkan-spirv")
INSTALL = "not installed (make bench installs it: pip install -e '.[bench]')"


@dataclass
class Opened:
    """The peers that run on vkact's device, and for every peer a line for the header."""
    peers: list
    status: dict[str, str]


def open_peers(device_name: str) -> Opened:
    peers, status = [], {}
    for peer in _peers():
        version = peer.version()
        if version is None:
            status[peer.name] = INSTALL
            continue
        try:
            why = peer.open(device_name)
        except Exception as error:  # noqa: BLE001 - a peer that refuses the device: its column says why
            why = f"{type(error).__name__}: {error}"
        status[peer.name] = version if why is None else f"{version}: {why}"
        if why is None:
            peers.append(peer)
    return Opened(peers, status)


@dataclass
class PeerRun:
    """One peer on one operator at one size: its kernel time and accuracy, or why there is none."""
    seconds: Samples | None = None
    ulp: int | None = None
    why: str = ""

    def ratio(self, vkact: Samples) -> float | None:
        """Median over rounds of this peer's time over vkact's kernel time in the same round."""
        if self.seconds is None:
            return None
        return statistics.median(p / k for p, k in zip(self.seconds.seconds, vkact.seconds))


def bind(opened: Opened, name: str, op: OperatorDesc, x: np.ndarray, reference: np.ndarray) -> tuple[dict[str, Bound], dict[str, PeerRun]]:
    """Each open peer's Bound for the operator (run once, its output's ulp taken), and a PeerRun for
    every peer: the ulp so far, or why it has no figures."""
    bound: dict[str, Bound] = {}
    runs = {name_: PeerRun(why=status) for name_, status in opened.status.items() if name_ not in {p.name for p in opened.peers}}
    for peer in opened.peers:
        try:
            b = peer.bind(name, op, x)
            if b is None:
                runs[peer.name] = PeerRun(why="no like-for-like kernel")
                continue
            b.run()
            runs[peer.name] = PeerRun(ulp=max_ulp(b.output(), reference))
            bound[peer.name] = b
        except Exception as error:  # noqa: BLE001 - this operator fails on this peer: its cell says why
            runs[peer.name] = PeerRun(why=f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120] if str(error) else ''}")
    return bound, runs


def tasks(bound: dict[str, Bound]) -> list[tuple[tuple[str, str], Callable[[], object]]]:
    """The timed calls of each bound peer, for timing.rounds: ("run", peer) and ("baseline", peer)."""
    out: list[tuple[tuple[str, str], Callable[[], object]]] = []
    for peer, b in bound.items():
        if b.baseline is not None:
            out.append((("baseline", peer), b.baseline))
        out.append((("run", peer), b.run))
    return out


def collect(bound: dict[str, Bound], runs: dict[str, PeerRun], timed: dict) -> dict[str, PeerRun]:
    """The runs with each bound peer's kernel time per round filled in from timing.rounds' samples."""
    for peer, b in bound.items():
        runs[peer].seconds = b.kernel_seconds(timed[("run", peer)], timed.get(("baseline", peer)))
    return {name: runs[name] for name in NAMES if name in runs}
