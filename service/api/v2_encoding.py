"""Content-Encoding on /v2 inferences, both ways, as tritonclient's request_compression_algorithm and
response_compression_algorithm use it: gzip, or deflate (a zlib stream), chosen by Accept-Encoding.
Large bodies are (de)compressed in a thread (zlib releases the GIL), so the event loop stays free."""
from __future__ import annotations

import asyncio
import zlib

from ..errors import InvalidRequest, PayloadTooLarge

LARGE = 1 << 20
COMPRESS_LEVEL = 1  # tensors are mostly float mantissas, which barely compress: a higher level costs CPU for little


class UnsupportedEncoding(InvalidRequest):
    status = 415
    headers = {"Accept-Encoding": "gzip, deflate"}  # RFC 7694: what the server does accept


def _inflate(data: memoryview, wbits: int, limit: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise PayloadTooLarge(f"the decompressed body exceeds {limit} bytes", "Content-Encoding")
    if not d.eof or d.unused_data:
        raise InvalidRequest("the compressed body is truncated or followed by other bytes", "Content-Encoding")
    return out


def _decompress(data: memoryview, coding: str, limit: int) -> bytes:
    try:
        if coding == "gzip":
            return _inflate(data, 31, limit)
        try:
            return _inflate(data, 15, limit)  # 'deflate' is a zlib stream (RFC 9110), as tritonclient sends
        except zlib.error:
            return _inflate(data, -15, limit)  # ... but some clients send a bare deflate stream
    except zlib.error as exc:
        raise InvalidRequest(f"the body is not valid {coding} data: {exc}", "Content-Encoding") from None


async def decode_body(body: memoryview, content_encoding: str | None, limit: int) -> memoryview:
    """The body with its Content-Encoding (gzip, deflate, identity) undone, at most ``limit`` bytes."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("identity", ""):
        return body
    if coding not in ("gzip", "deflate"):
        raise UnsupportedEncoding(f"Content-Encoding {content_encoding!r} is not supported; use gzip or deflate", "Content-Encoding")
    if len(body) > LARGE:
        return memoryview(await asyncio.to_thread(_decompress, body, coding, limit))
    return memoryview(_decompress(body, coding, limit))


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
