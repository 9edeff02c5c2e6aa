"""Kernels run straight on a shared-memory slot's pages, where the device's memory is the host's.

The device worker's jobs come in shared-memory slots (``service.slots``): the HTTP process reads a
request's tensors into one, and the engine copies them into a buffer of its own, dispatches, and copies
the answer back. On a CPU device (lavapipe, SwiftShader) both buffers are the same kind of memory, so the
two copies are all the extra they cost: 4-5 ms of a 16 MiB SHRINK request on llvmpipe, beside a kernel of
3-4 ms. Where the device has VK_EXT_external_memory_host, the slot's mapping is imported as a buffer's
memory once (kp patch 11: ``Manager.import_host``), each of a job's tensors gets a buffer on its range
(``Manager.tensor_view``), and a repeated job replays a command buffer recorded on them: nothing is
copied. On a discrete GPU the copying path also moves the tensors through staging memory to the device and back,
and the kernel on the slot reads and writes host memory across the bus instead (0.10-0.21 of the copying replay's
time on an H200). ``Tuning.slot_import_bytes`` says where this is used (CPU devices and NVIDIA's discrete GPUs:
see device_tuning).

Only what runs as one packed elementwise dispatch qualifies (no layout table, no gaps to clear), with
every tensor a whole number of 16-byte units (the kernels read and write whole units: a partial one would
reach past the tensor into its neighbour's bytes). The rest keeps the copying path. A slot's import
lives until the worker unmaps the slot (``release``), and each run's pipeline until it is evicted
(least recently used, at most ``limit`` runs) or its slot is released.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import kp
import numpy as np

from .dispatch_geometry import UNIT_BYTES

if TYPE_CHECKING:
    from .engine_plan import EngineStats
    from .engine_pool import BufferPool

log = logging.getLogger("vkact.engine")
MAX_IMPORT_BYTES = (1 << 32) - (1 << 16)  # kp sizes a tensor in 32 bits: a larger slot imports its first 4 GiB


@dataclass
class _Region:
    """One slot mapping imported whole: the tensor on its memory."""

    tensor: kp.Tensor
    size: int


@dataclass
class _Run:
    """One job's dispatch on its slot: its tensors' views, the pipeline and the command buffer recorded."""

    region: int           # the slot mapping's address
    views: list[kp.Tensor]
    algorithm: kp.Algorithm
    sequence: kp.Sequence
    bytes_in: int
    bytes_out: int
    used: int = 0


class DirectRuns:
    """The engine's direct runs: imports by slot address, runs by (address, key, ranges)."""

    def __init__(self, mgr: kp.Manager, alignment: int, limit: int) -> None:
        self._mgr, self._alignment, self._limit = mgr, alignment, limit
        self._regions: dict[int, _Region] = {}
        self._runs: OrderedDict[tuple, _Run] = OrderedDict()
        # runs evicted to make room since the last trim: at `limit`, the hot jobs outnumber the runs kept
        # and every request would make a pipeline for one another evicts; new jobs then copy till the trim
        self._evicted = 0

    def run_for(self, region: np.ndarray, inputs: Sequence[tuple[int, int]], output: tuple[int, int], key: Hashable,
                make: Callable[[list[kp.Tensor]], tuple[kp.Algorithm, kp.Sequence]]) -> tuple[tuple, _Run] | None:
        """The run of the job whose input and output ranges ((offset, bytes) in ``region``, a slot's whole
        mapping) are given, made with ``make(views)`` on first use; None where the ranges or the mapping
        cannot be imported (the caller copies instead)."""
        address = region.__array_interface__["data"][0]
        ranges = (*inputs, output)
        run_key = (address, key, ranges)
        run = self._runs.get(run_key)
        if run is not None:
            self._runs.move_to_end(run_key)
            return run_key, run
        if not self._fits(address, region.nbytes, ranges) or self._evicted >= self._limit:
            return None
        views: dict[tuple[int, int], kp.Tensor] = {}
        try:
            imported = self._region(address, region.nbytes)
            for offset, n in ranges:  # an in-place job's output range is its input's: one view
                if (offset, n) not in views:
                    views[(offset, n)] = self._mgr.tensor_view(imported.tensor, offset, n)
            algorithm, sequence = make([views[r] for r in ranges])
        except RuntimeError as exc:  # kp's: no import of these pages, or no buffer at an offset (SwiftShader binds
            # storage buffers at multiples of 256, the slots lay tensors out at 64): this job copies
            for view in views.values():
                view.destroy()
            log.info("a job on slot memory at %#x copies instead of running there: %s", address, exc)
            return None
        except BaseException:
            for view in views.values():
                view.destroy()
            raise
        while len(self._runs) >= self._limit:  # room made once the new run exists: a refused job evicts none
            self._drop(next(iter(self._runs)))
            self._evicted += 1
        run = self._runs[run_key] = _Run(address, list(views.values()), algorithm, sequence, sum(n for _, n in inputs), output[1])
        return run_key, run

    def replayer(self, run_key: tuple, run: _Run, pool: BufferPool, stats: EngineStats,
                 check_thread: Callable[[], None]) -> Callable[[], float | None]:
        """The dispatch of ``run`` (``run_for``'s) to repeat: it returns its seconds, counted in ``stats``, or
        None without running once the run is gone (evicted, trimmed, its slot released). A dispatch that
        raises destroys the run, so that the job's next replayer is made anew."""
        run.used = pool.epoch
        evaluate = run.sequence.eval

        def replay() -> float | None:
            check_thread()
            if not self.is_live(run_key, run):
                return None
            run.used = pool.epoch
            started = time.perf_counter()
            try:
                evaluate()
            except BaseException:
                self.discard(run_key, run)
                raise
            seconds = time.perf_counter() - started
            stats.count(seconds, run.bytes_in, run.bytes_out)
            stats.direct_dispatches += 1
            return seconds

        return replay

    def is_live(self, run_key: tuple, run: _Run) -> bool:
        return self._runs.get(run_key) is run

    def discard(self, run_key: tuple, run: _Run) -> None:
        """Destroy a run whose dispatch failed: the job's next replayer is made anew, not handed it back."""
        if self.is_live(run_key, run):
            self._drop(run_key)

    def release(self, region: np.ndarray) -> None:
        """Destroy everything on the slot mapping ``region`` (before the worker unmaps it)."""
        self._release(region.__array_interface__["data"][0])

    def trim(self, epoch: int) -> None:
        """Drop the runs not used since the engine's last trim (their pipelines are JIT code on a CPU)."""
        for run_key in [k for k, run in self._runs.items() if run.used < epoch]:
            self._drop(run_key)
        self._evicted = 0

    def close(self) -> None:
        for address in {*self._regions, *(run.region for run in self._runs.values())}:
            self._release(address)

    def _release(self, address: int) -> None:
        for run_key in [k for k, run in self._runs.items() if run.region == address]:
            self._drop(run_key)
        imported = self._regions.pop(address, None)
        if imported is not None:
            imported.tensor.destroy()

    def _fits(self, address: int, size: int, ranges: Sequence[tuple[int, int]]) -> bool:
        """Every range a whole number of units inside the importable part of the mapping, and two ranges
        either the same (an in-place job's output is its input) or apart."""
        if address % self._alignment:
            return False
        usable = self._usable(size)
        if any(n <= 0 or n % UNIT_BYTES or offset % UNIT_BYTES or offset + n > usable for offset, n in ranges):
            return False
        spans = sorted(set(ranges))
        return all(a_off + a_n <= b_off for (a_off, a_n), (b_off, _) in zip(spans, spans[1:]))

    def _region(self, address: int, size: int) -> _Region:
        imported = self._regions.get(address)
        if imported is not None and imported.size != size:  # unmapped without release, mapped again here
            self._release(address)
            imported = None
        if imported is None:
            imported = self._regions[address] = _Region(self._mgr.import_host(address, self._usable(size)), size)
        return imported

    def _usable(self, size: int) -> int:
        """The part of a mapping of ``size`` bytes that is imported: whole alignment units, within kp's sizes."""
        return min(size // self._alignment * self._alignment, MAX_IMPORT_BYTES)

    def _drop(self, run_key: tuple) -> None:
        run = self._runs.pop(run_key)
        run.sequence.destroy()
        run.algorithm.destroy()
        for view in run.views:
            view.destroy()
