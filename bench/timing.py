"""Wall-clock timing, interleaved or in blocks.

Interleaved rounds (every task in turn) make drift on a shared machine (other tenants, frequency
changes) land on all tasks alike: right for kernels compared with the copy ceiling. Tasks that allocate
their output go in blocks instead: interleaved, each would inherit the allocator and cache state the
previous one left (measured at 2^20: numpy softsign 5 to 18 GB/s depending on its neighbour)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def percentile(self, q: int) -> float:
        """The q-th percentile (1 to 99), interpolated between the two nearest samples."""
        return statistics.quantiles(self.seconds, n=100, method="inclusive")[q - 1]

    def gbps(self, nbytes: int, median: bool = False) -> float:
        return nbytes / (self.median if median else self.best) / 1e9


def rounds(tasks: list[tuple[K, Callable[[], object]]], warmup: int, repeat: int) -> dict[K, Samples]:
    """Run the tasks in order ``warmup + repeat`` times; keep each task's last ``repeat`` times under
    its key (keys are unique: the copy run before each operator is its own task)."""
    samples: dict[K, Samples] = {}
    for r in range(warmup + repeat):
        for key, task in tasks:
            started = time.perf_counter()
            task()
            elapsed = time.perf_counter() - started
            if r >= warmup:
                samples.setdefault(key, Samples()).seconds.append(elapsed)
    return samples


def blocks(tasks: list[tuple[K, Callable[[], object]]], warmup: int, repeat: int) -> dict[K, Samples]:
    """Each task ``warmup + repeat`` times in a row, one task after the other."""
    return {key: rounds([(key, task)], warmup, repeat)[key] for key, task in tasks}
