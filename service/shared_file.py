"""A small JSON document that every HTTP process of one server (``--workers N``) shares: a file in
/dev/shm, named after the server (supervisor.registry_owner), swept with the server's other files when it
dies (slots.sweep_stale_files) and removed when it stops.

A change takes an exclusive flock on a separate lock file, reads the document, writes a new file and
renames it over the old one, so a full /dev/shm fails the change, never the document, and a reader (no
lock) sees the old document or the new one whole. Readers reparse only when the file was replaced: an
unchanged document costs one stat. Large texts (a graph model's config, up to 1 MiB) are
attachments beside it (``{path}.{token}``) that the document names, so a change never makes every
process reparse them all on its event loop.

A change runs in a thread (``in_thread``: the lock may wait on another process); a caller cancelled
meanwhile (its client left, its deadline passed) abandons it unless its write has begun, and is
answered only when the thread is done, so a cancelled change leaves nothing behind and nothing of it
lands after a later change.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from .errors import VkactError

T = TypeVar("T")
R = TypeVar("R")
#: Hex digits of an attachment's token (slots._OWNED_NAME sweeps ``.json.`` and this many of them).
ATTACHMENT_TOKEN = 16


class SharedFileWriteFailed(VkactError):
    """The document could not be written (no room in /dev/shm): nothing changed."""

    status = 507


class Abandoned(Exception):
    """The change's caller was cancelled before its write began: nothing was written."""


class Commit:
    """Whether a change handed to a thread is written: ``begin`` (under the file's lock, just before the
    write) lets it go ahead unless the caller abandoned it first; one that began completes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = self._begun = False

    def begin(self) -> None:
        with self._lock:
            if self._abandoned:
                raise Abandoned
            self._begun = True

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True


async def in_thread(change: Callable[[Commit], R]) -> R:
    """``change(commit)`` in a thread, off the event loop; it passes ``commit`` to ``SharedFile.changing``.
    Cancelled before the write began, the change is abandoned (``change`` undoes what it did before,
    as it does for any failure); cancelled after, it completes. Either way CancelledError comes only
    once the thread is done: whoever changes the file next (a reload the caller's lock held back) comes
    after it, never before."""
    commit = Commit()
    done = asyncio.ensure_future(asyncio.to_thread(change, commit))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:   # (shield marks what ``done`` raises, Abandoned or a failure, as retrieved)
        commit.abandon()
        await asyncio.wait([done])
        raise


class SharedFile(Generic[T]):
    """The document at ``path`` as ``decode`` makes it of the JSON (``encode`` makes JSON of it again);
    ``what`` names it in errors. ``empty()`` is the document while there is no file."""

    def __init__(self, path: str, what: str, decode: Callable[[Any], T], encode: Callable[[T], Any], empty: Callable[[], T]) -> None:
        self.path = path
        self.what = what
        self._decode, self._encode, self._empty = decode, encode, empty
        self._seen: tuple[int, int, int] | None = None  # (inode, mtime, size) of the file last parsed
        self._value: T = empty()

    def current(self) -> T:
        """The document, reparsed only when the file was replaced (a rename is atomic: no lock). An
        unchanged file costs one stat, and so does an absent one, the usual case of a document read on a
        request's path (an open that fails as well was 2 system calls)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            self._absent()
            return self._value
        if (info.st_ino, info.st_mtime_ns, info.st_size) != self._seen:
            self._reload()
        return self._value

    def _absent(self) -> None:
        """No file: the empty document (once more only if the file was there when last read)."""
        if self._seen is not None:
            self._seen, self._value = None, self._empty()

    def _reload(self) -> None:
        """Parse the file as it is now (perhaps replaced again since it was stat'ed: the one opened is kept)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # removed since the stat
            self._absent()
            return
        try:
            info = os.fstat(fd)
            self._value, self._seen = self._parse(fd, info.st_size), (info.st_ino, info.st_mtime_ns, info.st_size)
        finally:
            os.close(fd)

    def _parse(self, fd: int, size: int) -> T:
        raw = os.pread(fd, size, 0)
        return self._decode(json.loads(raw)) if raw else self._empty()

    def _fresh(self) -> T:
        """The document as the file holds it now, parsed again and not kept: a change (under the lock,
        perhaps in a thread) must not start from what a concurrent ``current()`` keeps."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return self._empty()
        try:
            return self._parse(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    @contextmanager
    def changing(self, commit: Commit | None = None) -> Iterator[T]:
        """The document to change (parsed for the change), under the lock; written (a new file,
        renamed) when the block ends without an exception and ``commit`` (see ``in_thread``) lets it."""
        try:
            lock = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # no inode left in /dev/shm
            raise SharedFileWriteFailed(f"the {self.what} could not be locked ({exc.strerror}): nothing changed") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            value = self._fresh()
            yield value
            if commit is not None:
                commit.begin()
            self._write(value)
        finally:
            os.close(lock)  # releases the lock

    def _write(self, value: T) -> None:
        data = json.dumps(self._encode(value)).encode()
        temporary = f"{self.path}.new-{os.getpid()}"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                # Reserve the blocks first: on tmpfs a write into a full filesystem may be short.
                os.posix_fallocate(fd, 0, len(data))
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, "short write")
            finally:
                os.close(fd)
            os.rename(temporary, self.path)
        except OSError as exc:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise SharedFileWriteFailed(
                f"the {self.what} could not be written ({exc.strerror}): nothing changed; "
                f"free room in {os.path.dirname(self.path)} and retry"
            ) from None

    # -- attachments: texts too large to reparse with the document on every change ----------------------

    def attach(self, token: str, text: str) -> None:
        """Write ``text`` beside the document as ``{path}.{token}`` (``token``: ATTACHMENT_TOKEN hex digits,
        new each time), before the document names it: a reader finds it whole. Nothing is left when it fails."""
        path = self._attachment(token)
        data = text.encode("utf-8", "surrogatepass")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, max(1, len(data)))
                if os.write(fd, data) != len(data):
                    raise OSError(errno.ENOSPC, "short write")
            finally:
                os.close(fd)
        except OSError as exc:
            self.detach(token)
            raise SharedFileWriteFailed(f"the {self.what} could not be written ({exc.strerror}): nothing changed; "
                                        f"free room in {os.path.dirname(self.path)} and retry") from None

    def attached(self, token: str) -> str | None:
        """The text attached as ``token``; None when it is gone (its entry was replaced or removed meanwhile)."""
        try:
            with open(self._attachment(token), "rb") as f:
                return f.read().decode("utf-8", "surrogatepass")
        except FileNotFoundError:
            return None

    def detach(self, token: str) -> None:
        try:
            os.unlink(self._attachment(token))
        except FileNotFoundError:
            pass

    def _attachment(self, token: str) -> str:
        assert len(token) == ATTACHMENT_TOKEN and all(c in "0123456789abcdef" for c in token), token
        return f"{self.path}.{token}"

    def close(self) -> None:
        """At shutdown: remove the document and its attachments."""
        directory, name = os.path.split(self.path)
        for entry in os.listdir(directory or "."):
            if entry == name or entry.startswith(name + "."):
                try:
                    os.unlink(os.path.join(directory, entry))
                except FileNotFoundError:
                    pass
