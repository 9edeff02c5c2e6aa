"""The messages between the HTTP process and its device worker, over two pipes (jobs one way, replies
the other: service.worker_lifecycle.WorkerLifecycle.start says why): each a 4-byte length and a payload.

Most payloads are pickled tuples. Those of repeated requests, the bulk of the traffic, have fixed
layouts instead (a tag byte and structs): "go" (job id, template id) and "ok" (job id, kernel
seconds) for a job alone, "batch" ((job id, template id) each) and "oks" (kernel seconds, the job ids)
for jobs of one dispatch: a few bytes where the pickled jobs took hundreds, and no pickle machinery on
either side. A pickle (protocol 2 and later) starts with 0x80, so the tags cannot be mistaken for one.

multiprocessing's Connection reads a message in two system calls (its length, then its bytes) with
a Python loop and a BytesIO around them; here a message is written in one call and one read takes
every message already there (both ends of a 1,024-element request: 5.8 -> 3.1 us a message, warm).
"""
from __future__ import annotations

import asyncio
import os
import pickle
import struct
from typing import Any

# What a lone job tells the worker besides its id (service.jobs.TemplateIds):
# key (the pickled descriptor), slot path and size, inputs, output, in place
Template = tuple[bytes, str, int, tuple[tuple[int, int], ...], tuple[int, int], bool]
PROTOCOL = pickle.HIGHEST_PROTOCOL  # plain tuples: pickle, not multiprocessing's ForkingPickler
_LENGTH = struct.Struct("<I")
_READ = 1 << 16
_COMPACT = {"go": (b"G", struct.Struct("<QI")), "ok": (b"K", struct.Struct("<Qd"))}  # job ids count up for the life of the server
_BY_TAG = {tag[0]: (kind, layout) for kind, (tag, layout) in _COMPACT.items()}
# each compact message whole, its length and tag included: one pack a message
_FRAMES = {kind: (struct.Struct("<Ic" + layout.format.lstrip("<")), 1 + layout.size, tag) for kind, (tag, layout) in _COMPACT.items()}
_BATCH, _BATCH_JOB = b"B", struct.Struct("<QI")       # then (job id, template id) per job
_OKS, _OKS_HEAD, _OKS_JOB = b"D", struct.Struct("<d"), struct.Struct("<Q")  # kernel seconds, then each job id


def encode(*msg: Any) -> bytes:
    """``msg`` (a tuple) as one framed message."""
    data = pickle.dumps(msg, PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def encode_compact(kind: str, *values: int | float) -> bytes:
    """A "go" or "ok" message (see the module's description)."""
    frame, size, tag = _FRAMES[kind]
    return frame.pack(size, tag, *values)


def encode_batch(jobs: list[tuple[int, int]]) -> bytes:
    """A "batch" message: the (job id, template id) of each job of one dispatch."""
    body = b"".join([_BATCH_JOB.pack(job, tid) for job, tid in jobs])
    return _LENGTH.pack(1 + len(body)) + _BATCH + body


def encode_oks(seconds: float, jobs: list[int]) -> bytes:
    """An "oks" message: the jobs of one dispatch all done, in ``seconds`` of kernel time."""
    body = _OKS_HEAD.pack(seconds) + b"".join([_OKS_JOB.pack(job) for job in jobs])
    return _LENGTH.pack(1 + len(body)) + _OKS + body


def write(fd: int, data: bytes) -> None:
    """Write ``data`` (one or more encoded messages) whole; the descriptor is blocking, so this
    returns once it is written."""
    written = os.write(fd, data)  # the whole of a small message (a pipe takes up to PIPE_BUF at once)
    while written < len(data):
        written += os.write(fd, memoryview(data)[written:])


def send(fd: int, *msg: Any) -> None:
    write(fd, encode(*msg))


class Writer:
    """Messages to the other end from an event loop, never blocking it: the descriptor is made
    non-blocking, what the pipe takes at once is written, and the rest (a message larger than the
    pipe's buffer while the worker is busy: a graph plan is 100 KiB at 64 nodes, the buffer 64 KiB)
    waits here and is written as the pipe drains. A message written while others wait goes after them,
    so the messages keep their order. Only this end's descriptor changes: the other end stays blocking."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        os.set_blocking(fd, False)
        self.fd, self._loop = fd, loop
        self._pending = bytearray()

    @property
    def pending(self) -> int:
        """Bytes waiting for room in the pipe."""
        return len(self._pending)

    def write(self, data: bytes) -> None:
        """Write ``data`` (one or more encoded messages) now, or after the bytes already waiting.
        OSError (other than a full pipe) when the other end is gone."""
        if self._pending:
            self._pending += data
            return
        try:
            written = os.write(self.fd, data)
        except BlockingIOError:
            written = 0
        if written < len(data):
            self._pending += memoryview(data)[written:]
            self._loop.add_writer(self.fd, self._drain)

    def send(self, *msg: Any) -> None:
        self.write(encode(*msg))

    def close(self) -> None:
        """Drop what waits (the other end is gone) and stop watching the descriptor."""
        if self._pending:
            self._pending.clear()
            self._loop.remove_writer(self.fd)

    def _drain(self) -> None:
        try:
            written = os.write(self.fd, self._pending)
        except BlockingIOError:
            return
        except OSError:  # the other end is gone: its exit is handled where the process is watched
            self.close()
            return
        del self._pending[:written]
        if not self._pending:
            self._loop.remove_writer(self.fd)


class Reader:
    """Messages from the read end of a pipe (or one end of a socket pair), in order. ``ready()`` reads once (call it when the descriptor
    is readable: it does not block then); ``next()`` blocks until a whole message is there."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def ready(self) -> list[tuple]:
        """Every whole message that one read completes ([] if it ends inside one); EOFError once the
        other end is closed."""
        msg = self._read()
        return [msg] if msg is not None else list(iter(self._take, None))

    def has_message(self) -> bool:
        """A whole message is already read: ``next()`` returns it without a system call."""
        buffer = self._buffer
        return len(buffer) >= _LENGTH.size and len(buffer) >= _LENGTH.size + _LENGTH.unpack_from(buffer)[0]

    def next(self) -> tuple:
        msg = self._take()
        while msg is None:
            msg = self._read()
            if msg is None:
                msg = self._take()
        return msg

    def _read(self) -> tuple | None:
        """One read. A lone compact message (a "go" or "ok": the bulk of them) that it brings whole with
        nothing buffered is decoded at once and returned; anything else is buffered for ``_take``."""
        try:
            data = os.read(self.fd, _READ)
        except BlockingIOError:  # a non-blocking end (an event loop may make it so) woken with nothing to read
            return None
        if not data:
            raise EOFError("the other end of the pipe is closed")
        if not self._buffer and len(data) > _LENGTH.size and _LENGTH.size + _LENGTH.unpack_from(data)[0] == len(data):
            compact = _BY_TAG.get(data[_LENGTH.size])
            if compact is not None:
                return (compact[0], *compact[1].unpack_from(data, _LENGTH.size + 1))
        self._buffer += data
        return None

    def _take(self) -> tuple | None:
        buffer = self._buffer
        if len(buffer) < _LENGTH.size:
            return None
        end = _LENGTH.size + _LENGTH.unpack_from(buffer)[0]
        if len(buffer) < end:
            return None
        tag, start = buffer[_LENGTH.size], _LENGTH.size + 1
        compact = _BY_TAG.get(tag)
        if compact is not None:
            msg = (compact[0], *compact[1].unpack_from(buffer, start))
        elif tag == _BATCH[0]:  # slices are copies: no view of the buffer may outlive the cut below
            msg = ("batch", tuple(_BATCH_JOB.iter_unpack(buffer[start:end])))
        elif tag == _OKS[0]:
            jobs = _OKS_JOB.iter_unpack(buffer[start + _OKS_HEAD.size : end])
            msg = ("oks", _OKS_HEAD.unpack_from(buffer, start)[0], tuple(job for job, in jobs))
        else:
            msg = pickle.loads(buffer[_LENGTH.size : end])  # a copy: the buffer is cut next
        del buffer[:end]
        return msg
