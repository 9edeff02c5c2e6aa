"""The messages between the HTTP process and its device worker: pickled tuples, each behind a 4-byte
length, over the socket pair that ``multiprocessing.Pipe`` makes.

multiprocessing's Connection reads a message in two system calls (its length, then its bytes) with
a Python loop and a BytesIO around them; here a message is written in one call and one read takes
every message already there (both ends of a 1,024-element request: 5.8 -> 3.1 us a message, warm).
"""
from __future__ import annotations

import os
import pickle
import struct
from typing import Any

PROTOCOL = pickle.HIGHEST_PROTOCOL  # plain tuples: pickle, not multiprocessing's ForkingPickler
_LENGTH = struct.Struct("<I")
_READ = 1 << 16


def send(fd: int, *msg: Any) -> None:
    """Write ``msg`` (a tuple) whole; the descriptor is blocking, so this returns once it is written."""
    data = pickle.dumps(msg, PROTOCOL)
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class Reader:
    """Messages from one end of the pair, in order. ``ready()`` reads once (call it when the descriptor
    is readable: it does not block then); ``next()`` blocks until a whole message is there."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def ready(self) -> list[tuple]:
        """Every whole message that one read completes ([] if it ends inside one); EOFError once the
        other end is closed."""
        self._fill()
        return list(iter(self._take, None))

    def next(self) -> tuple:
        msg = self._take()
        while msg is None:
            self._fill()
            msg = self._take()
        return msg

    def _fill(self) -> None:
        data = os.read(self.fd, _READ)
        if not data:
            raise EOFError("the other end of the pipe is closed")
        self._buffer += data

    def _take(self) -> tuple | None:
        buffer = self._buffer
        if len(buffer) < _LENGTH.size:
            return None
        end = _LENGTH.size + _LENGTH.unpack_from(buffer)[0]
        if len(buffer) < end:
            return None
        msg = pickle.loads(buffer[_LENGTH.size : end])  # a copy: the buffer is cut next
        del buffer[:end]
        return msg
