"""gRPC's status at the wire: the codes, a call's answer as a code and message (RpcError), grpc-message's
encoding and length, grpc-timeout's decoding (gRPC over HTTP/2, grpc/doc/PROTOCOL-HTTP2.md)."""
from __future__ import annotations

import re

from ...limits import MAX_STATUS_MESSAGE

# gRPC status codes (grpc/doc/statuscodes.md)
OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 8, 12, 13, 14

_TIMEOUT = re.compile(rb"(\d{1,8})([HMSmun])")
_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def deadline_seconds(value: bytes) -> float | None:
    """grpc-timeout (gRPC over HTTP/2: up to 8 digits and a unit) in seconds; None if malformed."""
    m = _TIMEOUT.fullmatch(value)
    return int(m[1]) * _UNITS[m[2]] if m else None


def percent_encoded(message: str) -> bytes:
    """grpc-message's encoding: UTF-8, with '%' and bytes outside printable ASCII as %XX."""
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in message.encode("utf-8", "replace"))


def status_text(message: str) -> str:
    """``message`` within MAX_STATUS_MESSAGE characters: its middle (where an echoed input sits) elided."""
    if len(message) <= MAX_STATUS_MESSAGE:
        return message
    head, tail = MAX_STATUS_MESSAGE // 2, MAX_STATUS_MESSAGE // 4
    return f"{message[:head]} ... ({len(message) - head - tail} characters elided) ... {message[-tail:]}"


class RpcError(Exception):
    """A call's answer as a gRPC status and message, raised by a route or the transport."""

    def __init__(self, code: int, message: str) -> None:
        self.code, self.message = code, message
