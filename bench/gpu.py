"""``python -m bench --only gpu``: every operator's kernel on the device against the copy shader, the
copy shader against PyTorch's device-to-device copy, and each kernel against PyTorch's CUDA implementation
of the same operator (bench/torch_cuda_peer.py), in interleaved rounds (copy shader, kernel, torch copy,
torch operator, ...; each API's first dispatch of a round untimed: it pays the GPU's switch between the Vulkan
and the CUDA context): the ratios compare runs made side by side. Plus vkact's max ulp against its float64
reference (and torch's), and ``Engine.execute`` end to end on one elementwise operator and one reduction.
Without torch or CUDA the torch columns say why and the rest is measured (on lavapipe too)."""
from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field

import numpy as np

from service.engine import Engine

from . import torch_cuda_peer
from .kernels import VkBench, cases, make_op
from .timing import Samples, blocks, rounds
from .vulkan_peers import max_ulp

ULP_ELEMENTS = 1 << 22       # the ulp is taken over this prefix of the input (whole rows for reductions)
END_TO_END = ("relu", "softmax/1024")


@dataclass
class Row:
    label: str
    kernel: Samples
    copy: Samples
    torch: Samples | None = None
    torch_copy: Samples | None = None
    ulp: int | None = None
    torch_ulp: int | None = None
    torch_why: str = ""

    def vs_copy(self) -> float:
        """Median over rounds of copy-shader time / kernel time (1 = the copy's throughput)."""
        return statistics.median(c / k for c, k in zip(self.copy.seconds, self.kernel.seconds))

    def vs_torch(self) -> float | None:
        """Median over rounds of torch time / vkact kernel time (> 1: vkact faster)."""
        if self.torch is None:
            return None
        return statistics.median(t / k for t, k in zip(self.torch.seconds, self.kernel.seconds))

    def copy_vs_torch_copy(self) -> float | None:
        if self.torch_copy is None:
            return None
        return statistics.median(t / c for t, c in zip(self.torch_copy.seconds, self.copy.seconds))


@dataclass
class Result:
    log2: int
    rows: list[Row]
    torch_status: str
    end_to_end: dict[str, Samples] = field(default_factory=dict)


def _ulp(op_name: str, row_len: int | None, x: np.ndarray, got: np.ndarray) -> int:
    m = min(ULP_ELEMENTS, x.size)
    if row_len is not None:
        m = max(row_len, m // row_len * row_len)
    small = make_op(op_name, m, row_len)
    reference = small.reference(x[:m].reshape(tuple(small.inputs[0].Sizes)))
    return max_ulp(np.ascontiguousarray(got[:m]), reference.reshape(-1))


def measure(engine: Engine, names: list[str], log2: int, repeat: int, warmup: int) -> Result:
    torch, why = torch_cuda_peer.status()
    n = 1 << log2
    x = np.random.default_rng(log2).standard_normal(n, dtype=np.float32) * np.float32(3)
    vk = VkBench(engine)
    torch_copy = torch_cuda_peer.device_copy(torch, 8 * n // 2) if torch is not None else None
    rows: list[Row] = []
    e2e: list[tuple[str, object]] = []
    for label, name, row_len in cases(names):
        if row_len is not None and row_len > n:
            continue  # rows longer than the tensor
        op = make_op(name, n, row_len)
        if len(op.inputs) != 1:
            continue  # two-input operators: no like-for-like peer, and the copy shader reads one tensor
        print(f"gpu: 2^{log2} {label}", file=sys.stderr, flush=True)
        out = engine.execute(op, [x]).view(np.float32)
        row_ulp = _ulp(name, row_len, x, out)
        peer = torch_cuda_peer.bind(torch, op, x) if torch is not None else None
        copy = vk.copy(op)
        tasks = [("copy", copy), ("kernel", vk.kernel(op))]
        torch_ulp, torch_why = None, why
        if peer is not None:
            peer.run()
            torch_ulp, torch_why = _ulp(name, row_len, x, peer.output()), ""
            # The GPU switches between the Vulkan and the CUDA context: the first dispatch after the other
            # API's work pays it (on the H100, 2^26: the copy shader 0.36 ms after PyTorch's, 0.20 after
            # vkact's own; PyTorch's copy likewise). An untimed dispatch of each API takes it first.
            tasks = [("vulkan after cuda", copy), *tasks, ("cuda after vulkan", torch_copy), ("torch_copy", torch_copy), ("torch", peer.run)]
        elif torch is not None:
            torch_why = "no torch.nn.functional operator with DirectML's parameters"
        timed = rounds(tasks, warmup, repeat)
        del peer
        rows.append(Row(label, timed["kernel"], timed["copy"], timed.get("torch"), timed.get("torch_copy"),
                        row_ulp, torch_ulp, torch_why))
        if label in END_TO_END:
            e2e.append((label, vk.end_to_end(op, x)))
    return Result(log2, rows, why, blocks(e2e, warmup, repeat))


def _gbps(s: Samples | None, nbytes: int) -> str:
    return "—" if s is None else f"{s.gbps(nbytes):.0f} ({s.gbps(nbytes, median=True):.0f})"


def _ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:.2f}"


def section(device_name: str, header: list[tuple[str, str]], results: list[Result]) -> str:
    lines = [f"<!-- gpu: {device_name} -->", f"## {device_name}: kernels beside PyTorch CUDA", ""]
    lines += [f"- **{key}:** {value}" for key, value in header]
    for res in results:
        nbytes = 8 << res.log2  # FLOAT32: 4 bytes read + 4 written per element
        each = f"{(nbytes // 2) >> 20} MiB"
        lines += ["", f"### 2^{res.log2} FLOAT32 elements ({each} read + {each} written)", "",
                  "GB/s: best (median) of the runs; ratios: median over rounds of the two times in the same round.", "",
                  "| Operator | vkact kernel GB/s | kernel / copy shader | copy shader GB/s | torch copy GB/s | copy shader / torch copy"
                  " | torch op GB/s | vkact speed / torch | vkact ulp | torch ulp |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res.rows:
            torch_cell = _gbps(r.torch, nbytes) if r.torch is not None else (r.torch_why or "—")
            lines.append(f"| {r.label} | {_gbps(r.kernel, nbytes)} | {r.vs_copy():.2f} | {_gbps(r.copy, nbytes)} | "
                         f"{_gbps(r.torch_copy, nbytes)} | {_ratio(r.copy_vs_torch_copy())} | {torch_cell} | "
                         f"{_ratio(r.vs_torch())} | {r.ulp} | {'—' if r.torch_ulp is None else r.torch_ulp} |")
        shared = [r for r in res.rows if r.torch is not None]
        elementwise = [r for r in res.rows if "/" not in r.label and r.label != "identity"]
        copies = [c for c in (r.copy_vs_torch_copy() for r in res.rows) if c is not None]
        lines += ["", "Issue 20's targets, from this run: "
                  f"kernels at >= 0.8 of the copy shader: {sum(r.vs_copy() >= 0.8 for r in elementwise)} of {len(elementwise)} elementwise; "
                  + (f"copy shader / torch copy (median over operators): {statistics.median(copies):.2f} (target >= 0.8); " if copies else "")
                  + (f"vkact at least as fast as torch on {sum(r.vs_torch() >= 1.0 for r in shared)} of {len(shared)} operators "
                     f"torch has (target: >= 80%)." if shared else f"no torch peer ({res.torch_status}).")]
        if res.end_to_end:
            lines += ["", "`Engine.execute` end to end (copy in, dispatch, copy out into a new array), GB/s of the tensor's "
                      "bytes in + out, best (median): " + "; ".join(f"{k} {_gbps(s, nbytes)}" for k, s in res.end_to_end.items())]
    lines += ["", "<!-- end gpu -->", ""]
    return "\n".join(lines)
