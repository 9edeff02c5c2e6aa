"""One checked execution of an operator on the engine's buffers (``Engine._plan``): its dispatch, the
views of the slot's mapped memory it copies through, and the engine's counters.

The copies are the whole of what an execution costs beyond its kernel on a CPU device: large ones go
on two threads (``host_copy``); a replayed job's small ones are memoryview assignments prepared once
(``_Plan.bound``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import kp
import numpy as np

from .host_copy import SPLIT_BYTES, Copier


@dataclass
class EngineStats:
    pipelines_created: int = 0
    pipelines_destroyed: int = 0
    buffers_allocated: int = 0
    slots_evicted: int = 0
    dispatches: int = 0
    kernel_seconds: float = 0.0     # wall time of the device submission (upload, dispatch, download)
    bytes_in: int = 0
    bytes_out: int = 0
    direct_dispatches: int = 0      # of them, run on a job's slot itself (engine_direct): nothing copied

    def count(self, seconds: float, bytes_in: int, bytes_out: int) -> None:
        """One dispatch of ``seconds`` that took ``bytes_in`` and gave ``bytes_out``."""
        self.kernel_seconds += seconds
        self.dispatches += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out


@dataclass
class Prepared:
    """What one execution dispatches: the pipeline on a slot's buffers and its push constants."""

    algorithm: kp.Algorithm
    push: np.ndarray
    slot: _Slot
    meta: list[int] | None   # the strided kernels' layout table
    clear: bool              # the output has gaps to zero first
    workgroups: int = 1      # of the dispatch


@dataclass
class _Plan:
    """One checked execution of an operator: its Prepared dispatch on a slot's buffers, views of the
    slot's mapped memory cut once (numpy slicing costs about a microsecond a request), and how to
    dispatch it: (keyed executions) a command buffer recorded once and replayed."""

    prepared: Prepared
    dispatch: Callable[[], object]
    stats: EngineStats
    copier: Copier              # the engine's: large copies on two threads
    inputs: list[np.ndarray]    # each input tensor's bytes
    result: np.ndarray          # the output's bytes from its first to one past its last element
    cleared: np.ndarray | None  # the whole output, zeroed before a strided kernel writes into it
    meta: np.ndarray | None     # the strided kernels' layout table (uint32)

    def run(self, arrays: Sequence[np.ndarray], out: np.ndarray) -> float:
        """Inputs in, dispatch, output out (``arrays`` and ``out`` checked by the caller); returns the
        dispatch's seconds."""
        copy = self.copier.copy
        for view, data in zip(self.inputs, arrays):
            copy(view, data)
        seconds = self._dispatch()
        span = self.result.nbytes  # in place, the output is the input buffer, whole
        copy(out[:span], self.result)
        if span < out.nbytes:
            out[span:] = 0
        self.stats.count(seconds, sum(map(len, arrays)), out.nbytes)
        return seconds

    def bound(self, arrays: Sequence[np.ndarray], out: np.ndarray) -> Callable[[], float]:
        """``run(arrays, out)`` for buffers that stay the same from call to call (a replayed job's
        views of its slot): each copy is a memoryview assignment prepared here, a memcpy, where a
        numpy assignment parses its slices and picks a copy loop each time (the device worker's job
        thread, 1,024-element /v1 requests: its message read -> dispatch 5.6-6.5 -> 4.2-5.3 us, the
        output copied out 2.1-2.4 -> 0.5 us)."""
        span = self.result.nbytes
        if max(span, *map(len, arrays)) >= SPLIT_BYTES:  # a large job: its copies on two threads (host_copy)
            return partial(self.run, arrays, out)
        copies = [(memoryview(view), memoryview(data)) for view, data in zip(self.inputs, arrays)]
        head, result = memoryview(out)[:span], memoryview(self.result)
        tail = out[span:] if span < out.nbytes else None
        bytes_in, bytes_out = sum(map(len, arrays)), out.nbytes

        def run() -> float:
            for view, data in copies:
                view[:] = data
            seconds = self._dispatch()
            head[:] = result
            if tail is not None:
                tail[...] = 0
            self.stats.count(seconds, bytes_in, bytes_out)
            return seconds

        return run

    def _dispatch(self) -> float:
        """The dispatch, after what a strided kernel needs written first; its seconds."""
        if self.cleared is not None:
            self.cleared[...] = 0  # gaps between strided elements must not leak old data
        if self.meta is not None:
            self.meta[...] = self.prepared.meta
        started = time.perf_counter()
        self.dispatch()
        return time.perf_counter() - started


@dataclass
class _Slot:
    """Buffers of one capacity: inputs, output and the strided kernels' layout table."""

    capacity: int
    used: int = 0  # the engine's trim epoch at its last use (see Engine.trim)
    tensors: dict[str, kp.Tensor] = field(default_factory=dict)
    views: dict[str, np.ndarray] = field(default_factory=dict)   # uint8 views of mapped memory
