"""The worker channel's messages (service/framing.py): whole messages in order, however the bytes arrive,
over the pipes the device worker uses and over a socket pair alike."""
from __future__ import annotations

import os
import pickle
import socket
import struct
import threading

import pytest

from service import framing


class _End:
    """One end of a pipe, used as the tests use a socket's (fileno, sendall, close, a context)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> _End:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.fixture(params=["pipe", "socketpair"])
def channel(request: pytest.FixtureRequest):
    """Makes (the writing end, the reading end): a pipe, as between the HTTP process and its worker (one
    each way), or a socket pair."""
    def make():
        if request.param == "socketpair":
            return socket.socketpair()
        read, write = os.pipe()
        return _End(write), _End(read)
    return make


def test_messages_arrive_whole_and_in_order(channel):
    a, b = channel()
    with a, b:
        reader = framing.Reader(b.fileno())
        framing.send(a.fileno(), "run", [(1, b"key", "/dev/shm/x", 64, [(0, 16)], (16, 16), False)])
        framing.send(a.fileno(), "forget", "/dev/shm/x")
        framing.send(a.fileno(), "stop")
        assert reader.ready() == [("run", [(1, b"key", "/dev/shm/x", 64, [(0, 16)], (16, 16), False)]), ("forget", "/dev/shm/x"), ("stop",)]


def test_a_message_split_across_reads(channel):
    """Bytes written a few at a time: ready() returns only whole messages, next() waits for the rest."""
    a, b = channel()
    with a, b:
        reader = framing.Reader(b.fileno())
        data = pickle.dumps(("done", [(7, "done", 0.25, 1)]))
        frame = struct.pack("<I", len(data)) + data
        a.sendall(frame[:3])
        assert reader.ready() == []
        a.sendall(frame[3:10])
        assert reader.ready() == []
        rest = threading.Timer(0.05, a.sendall, (frame[10:],))
        rest.start()
        assert reader.next() == ("done", [(7, "done", 0.25, 1)])
        rest.join()


def test_a_large_message_is_written_whole(channel):
    """Larger than a pipe's or socket's buffer: send() loops over partial writes while the other end reads."""
    a, b = channel()
    with a, b:
        payload = os.urandom(4 << 20)
        writer = threading.Thread(target=framing.send, args=(a.fileno(), "ready", payload))
        writer.start()
        assert framing.Reader(b.fileno()).next() == ("ready", payload)
        writer.join()


def test_the_other_end_closing_is_eof(channel):
    a, b = channel()
    reader = framing.Reader(b.fileno())
    framing.send(a.fileno(), "stop")
    a.close()
    assert reader.next() == ("stop",)
    with pytest.raises(EOFError):
        reader.next()
    b.close()


def test_compact_messages_among_pickled_ones(channel):
    """A repeated request's "go" and "ok" have fixed layouts; they mix with pickled messages in one
    write and arrive as the same tuples as any other message."""
    a, b = channel()
    with a, b:
        reader = framing.Reader(b.fileno())
        template = (b"key", "/dev/shm/x", 64, ((0, 16),), (16, 16), False)
        framing.write(a.fileno(), framing.encode("template", 3, template) + framing.encode_compact("go", 41, 3))
        framing.write(a.fileno(), framing.encode_compact("ok", 41, 2.5e-05) + framing.encode("stop"))
        assert reader.ready() == [("template", 3, template), ("go", 41, 3), ("ok", 41, 2.5e-05), ("stop",)]
        # a batch's jobs and its answer: variable length, split anywhere
        data = framing.encode_batch([(2**40, 3), (2**40 + 1, 255)]) + framing.encode_oks(1.5e-05, [2**40, 2**40 + 1])
        got = []
        for i in range(len(data)):
            a.sendall(data[i : i + 1])
            got += reader.ready()
        assert got == [("batch", ((2**40, 3), (2**40 + 1, 255))), ("oks", 1.5e-05, (2**40, 2**40 + 1))]


def test_batch_and_oks_messages(channel):
    a, b = channel()
    with a, b:
        reader = framing.Reader(b.fileno())
        framing.write(a.fileno(), framing.encode_batch([(2**40, 3), (7, 255)]) + framing.encode_oks(1.5e-05, [2**40, 7])
                      + framing.encode_oks(0.0, [9]))
        assert reader.ready() == [("batch", ((2**40, 3), (7, 255))), ("oks", 1.5e-05, (2**40, 7)), ("oks", 0.0, (9,))]


def test_a_compact_message_split_across_reads(channel):
    a, b = channel()
    with a, b:
        reader = framing.Reader(b.fileno())
        frame = framing.encode_compact("go", 2**40, 7)
        assert len(frame) == 4 + 1 + 12  # a fortieth of a pickled job
        for i in range(len(frame) - 1):
            a.sendall(frame[i : i + 1])
            assert reader.ready() == []
        a.sendall(frame[-1:])
        assert reader.ready() == [("go", 2**40, 7)]


def test_the_writer_keeps_what_the_channel_cannot_take_in_order(channel):
    """framing.Writer (the event loop's end): a message larger than the channel's buffer is written in
    part, the rest waits, later messages go after it, and all arrive whole and in order as the other
    end reads; nothing ever blocks the writing side."""
    import asyncio

    async def scenario() -> None:
        a, b = channel()
        with a, b:
            loop = asyncio.get_running_loop()
            writer = framing.Writer(a.fileno(), loop)
            big = os.urandom(4 << 20)
            writer.send("graph", big)             # returns at once: most of it waits
            assert writer.pending > 0
            writer.send("forget", "/dev/shm/x")   # after the big one, never before
            writer.write(framing.encode_compact("go", 9, 1))
            reader = framing.Reader(b.fileno())
            got = [await asyncio.to_thread(reader.next) for _ in range(3)]  # the loop drains meanwhile
            assert got == [("graph", big), ("forget", "/dev/shm/x"), ("go", 9, 1)]
            assert writer.pending == 0
            writer.send("stop")                   # room again: written at once
            assert writer.pending == 0 and reader.next() == ("stop",)

    asyncio.run(scenario())
