"""bench/RESULTS.md: a preamble, then one section per Vulkan device between HTML comment markers. A
run rewrites the preamble and its own device's section; other devices' sections are kept verbatim
(text outside any section is not: the bench owns the file)."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from .timing import Samples

TARGET = 0.90       # kernel / copy ceiling that every operator should reach ...
TARGET_LOG2 = 24    # ... at this many FLOAT32 elements

PREAMBLE = f"""# vkact kernel benchmark

Written by `make bench` (`python -m bench`). Each Vulkan device has its own section; a run replaces
only the section of the device it ran on. Throughput is bytes read plus bytes written over wall time
(GB = 10^9 bytes); GB/s is the best of the timed runs, with the median in parentheses where shown.

- **kernel**: one dispatch of the operator's packed FLOAT32 kernel on the engine's own buffers and
  pipeline, without transfers.
- **kernel / copy**: kernel throughput over that of `glsl/bench/copy.comp` (a plain copy of 16-byte
  vectors, same buffers, same workgroup count: the device's own ceiling), the two timed alternately;
  the median of the ratios of adjacent runs.
- **end-to-end**: `Engine.execute`: input copied into the device's buffer, dispatch, output copied
  out into a new array.
- **numpy, torch, onnxruntime**: the same operator in float32 on the CPU, output in a new array.
  End-to-end and peer runs are timed in blocks, not interleaved: each would otherwise inherit the
  allocator and cache state of its neighbour.
- **target**: the kernel reaches {TARGET:.2f} of the copy ceiling at 2^{TARGET_LOG2} elements (PASS or BELOW).
"""

_SECTION = re.compile(r"<!-- device: (?P<name>.*?) -->\n.*?<!-- end device -->", re.S)


@dataclass
class OpResult:
    name: str
    kernel: Samples
    copy: Samples                  # the copy runs timed just before this operator's
    end_to_end: Samples
    peers: dict[str, Samples] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Median over the runs of copy time / kernel time, each kernel run against the copy run just
        before it: drift slower than one pair cancels, where a ratio of two minima would mix the
        quietest moment of one with that of the other."""
        return statistics.median(c / k for c, k in zip(self.copy.seconds, self.kernel.seconds))


@dataclass
class SizeResult:
    log2: int
    nbytes: int                    # read plus written by one operator (or one copy)
    memcpy: Samples
    ops: list[OpResult]

    @property
    def copy(self) -> Samples:
        return Samples([t for op in self.ops for t in op.copy.seconds])


def _gbps(samples: Samples, nbytes: int, with_median: bool = True) -> str:
    best = f"{samples.gbps(nbytes):.2f}"
    return f"{best} ({samples.gbps(nbytes, median=True):.2f})" if with_median else best


def _binary(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(size: SizeResult, peers: list[str]) -> list[str]:
    numpy = "numpy" in peers
    head = ["operator", "kernel GB/s", "kernel / copy", "end-to-end GB/s", *(f"{p} GB/s" for p in peers)]
    head += ["vkact e2e / numpy"] * numpy + [f"target (≥{TARGET:.2f} of copy at 2^{TARGET_LOG2})"]
    lines = [_row(head), _row(["---"] * len(head))]
    n = size.nbytes
    for op in size.ops:
        cells = [f"`{op.name}`", _gbps(op.kernel, n), f"{op.ratio:.2f}", _gbps(op.end_to_end, n, with_median=False)]
        cells += [_gbps(op.peers[p], n, with_median=False) if p in op.peers else "—" for p in peers]
        if numpy:
            cells.append(f"{op.peers['numpy'].best / op.end_to_end.best:.2f}" if "numpy" in op.peers else "—")
        if size.log2 != TARGET_LOG2:
            cells.append("—")
        else:
            cells.append("PASS" if op.ratio >= TARGET else "BELOW")
        lines.append(_row(cells))
    return lines


def section(device_name: str, header: list[tuple[str, str]], sizes: list[SizeResult], peers: list[str]) -> str:
    """This device's section: header facts, then one table per size and the verdict on the target."""
    lines = [f"<!-- device: {device_name} -->", f"## {device_name}", ""]
    lines += [f"- **{key}:** {value}" for key, value in header]
    for size in sizes:
        each = _binary(size.nbytes // 2)
        lines += ["", f"### 2^{size.log2} FLOAT32 elements ({each} read + {each} written)", ""]
        lines.append(
            f"Copy shader (device ceiling): **{_gbps(size.copy, size.nbytes)}** GB/s · "
            f"host memcpy (`numpy.copyto`, one thread): **{_gbps(size.memcpy, size.nbytes)}** GB/s"
        )
        lines += ["", *_table(size, peers)]
    at_target = [s for s in sizes if s.log2 == TARGET_LOG2]
    if at_target:
        below = [f"`{op.name}` {op.ratio:.2f}" for op in at_target[0].ops if op.ratio < TARGET]
        verdict = "met by every kernel" if not below else "not met: " + ", ".join(below)
        lines += ["", f"**Target** (every kernel ≥ {TARGET:.2f} of the copy ceiling at 2^{TARGET_LOG2}): {verdict}."]
    lines += ["", "<!-- end device -->", ""]
    return "\n".join(lines)


def merge(existing: str, device_name: str, new_section: str) -> str:
    """The preamble, the other devices' sections as they were, and this device's new section (in its
    old place if it had one, else last)."""
    sections, replaced = [], False
    for match in _SECTION.finditer(existing):
        if match["name"] == device_name:
            sections.append(new_section)
            replaced = True
        else:
            sections.append(match[0] + "\n")
    if not replaced:
        sections.append(new_section)
    return PREAMBLE + "".join("\n" + s for s in sections)
