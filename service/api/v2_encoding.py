"""Content-Encoding on /v2 inferences, both ways, as tritonclient's request_compression_algorithm and
response_compression_algorithm use it: gzip, or deflate (a zlib stream), chosen by Accept-Encoding.
Large bodies are (de)compressed in a thread (zlib releases the GIL), so the event loop stays free."""
from __future__ import annotations

import asyncio
import zlib

import numpy as np

from ..errors import InvalidRequest, PayloadTooLarge

LARGE = 1 << 20
COMPRESS_LEVEL = 1  # tensors are mostly float mantissas, which barely compress: a higher level costs CPU for little


class UnsupportedEncoding(InvalidRequest):
    status = 415
    headers = {"Accept-Encoding": "gzip, deflate"}  # RFC 7694: what the server does accept


class _Inflater:
    """One compressed body undone in steps of at most ``STEP`` output bytes into a buffer that grows as
    they come (np.empty: pages are mapped as they are written): past ``limit`` bytes it stops, 413,
    without making the rest; the peak is the output so far and one step."""

    STEP = 1 << 20

    def __init__(self, data: memoryview, coding: str, limit: int) -> None:
        self.data, self.coding, self.limit = data, coding, limit
        # 'deflate' is a zlib stream (RFC 9110), as tritonclient sends it; some clients send a bare one
        self.wbits = 31 if coding == "gzip" else (15 if data[:1] and data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0 else -15)
        self.stream = zlib.decompressobj(self.wbits)
        self.pending: memoryview | bytes = data
        # gzip's trailer gives the size (mod 2**32): taken as a first guess, it saves the copies of growing
        size_hint = int.from_bytes(data[-4:], "little") if coding == "gzip" and len(data) >= 18 else 0
        self.out = np.empty(min(size_hint, limit), np.uint8)
        self.filled = 0

    def step(self) -> bool:
        """Inflate up to STEP bytes more; True once the stream has ended."""
        try:
            chunk = self.stream.decompress(self.pending, self.STEP)
        except zlib.error as exc:
            if self.wbits == 15 and self.filled == 0:  # a bare deflate stream that looked like a zlib header
                self.wbits, self.stream, self.pending = -15, zlib.decompressobj(-15), self.data
                return self.step()
            raise InvalidRequest(f"the body is not valid {self.coding} data: {exc}", "Content-Encoding") from None
        self.pending = self.stream.unconsumed_tail
        end = self.filled + len(chunk)
        if end > self.limit:
            raise PayloadTooLarge(f"the decompressed body exceeds {self.limit} bytes", "Content-Encoding")
        if end > self.out.nbytes:
            grown = np.empty(min(self.limit, max(end, 2 * self.out.nbytes)), np.uint8)
            grown[: self.filled] = self.out[: self.filled]
            self.out = grown
        self.out[self.filled : end] = np.frombuffer(chunk, np.uint8)
        self.filled = end
        if self.stream.eof:
            if self.stream.unused_data:
                raise InvalidRequest("the compressed body is followed by other bytes", "Content-Encoding")
            return True
        if not self.pending and not chunk:
            raise InvalidRequest("the compressed body is truncated", "Content-Encoding")
        return False

    def rest(self) -> None:
        while not self.step():
            pass

    def result(self) -> memoryview:
        return memoryview(self.out[: self.filled])


async def decode_body(body: memoryview, content_encoding: str | None, limit: int) -> memoryview:
    """The body with its Content-Encoding (gzip, deflate, identity) undone, at most ``limit`` bytes.
    The first step runs on the event loop (a small body ends there); the rest in a thread (zlib
    releases the GIL), so a body that inflates to hundreds of megabytes never holds the loop."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("identity", ""):
        return body
    if coding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding {content_encoding!r} is not supported; use gzip or deflate", "Content-Encoding")
    inflater = _Inflater(body, coding, limit)
    if not inflater.step():
        await asyncio.to_thread(inflater.rest)
    return inflater.result()


# -- responses ---------------------------------------------------------------------------------------


def choose_encoding(accept: str | None) -> str | None:
    """gzip, deflate or None (identity) from Accept-Encoding, by q-value; the first listed wins a tie."""
    best, best_q = None, 0.0
    for part in (accept or "").split(","):
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
