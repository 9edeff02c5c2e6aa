"""Triton's system shared memory extension: regions of POSIX shared memory objects that clients create
(shm_open, e.g. tritonclient.utils.shared_memory) and register by name, so tensors travel through memory
instead of the HTTP body.

The registrations live in a small JSON file in /dev/shm, locked with flock, so that every HTTP process of
one server (``--workers N``) sees the same regions: a client registers through one connection and infers
through another, which may reach another process. Each process maps a region's object itself, at first
use, and drops its mapping once the region is no longer registered (at its next registry access). A
mapping still being read or written by a request is closed when that request lets go of it.
"""
from __future__ import annotations

import fcntl
import json
import mmap
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from .errors import InvalidRequest, VkactError

SHM_DIR = "/dev/shm"
RESERVED_PREFIX = "vkact-"  # the device worker's own slots: never a client's region


class UnknownRegion(VkactError):
    status = 404


@dataclass(frozen=True)
class RegionSpec:
    name: str
    key: str
    offset: int
    byte_size: int


def object_path(key: str) -> str:
    """The file of a shm_open key: one optional leading '/', then a name without '/' (shm_open's rule,
    which also keeps a key from naming anything outside /dev/shm)."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise InvalidRequest(f"shared memory key {key!r} is not a valid shm_open name", "key")
    if name.startswith(RESERVED_PREFIX):
        raise InvalidRequest(f"shared memory key {key!r} names one of this service's own objects", "key")
    return os.path.join(SHM_DIR, name)


class _Mapping:
    """One process's mapping of a registered region; ``users`` requests hold views of it."""

    def __init__(self, spec: RegionSpec) -> None:
        self.spec = spec
        self.users = 0
        self.retired = False
        try:
            fd = os.open(object_path(spec.key), os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            raise InvalidRequest(f"cannot open shared memory object {spec.key!r}: {exc.strerror}", "key") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidRequest(f"shared memory object {spec.key!r} is not a shared memory object", "key")
            self._check_size(info.st_size)
            self.mm = mmap.mmap(fd, spec.offset + spec.byte_size)  # keeps its own descriptor
        finally:
            os.close(fd)

    def _check_size(self, size: int) -> None:
        end = self.spec.offset + self.spec.byte_size
        if end > size:
            raise InvalidRequest(
                f"region {self.spec.name!r} (offset {self.spec.offset}, byte_size {self.spec.byte_size}) runs past "
                f"the end of shared memory object {self.spec.key!r} ({size} bytes)",
                "byte_size",
            )

    def array(self) -> np.ndarray:
        """The region's bytes. The object's size is checked first: touching pages of an object that a
        client truncated after registering would kill this process with SIGBUS."""
        self._check_size(self.mm.size())
        return np.frombuffer(self.mm, np.uint8, self.spec.byte_size, self.spec.offset)

    def close_if_unused(self) -> None:
        if self.retired and self.users == 0 and not self.mm.closed:
            try:
                self.mm.close()
            except BufferError:  # a view outlived its request: the mapping is unmapped with the last view
                pass


class SharedMemoryRegistry:
    def __init__(self, registry_path: str) -> None:
        self.path = registry_path
        self._mappings: dict[str, _Mapping] = {}

    # -- the shared registration file ------------------------------------------------------------------

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[tuple[int, dict[str, RegionSpec]]]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            raw = os.pread(fd, os.fstat(fd).st_size, 0)
            specs = {name: RegionSpec(**entry) for name, entry in json.loads(raw or b"{}").items()}
            yield fd, specs
        finally:
            os.close(fd)  # releases the lock

    def _write(self, fd: int, specs: dict[str, RegionSpec]) -> None:
        data = json.dumps({name: asdict(spec) for name, spec in specs.items()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)

    def _sync(self, specs: dict[str, RegionSpec]) -> None:
        """Drop this process's mappings of regions that are gone or were registered anew."""
        for name, mapping in list(self._mappings.items()):
            if specs.get(name) != mapping.spec:
                del self._mappings[name]
                mapping.retired = True
                mapping.close_if_unused()

    # -- the extension's operations --------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        spec = RegionSpec(name, key, offset, byte_size)
        with self._locked(exclusive=True) as (fd, specs):
            self._sync(specs)
            if name in specs:
                raise InvalidRequest(f"shared memory region {name!r} is already registered", "name")
            mapping = _Mapping(spec)  # opens and checks the object now: a bad key or size is a 400 here
            specs[name] = spec
            self._write(fd, specs)
        self._mappings[name] = mapping

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region; unknown names are not an error (Triton's behaviour)."""
        with self._locked(exclusive=True) as (fd, specs):
            if name is None:
                specs.clear()
            else:
                specs.pop(name, None)
            self._write(fd, specs)
            self._sync(specs)

    def status(self, name: str | None = None) -> list[dict]:
        with self._locked(exclusive=False) as (_, specs):
            self._sync(specs)
        if name is not None:
            if name not in specs:
                raise UnknownRegion(f"no system shared memory region {name!r} is registered")
            specs = {name: specs[name]}
        return [{"name": s.name, "key": s.key, "offset": s.offset, "byte_size": s.byte_size} for s in specs.values()]

    @contextmanager
    def use(self, name: str) -> Iterator[np.ndarray]:
        """The bytes of a registered region, mapped in this process, for the duration of a request."""
        with self._locked(exclusive=False) as (_, specs):
            self._sync(specs)
        spec = specs.get(name)
        if spec is None:
            raise InvalidRequest(f"shared_memory_region {name!r} is not a registered system shared memory region")
        mapping = self._mappings.get(name)
        if mapping is None:
            mapping = self._mappings[name] = _Mapping(spec)
        mapping.users += 1
        try:
            yield mapping.array()
        finally:
            mapping.users -= 1
            mapping.close_if_unused()

    def close(self) -> None:
        """At shutdown: release every mapping and forget the registrations."""
        for mapping in self._mappings.values():
            mapping.retired = True
            mapping.close_if_unused()
        self._mappings.clear()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
