"""Content-Encoding on /v2 inferences, both ways, as tritonclient's request_compression_algorithm and
response_compression_algorithm use it: gzip, or deflate (a zlib stream), chosen by Accept-Encoding.
Large bodies are (de)compressed in threads (zlib releases the GIL), so the event loop stays free, and
inflated within the process's budget of request bytes in flight (service/inflight.py); gRPC's
compressed messages are inflated here too (grpc.transport)."""
from __future__ import annotations

import asyncio
import mmap
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ...errors import InvalidRequest, PayloadTooLarge
from ...inflight import Claim
from ...slots import to_its_end

LARGE = 1 << 20
MAPPED = 1 << 20


# Two threads inflate the bodies and messages that do not end in their first step: whatever arrives at
# once, at most two steps of output are being made, and the loop competes with two threads at most
# (zlib releases the GIL). Not niced: a thread of lower priority preempted while it holds the GIL keeps
# the loop waiting (32 bombs at once, nice 10: probes' p50 3 ms but max 1.0-1.3 s; nice 0: 9-13 ms, max
# 0.2-0.9 s; the machine at load 12-16).
_INFLATE_THREADS = ThreadPoolExecutor(2, thread_name_prefix="vkact-inflate")
# One more counts the bodies that can only be refused (their gzip trailer announces more than the limit):
# however many arrive, they take one CPU at most, and a legitimate body never waits behind them.
_COUNT_THREAD = ThreadPoolExecutor(1, thread_name_prefix="vkact-count")

COMPRESS_LEVEL = 1  # tensors are mostly float mantissas, which barely compress: a higher level costs CPU for little


class UnsupportedEncoding(InvalidRequest):
    status = 415
    headers = {"Accept-Encoding": "gzip, deflate"}  # RFC 7694: what the server does accept


def _buffer(nbytes: int) -> np.ndarray:
    """An output buffer; past MAPPED bytes in an anonymous mapping of its own, whose pages are mapped as
    they are written and all given back to the kernel when the array dies. malloc'd, a buffer under
    glibc's adaptive mmap threshold (up to 32 MiB) stays in the heap of the thread that freed it: 32
    bombs at once took the peak 68 MiB past the budget that way, 12 MiB with mappings (measured)."""
    if nbytes < MAPPED:
        return np.empty(nbytes, np.uint8)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)


class Inflater:
    """One compressed body undone in steps of at most ``STEP`` output bytes, within the request's claim
    on the process's budget of bytes in flight (service/inflight.py).

    The output goes into a buffer that grows as it comes (np.empty: pages are mapped as they are
    written), each step charged to ``claim``. Where the budget has no room for more (other requests
    hold it), or gzip's trailer already announces more than ``limit``, nothing more is kept: the rest is
    inflated only to be counted, so the answer is still the true one, 413 as soon as ``limit`` is
    passed (or when the whole could never fit the budget), else the stream is inflated again into a
    buffer of its size if that fits now, or 503 with Retry-After. Memory is then one step per thread,
    however many bombs arrive at once. ``noun`` names what is inflated in messages (body, message)."""

    STEP = 1 << 20
    FEED = 1 << 16  # compressed bytes handed to zlib at a time: what it leaves of them is copied each step

    def __init__(self, data: memoryview | bytes, coding: str, limit: int, claim: Claim, noun: str = "body") -> None:
        self.data, self.coding, self.limit, self.claim, self.noun = data, coding, limit, claim, noun
        # 'deflate' is a zlib stream (RFC 9110), as tritonclient sends it; some clients send a bare one
        self.wbits = 31 if coding == "gzip" else (15 if data[:1] and data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0 else -15)
        self.stream = zlib.decompressobj(self.wbits)
        self.view = memoryview(data)
        self.fed = 0                                 # bytes of data handed to zlib
        self.pending: memoryview | bytes = b""       # what zlib left of them
        # gzip's trailer gives the size (mod 2**32): taken as a first guess, it saves the copies of
        # growing; past the limit, the stream is counted from the start (a valid one is that large)
        size_hint = int.from_bytes(data[-4:], "little") if coding == "gzip" and len(data) >= 18 else 0
        self.out: np.ndarray | None = _buffer(size_hint) if size_hint <= limit else None
        self.filled = 0   # bytes made so far, kept or only counted
        self.kept = 0     # bytes of ``out`` charged to the claim
        self.prepaid = False  # ``out`` has the stream's size and is charged whole (_again)
        self.stopped = False  # its request was cancelled: the thread ends at its next step (stop)

    def step(self) -> bool:
        """Inflate up to STEP bytes more; True once the stream has ended."""
        if not self.pending:  # fed a slice at a time: zlib copies what it leaves (unconsumed_tail) with the GIL held
            self.pending = self.view[self.fed : self.fed + self.FEED]
            self.fed += len(self.pending)
        try:
            chunk = self.stream.decompress(self.pending, self.STEP)
        except zlib.error as exc:
            if self.wbits == 15 and self.filled == 0:  # a bare deflate stream that looked like a zlib header
                self.wbits, self.stream, self.pending, self.fed = -15, zlib.decompressobj(-15), b"", 0
                return self.step()
            raise InvalidRequest(f"the {self.noun} is not valid {self.coding} data: {exc}", "Content-Encoding") from None
        self.pending = self.stream.unconsumed_tail
        end = self.filled + len(chunk)
        if end > self.limit:
            raise PayloadTooLarge(f"the decompressed {self.noun} exceeds {self.limit} bytes", "Content-Encoding")
        if self.out is not None:
            self._keep(chunk, end)
        self.filled = end
        if self.stream.eof:
            if self.stream.unused_data or self.fed < len(self.view):
                raise InvalidRequest(f"the compressed {self.noun} is followed by other bytes", "Content-Encoding")
            if self.out is None:  # valid and within the limit, but counted only: the budget had no room
                self.claim.grow(self.filled)  # 413 if it never fits, 503 (Busy) while others hold the room
                self._again()
            return True
        if not self.pending and self.fed == len(self.view) and not chunk:
            raise InvalidRequest(f"the compressed {self.noun} is truncated", "Content-Encoding")
        return False

    def _again(self) -> None:
        """Inflate the whole stream again, into a buffer of its size, already charged to the claim: what
        was only counted fits now (a deflate stream, whose growing buffer's copies did not fit beside
        the others, or one that met a full budget)."""
        self.stream, self.pending, self.fed = zlib.decompressobj(self.wbits), b"", 0
        self.out, self.filled, self.prepaid = _buffer(self.filled), 0, True
        while not self.stopped and not self.step():
            pass

    def _keep(self, chunk: bytes, end: int) -> None:
        assert self.out is not None
        grow = end > self.out.nbytes
        if self.prepaid:
            self.out[self.filled : end] = np.frombuffer(chunk, np.uint8)
            return
        # the step's bytes, and while the buffer grows the copy of what it holds: both charged
        extra = len(chunk) + (self.filled if grow else 0)
        if not self.claim.try_grow(extra):
            self.out = None  # count the rest: keep nothing
            self.claim.shrink(self.kept)
            self.kept = 0
            return
        if grow:
            grown = _buffer(min(self.limit, max(end, 2 * self.out.nbytes)))
            grown[: self.filled] = self.out[: self.filled]
            self.out = grown
            self.claim.shrink(self.filled)  # the old buffer is gone
        self.out[self.filled : end] = np.frombuffer(chunk, np.uint8)
        self.kept = end

    def rest(self) -> None:
        while not self.stopped and not self.step():
            pass

    def stop(self) -> None:
        """Its request was cancelled: no step after the one under way (nobody will read the output)."""
        self.stopped = True

    def result(self) -> memoryview:
        assert self.out is not None
        return memoryview(self.out[: self.filled])


async def decode_body(body: memoryview, content_encoding: str | None, limit: int, claim: Claim) -> memoryview:
    """The body with its Content-Encoding (gzip, deflate, identity) undone, at most ``limit`` bytes,
    within ``claim``. The first step runs on the event loop (a small body ends there); the rest in a
    thread (zlib releases the GIL), so a body that inflates to hundreds of megabytes never holds the loop."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("identity", ""):
        return body
    if coding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding {content_encoding!r} is not supported; use gzip or deflate", "Content-Encoding")
    return await inflated(Inflater(body, coding, limit, claim), first_on_loop=True)


async def inflated(inflater: Inflater, first_on_loop: bool) -> memoryview:
    """``inflater``'s output: its first step on the loop if ``first_on_loop``, the rest in the inflating
    threads; one that can only be refused (counted from the start) all in the counting thread. A
    cancellation (gRPC: the client's reset, the deadline, the connection lost) reaches the caller once
    the thread has stopped: the thread charges its steps to the request's claim, which the caller
    releases on its way out, and bytes charged after that would be lost to the budget for good."""
    loop = asyncio.get_running_loop()
    if inflater.out is None:
        await to_its_end(loop.run_in_executor(_COUNT_THREAD, inflater.rest), inflater.stop)
    elif not (first_on_loop and inflater.step()):
        await to_its_end(loop.run_in_executor(_INFLATE_THREADS, inflater.rest), inflater.stop)
    return inflater.result()


# -- responses ---------------------------------------------------------------------------------------


def choose_encoding(accept: str | None) -> str | None:
    """gzip, deflate or None (identity) from Accept-Encoding, by q-value; the first listed wins a tie."""
    if not accept:
        return None
    best, best_q = None, 0.0
    for part in accept.split(","):
        coding, _, params = part.partition(";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        coding = "gzip" if coding == "*" else coding
        if coding in ("gzip", "deflate", "identity") and q > best_q:
            best, best_q = coding, q
    return None if best == "identity" else best


def _compress(body: bytes | memoryview, coding: str) -> bytes:
    # gzip: the gzip container; deflate: a zlib stream, which is what HTTP's "deflate" means (RFC 9110)
    c = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return c.compress(body) + c.flush()


async def compress(body: bytes | memoryview, coding: str) -> bytes:
    if len(body) > LARGE:
        return await asyncio.to_thread(_compress, body, coding)
    return _compress(body, coding)
