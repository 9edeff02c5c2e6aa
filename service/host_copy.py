"""Large copies between a job's shared-memory slot and the engine's buffers, on two threads.

The device worker copies a job's inputs from its slot into the engine's buffers and the output back,
on its job thread, while the HTTP process and the client wait for it (a 16 MiB /v2 request: 1.3-2.2 ms
each way of ~6-12 ms in the worker, bench/RESULTS.md "16 MiB, step by step"). One thread's memcpy
leaves the host's memory bandwidth half used: on the 2-core bench machine, /dev/shm to anonymous
memory, one thread against two (this module): 4 MiB 328 -> 291 us, 8 MiB 619 -> 462, 16 MiB 1,260 -> 906,
64 MiB 7.8 -> 3.6 ms (below 4 MiB the helper's wake-up eats the gain). ``Copier`` splits a copy of at least
``SPLIT_BYTES`` into chunks that the calling thread and one helper thread take in turn (numpy's copy
releases the GIL); the caller takes every chunk the helper has not started, so a helper without a
CPU costs it at most the chunk the helper is on, for as long as that chunk takes the helper.

The helper thread starts with the Copier and inherits the CPUs and niceness of the thread that makes
it. The device worker makes its Copier in its main thread, at the job thread's niceness on all of
the service's CPUs, then moves the helper off the CPU it pins the job thread to (``place``;
service/worker_process.py): a helper made at the driver threads' niceness (10) got a few percent of a
CPU another process was busy on, and the job thread waited for its chunk (load 2.3-2.5: a 16 MiB
copy 2.5 -> 2.9 ms against one thread).
"""
from __future__ import annotations

import os
import threading

import numpy as np

SPLIT_BYTES = 4 << 20    # below this the helper's wake-up (tens of microseconds) costs what it saves
CHUNKS = 8               # a copy's pieces: the two threads' shares even out when one is slowed


class Copier:
    """Copies on the calling thread and one helper thread; one caller at a time (the engine's thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._idle = threading.Condition(self._lock)
        self._chunks: list[tuple[np.ndarray, np.ndarray]] = []
        self._next = 0           # the next chunk to take
        self._helper_busy = False
        self._closed = False
        self._error: BaseException | None = None  # the helper's, for the caller to raise
        self.helper_chunks = 0   # chunks the helper has copied (for tests and benchmarks)
        self._thread = threading.Thread(target=self._serve, name="vkact-copy", daemon=True)
        self._thread.start()

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst[...] = src`` for same-sized uint8 arrays; split over both threads from SPLIT_BYTES."""
        n = dst.nbytes
        if n < SPLIT_BYTES or self._closed:
            np.copyto(dst, src)
            return
        if src.nbytes != n:
            raise ValueError(f"a copy of {src.nbytes} bytes into {n}")
        step = -(-n // CHUNKS)
        chunks = [(dst[i : i + step], src[i : i + step]) for i in range(0, n, step)]
        with self._lock:
            self._chunks, self._next = chunks, 0
            self._work.notify()
        try:
            while (chunk := self._take()) is not None:
                np.copyto(*chunk)
        finally:  # even where a chunk failed: once this returns, nothing writes into dst any more
            with self._lock:
                self._next = len(self._chunks)  # no chunk handed out after this
                while self._helper_busy:
                    self._idle.wait()
                self._chunks = []
                error, self._error = self._error, None
        if error is not None:  # the helper's chunk failed: the copy did not happen
            raise error

    def _take(self) -> tuple[np.ndarray, np.ndarray] | None:
        with self._lock:
            if self._next >= len(self._chunks):
                return None
            self._next += 1
            return self._chunks[self._next - 1]

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._closed and self._next >= len(self._chunks):
                    self._work.wait()
                if self._closed:
                    return
                self._helper_busy = True
            try:
                while (chunk := self._take()) is not None:
                    np.copyto(*chunk)
                    self.helper_chunks += 1
            except BaseException as exc:  # noqa: BLE001 - raised by the caller's copy instead
                self._error = exc
            finally:
                with self._lock:
                    self._helper_busy = False
                    self._idle.notify()

    def place(self, cpus: frozenset[int]) -> bool:
        """Let the helper thread run on ``cpus`` only (Linux); False where that is refused."""
        try:
            os.sched_setaffinity(self._thread.native_id, cpus)  # type: ignore[arg-type]
            return True
        except (AttributeError, OSError):
            return False

    def close(self) -> None:
        """Stop the helper thread (copies after this run on the caller alone); again, nothing."""
        with self._lock:
            self._closed = True
            self._work.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()

