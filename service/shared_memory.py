"""Triton's system shared memory extension: regions of POSIX shared memory objects that clients create
(shm_open, e.g. tritonclient.utils.shared_memory) and register by name, so tensors travel through memory
instead of the HTTP body.

The registrations live in a small JSON file in /dev/shm (shared_file.SharedFile), so that every HTTP
process of one server (``--workers N``) sees the same regions: a client registers through one
connection and infers through another, which may reach another process.

A region's bytes are read and written with preadv/pwritev on a descriptor opened for the request, never
through a mapping: the client owns the object and may shrink it at any time, and touching a mapped page
past its new end would kill this process with SIGBUS. No descriptor is kept between requests.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np

from .errors import InvalidRequest, VkactError
from .shared_file import SharedFile, SharedFileWriteFailed
from .slots import write_in_thread

SHM_DIR = "/dev/shm"
RESERVED_PREFIX = "vkact-"  # the device worker's own slots: never a client's region
from .limits import SHM_MAX_NAME as MAX_NAME
LARGE_IO = 1 << 20  # region reads and writes above this size run in a thread, keeping the event loop free


class UnknownRegion(VkactError):
    status = 404


class RegistryFull(InvalidRequest):
    """max_shm_regions regions are registered already."""


RegistryWriteFailed = SharedFileWriteFailed  # the registry could not be written (no room in /dev/shm): nothing changed


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


class Region:
    """One request's access to a registered region: an open descriptor of its object, closed when the
    request ends. Every access checks the object's size first and reads or writes with pread/pwrite,
    which answer a short object with a short count instead of a signal."""

    def __init__(self, spec: RegionSpec) -> None:
        self.spec = spec
        self.nbytes = spec.byte_size
        try:
            self.fd = os.open(object_path(spec.key), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidRequest(f"cannot open shared memory object {spec.key!r}: {exc.strerror}", "key") from None
        try:
            if not stat.S_ISREG(os.fstat(self.fd).st_mode):
                raise InvalidRequest(f"shared memory object {spec.key!r} is not a shared memory object", "key")
        except BaseException:
            os.close(self.fd)
            raise

    def check_size(self, field: str | None) -> None:
        size = os.fstat(self.fd).st_size
        end = self.spec.offset + self.spec.byte_size
        if end > size:
            raise InvalidRequest(
                f"region {self.spec.name!r} (offset {self.spec.offset}, byte_size {self.spec.byte_size}) runs past "
                f"the end of shared memory object {self.spec.key!r} ({size} bytes)",
                field,
            )

    async def read_into(self, dst: np.ndarray, start: int, size: int, field: str | None) -> None:
        """``size`` bytes at ``start`` of the region into ``dst`` (bytes), the rest of ``dst`` zeroed."""
        dst[size:] = 0
        self.check_size(field)
        if await _io(os.preadv, self.fd, dst[:size], self.spec.offset + start) != size:
            raise self._shrunk(field)

    async def write(self, start: int, data: np.ndarray, field: str | None) -> None:
        """``data`` into the region at ``start``; an object shrunk before is refused (pwrite would extend it)."""
        self.check_size(field)
        try:
            done = await _io(os.pwritev, self.fd, data, self.spec.offset + start)
        except OSError as exc:  # ENOSPC: the client's object was sparse and /dev/shm is full
            raise InvalidRequest(f"cannot write region {self.spec.name!r}: {exc.strerror}", field) from None
        if done != data.nbytes:
            raise self._shrunk(field)

    def _shrunk(self, field: str | None) -> InvalidRequest:
        size = os.fstat(self.fd).st_size
        return InvalidRequest(f"shared memory object {self.spec.key!r} of region {self.spec.name!r} shrank to {size} bytes during the request", field)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class RegionInput:
    """An input tensor that is still in its region: the device worker reads it straight into the job's
    slot (``fill``), one copy where reading it into a buffer first made two."""

    region: Region
    start: int
    size: int
    nbytes: int  # the descriptor's buffer (``size`` rounded up to 4 bytes): what ``fill`` writes
    field: str | None

    async def fill(self, dst: np.ndarray) -> None:
        await self.region.read_into(dst, self.start, self.size, self.field)


async def _io(call, fd: int, buffer: np.ndarray, offset: int) -> int:
    """preadv/pwritev of ``buffer`` at ``offset`` until done or short (the object ended); the bytes
    done. Large transfers run in a thread."""
    view = memoryview(buffer).cast("B")
    nbytes, done = view.nbytes, 0
    while done < nbytes:
        part = [view[done:]]
        # a large preadv into a job's slot runs to its end even if the request is cancelled (see write_in_thread)
        n = await write_in_thread(call, fd, part, offset + done) if nbytes - done > LARGE_IO else call(fd, part, offset + done)
        if n <= 0:
            break
        done += n
    return done


class SharedMemoryRegistry:
    def __init__(self, registry_path: str, max_regions: int = 1024) -> None:
        self.path = registry_path
        self.max_regions = max_regions
        self._file: SharedFile[dict[str, RegionSpec]] = SharedFile(
            registry_path, "shared memory registry",
            lambda data: {name: RegionSpec(**entry) for name, entry in data.items()},
            lambda specs: {name: asdict(spec) for name, spec in specs.items()}, dict)

    def _current(self) -> dict[str, RegionSpec]:
        return self._file.current()

    def _changing(self):  # noqa: ANN202 - SharedFile.changing's context manager
        return self._file.changing()

    # -- the extension's operations --------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if len(name) > MAX_NAME:
            raise InvalidRequest(f"a shared memory region name is at most {MAX_NAME} characters; this one has {len(name)}", "name")
        spec = RegionSpec(name, key, offset, byte_size)
        with self._changing() as specs:
            if name in specs:
                raise InvalidRequest(f"shared memory region {name!r} is already registered", "name")
            if len(specs) >= self.max_regions:
                raise RegistryFull(
                    f"{len(specs)} shared memory regions are registered, the most this service keeps "
                    "(VKACT_MAX_SHM_REGIONS); unregister some first", "name"
                )
            region = Region(spec)  # opens and checks the object now: a bad key or size is a 400 here
            try:
                region.check_size("byte_size")
            finally:
                region.close()
            specs[name] = spec

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region; unknown names are not an error (Triton's behaviour)."""
        with self._changing() as specs:
            if name is None:
                specs.clear()
            else:
                specs.pop(name, None)

    def status(self, name: str | None = None) -> list[dict]:
        specs = self._current()
        if name is not None:
            if name not in specs:
                raise UnknownRegion(f"no system shared memory region {name!r} is registered")
            specs = {name: specs[name]}
        return [asdict(s) for s in specs.values()]

    @contextmanager
    def use(self, name: str) -> Iterator[Region]:
        """A registered region, opened for the duration of a request."""
        spec = self._current().get(name)
        if spec is None:  # 404 / NOT_FOUND, as Triton (since 2.42) answers an unknown region in an inference
            raise UnknownRegion(f"shared_memory_region {name!r} is not a registered system shared memory region")
        region = Region(spec)
        try:
            yield region
        finally:
            region.close()

    def close(self) -> None:
        """At shutdown: forget the registrations."""
        self._file.close()

