"""A large request body kept as the chunks it arrived in (api/execution.py read_body), so that its tensor
bytes are copied once, from the chunks into the job's slot in the worker's copy thread, where gathering
them into one buffer first cost a second copy of every byte, on the event loop, into freshly faulted pages.
A route that needs the body whole (its JSON header not seen before, a compressed body) joins it, in a
thread, as read_body used to."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from ..slots import write_in_thread

LARGE = 1 << 20  # gathers above this size run in a thread (as worker.LARGE: numpy releases the GIL)


class Chunks:
    """The body's chunks (bytes, in order) and where each starts."""

    __slots__ = ("chunks", "starts", "nbytes")

    def __init__(self, chunks: Sequence[bytes]) -> None:
        self.chunks = list(chunks)
        self.starts = [0, *accumulate(len(c) for c in self.chunks)]
        self.nbytes = self.starts[-1]

    def __len__(self) -> int:
        return self.nbytes

    def gather(self, dst: np.ndarray, start: int) -> None:
        """Copy the bytes from ``start`` on into ``dst`` (uint8, at most what is left)."""
        end, cursor = start + dst.nbytes, 0
        for chunk, at in zip(self.chunks, self.starts):
            lo, hi = max(start, at), min(end, at + len(chunk))
            if lo < hi:
                dst[cursor : cursor + hi - lo] = np.frombuffer(chunk, np.uint8, hi - lo, lo - at)
                cursor += hi - lo

    def head(self, n: int) -> bytes:
        """The first ``n`` bytes (a JSON header: small), as one bytes object."""
        out = np.empty(n, np.uint8)
        self.gather(out, 0)
        return out.tobytes()

    async def joined(self) -> memoryview:
        """The whole body in one buffer (a copy, in a thread when large: the loop stays free)."""
        out = np.empty(self.nbytes, np.uint8)
        if self.nbytes > LARGE:
            await asyncio.get_running_loop().run_in_executor(None, self.gather, out, 0)  # a buffer of its own
        else:
            self.gather(out, 0)
        return memoryview(out)

    def source(self, start: int, size: int, nbytes: int) -> ChunkInput:
        """The ``size`` bytes at ``start`` as a job's input of ``nbytes`` (zero-padded: a descriptor's buffer
        is rounded up to 4 bytes)."""
        return ChunkInput(self, start, size, nbytes)


class ChunkInput:
    """An input tensor still in the body's chunks: written straight into the job's slot (worker.Source)."""

    __slots__ = ("body", "start", "size", "nbytes")

    def __init__(self, body: Chunks, start: int, size: int, nbytes: int) -> None:
        self.body, self.start, self.size, self.nbytes = body, start, size, nbytes

    def _fill(self, dst: np.ndarray) -> None:
        self.body.gather(dst[: self.size], self.start)
        dst[self.size :] = 0

    async def fill(self, dst: np.ndarray) -> None:
        if self.nbytes > LARGE:  # into a slot: to its end even if the request is cancelled (write_in_thread)
            await write_in_thread(self._fill, dst)
        else:
            self._fill(dst)
