"""Shared-memory tensor slots: files in /dev/shm that the HTTP process and its device worker both map.

The HTTP side (the pool: ``service.worker_lifecycle``; the jobs: ``service.worker``) creates, sizes and
removes slots and copies each request's tensors into one; the device worker process
(``service.worker_process``) maps the same file and runs the engine on views of it. Files are named by
the process that made them and when it started, so a server removes what a killed predecessor left
behind.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import mmap
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from .buckets import bucket
from .errors import Busy, PayloadTooLarge

log = logging.getLogger("vkact.slots")
ALIGN = 64
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


T = TypeVar("T")


async def write_in_thread(write: Callable[..., T], *args: object) -> T:
    """``write(*args)`` in a thread (numpy and preadv release the GIL), waited for to its end: when the
    caller is cancelled meanwhile (its request timed out, its client left), the cancellation reaches it
    only once the thread has stopped. The caller frees the slot the thread writes into on its way out
    and the next request takes that slot, so a thread still writing would put the old request's bytes
    over the new one's (seen on a loaded machine: a CELU request after a timed-out 64 MiB GELU one
    answered with the GELU input's ones in its first 128 bytes, which glibc's memcpy stores last)."""
    return await to_its_end(asyncio.get_running_loop().run_in_executor(None, write, *args))


async def to_its_end(future: asyncio.Future[T], stop: Callable[[], None] | None = None) -> T:
    """The result of ``future`` (a thread's work); when the caller is cancelled meanwhile, ``stop()``
    (asks the thread to end early) and the cancellation reaches the caller once the thread has ended,
    so that what the caller frees on its way out is no longer in the thread's hands."""
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if stop is not None:
            stop()
        while not future.done():
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:  # cancelled again: the thread still works
                pass
        raise
    except BaseException:
        # the thread's error: its traceback will hold this frame, which must not hold the future that
        # holds the error (a cycle keeps the thread's frames, an inflater's buffer, until a GC pass)
        del future
        raise


class Mapping:
    """A file-backed shared mapping; the creator unlinks the file, mappings stay valid until closed."""

    def __init__(self, path: str, size: int, create: bool) -> None:
        self.path, self.size = path, size
        fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
        try:
            if create:
                # Reserve the pages now: a sparse file in a full /dev/shm (Docker's default is 64 MB)
                # would SIGBUS the first process to touch them instead of failing here, cleanly.
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    os.unlink(path)
                    raise Busy(
                        f"no room for a {size}-byte tensor slot in {SHM_DIR} ({exc.strerror}); "
                        "give the service more shared memory (docker run --shm-size=2g)"
                    ) from None
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.mm, np.uint8)
        self.view = memoryview(self.mm)  # a slice assignment to it is a memcpy: no numpy parsing of slices

    def close(self) -> None:
        del self.array
        try:
            self.view.release()
            self.mm.close()
        except BufferError:  # a view still lives (a logged traceback's frame): unmapped when it dies
            pass


@dataclass
class Slot:
    mapping: Mapping
    busy: bool = False
    used: int = 0  # the pool's trim epoch when it was last taken (see SlotPool.trim)
    gone: bool = False  # removed from its pool (unmapped): never to be taken again


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22), or None if there
    is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_tag(pid: int) -> str:
    """PID-START: a process and when it started, which together name it across pid reuse."""
    return f"{pid}-{process_start(pid) or 0}"


#: A server's documents shared by its HTTP processes (shared_file.SharedFile): vkact-KIND-PID-START.json.
SERVER_FILES = ("regions", "graphs", "batching")   # shared-memory registrations; loaded graph models; models' batching


def server_file(kind: str, server: int) -> str:
    """The path of one of server ``server``'s shared documents (``kind`` one of SERVER_FILES)."""
    return os.path.join(SHM_DIR, f"vkact-{kind}-{owner_tag(server)}.json")


# vkact-PID-START-N (a tensor slot) and vkact-KIND-PID-START.json (a server's shared document, with its
# .lock, a .new-PID being written and its attachments, .TOKEN: shared_file.ATTACHMENT_TOKEN hex digits): the process that made the file, and when it started
_OWNED_NAME = re.compile(rf"vkact-(?:(?:{'|'.join(SERVER_FILES)})-)?(\d+)-(\d+)(?:-\d+|\.json(?:\.lock|\.new-\d+|\.[0-9a-f]{{16}})?)")


def sweep_stale_files(directory: str = SHM_DIR) -> list[str]:
    """Remove the files of processes that are gone: one killed (SIGKILL, OOM) cannot remove its own,
    and a Kubernetes memory-backed /dev/shm outlives container restarts, so slots would pile up until
    none fits, and a registry would hand a restarted server its predecessor's registrations. A file
    belongs to a live process only if one with its pid started when its name says (a restarted
    container's process often has the same pid). Returns the removed paths."""
    removed = []
    for name in os.listdir(directory):
        match = _OWNED_NAME.fullmatch(name)
        if match is None or process_start(int(match[1])) == int(match[2]):
            continue
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:  # gone already, or not ours to remove
            pass
    return removed


class SlotPool:
    """At most ``count`` slots holding at most ``budget`` bytes; a slot grows (is replaced by a bigger
    file) when a request needs it, and slots left unused between two trims are removed."""

    def __init__(self, count: int, on_forget, budget: int = 1 << 62) -> None:
        self.count = count
        self.budget = budget
        self.slots: list[Slot] = []
        self._epoch = 0
        self._names = itertools.count()
        self._prefix = f"vkact-{owner_tag(os.getpid())}-"
        self._on_forget = on_forget
        for path in sweep_stale_files():
            log.warning("removed %s, left in shared memory by a process that is gone", path)

    @property
    def bytes(self) -> int:
        return sum(s.mapping.size for s in self.slots)

    def acquire(self, nbytes: int) -> Slot:
        slot = None  # the smallest free slot that fits, found in one pass (every request asks)
        for s in self.slots:
            if not s.busy and s.mapping.size >= nbytes and (slot is None or s.mapping.size < slot.mapping.size):
                slot = s
        if slot is None:
            free = [s for s in self.slots if not s.busy]
            size = bucket(nbytes)
            if size > self.budget:
                raise PayloadTooLarge(
                    f"the request needs a {size}-byte tensor slot; this service's slots may hold {self.budget} bytes "
                    "in all (VKACT_SLOT_BYTES)"
                )
            busy = [s for s in self.slots if s.busy]
            if len(busy) >= self.count or sum(s.mapping.size for s in busy) + size > self.budget:
                raise Busy("the device queue is full (or its tensor memory is taken by requests in flight); retry shortly")
            # The smallest free slot gives way to the bigger one; then, while over the budget, the
            # other free slots, least recently used first.
            if free:
                smallest = min(free, key=lambda s: s.mapping.size)
                free.remove(smallest)
                self._remove(smallest)
            for old in sorted(free, key=lambda s: s.used):
                if self.bytes + size <= self.budget:
                    break
                self._remove(old)
            slot = Slot(Mapping(os.path.join(SHM_DIR, f"{self._prefix}{next(self._names)}"), size, True))
            self.slots.append(slot)
        slot.busy = True
        slot.used = self._epoch
        return slot

    def trim(self) -> int:
        """Remove the free slots not taken since the last trim (called every idle_release_s, so shared
        memory goes back within two periods). Returns how many were removed."""
        idle = [s for s in self.slots if not s.busy and s.used < self._epoch]
        for slot in idle:
            self._remove(slot)
        self._epoch += 1
        return len(idle)

    def take(self, slot: Slot) -> bool:
        """Take ``slot`` again (one that ``acquire`` gave before) if it is free and still this pool's."""
        if slot.busy or slot.gone:
            return False
        slot.busy = True
        slot.used = self._epoch
        return True

    @property
    def in_use(self) -> int:
        return sum(s.busy for s in self.slots)

    def _remove(self, slot: Slot) -> None:
        self.slots.remove(slot)
        self._destroy(slot)

    def _destroy(self, slot: Slot) -> None:
        slot.gone = True
        os.unlink(slot.mapping.path)
        slot.mapping.close()
        self._on_forget(slot.mapping.path)

    def close(self) -> None:
        for slot in self.slots:
            self._destroy(slot)
        self.slots.clear()
