"""A raw HTTP/2 client (the h2 package) for gRPC tests at the wire: what grpcio would hide or refuse to
send (no content-type, huge metadata, streams left open), with every frame's outcome visible."""
from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def framed(msg: bytes) -> bytes:
    """gRPC's length-prefixed message: uncompressed flag, 4-byte big-endian length, bytes."""
    return b"\0" + len(msg).to_bytes(4, "big") + msg


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One raw HTTP/2 frame (RFC 9113 section 4.1), for clients that do not follow the protocol."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream_id.to_bytes(4, "big") + payload


def literal_headers(headers: list[tuple[str, str]]) -> bytes:
    """An HPACK block of literal fields without indexing (no Huffman): names and values under 127 bytes."""
    out = b""
    for name, value in headers:
        out += b"\0" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()
    return out


def unread_calls(address: str, path: str, bodies: list[bytes], huge_window: bool,
                 headers: list[tuple[str, str]] | None = None) -> socket.socket:
    """A connection that sends one call of ``path`` per body (its framed messages) and never reads: with
    HTTP/2's 64 KiB window its answers wait in h2grpc's queues; with ``huge_window`` (2 GiB, the
    connection's too) in the transport's write buffer, past what the kernel holds (a 4 KiB receive
    buffer here)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    settings = (4).to_bytes(2, "big") + (2**31 - 1).to_bytes(4, "big") if huge_window else b""
    out = PREFACE + frame(4, 0, 0, settings)
    if huge_window:
        out += frame(8, 0, 0, (2**31 - 1 - 65535).to_bytes(4, "big"))
    block = literal_headers([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "vkact"),
                             ("content-type", "application/grpc"), *(headers or []), ("te", "trailers")])
    for i, body in enumerate(bodies):  # in DATA frames of HTTP/2's default largest size, 16 KiB
        out += frame(1, 4, 2 * i + 1, block) + b"".join(
            frame(0, int(at + 16384 >= len(body)), 2 * i + 1, body[at:at + 16384]) for at in range(0, max(len(body), 1), 16384))
    sock.sendall(out)
    return sock


@dataclass
class Answer:
    """How one stream ended: the response headers, the body, the trailers, or the reset's error code."""
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None

    @property
    def status(self) -> str | None:
        """grpc-status: in the trailers, or in a trailers-only answer's headers."""
        return self.trailers.get("grpc-status", self.headers.get("grpc-status"))

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))


class H2Client:
    """One connection to ``address`` (host:port). ``call`` sends a request and reads until that stream ends
    (END_STREAM or RST_STREAM); the socket's timeout (60 s) only guards the test against a hang."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8", validate_outbound_headers=False)
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        self.answers: dict[int, Answer] = {}
        self.ended: set[int] = set()
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.pings_acked = 0
        self.closed = False  # the server closed the connection
        self._flush()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> H2Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.closed = True
            raise ConnectionError("the server closed the connection")
        for event in self.conn.receive_data(data):
            sid = getattr(event, "stream_id", None)
            answer = self.answers.setdefault(sid, Answer()) if sid else None
            if isinstance(event, h2.events.ResponseReceived):
                answer.headers = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                answer.body += event.data
                self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
            elif isinstance(event, h2.events.TrailersReceived):
                answer.trailers = dict(event.headers)
            elif isinstance(event, h2.events.StreamEnded):
                self.ended.add(sid)
            elif isinstance(event, h2.events.StreamReset):
                answer.reset = event.error_code
                self.ended.add(sid)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event
            elif isinstance(event, h2.events.PingAckReceived):
                self.pings_acked += 1
        self._flush()

    def pinging(self, done: Callable[[], bool], seconds: float = 30) -> bool:
        """A PING every 0.1 s (once the server has not said GOAWAY), reading what comes, until ``done()``:
        whether it came before ``seconds`` passed. The server closing the connection ends the wait."""
        deadline = time.monotonic() + seconds
        while not done():
            if self.closed or time.monotonic() > deadline:
                return False
            if self.goaway is None:
                self.conn.ping(os.urandom(8))
                self._flush()
            if select.select([self.sock], [], [], 0.1)[0]:
                try:
                    self._read()
                except ConnectionError:
                    pass
        return True

    def start(self, path: str, headers: list[tuple[str, str]] | None = None,
              content_type: str | None = "application/grpc") -> int:
        sid = self.conn.get_next_available_stream_id()
        base = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "vkact"), ("te", "trailers")]
        if content_type is not None:
            base.append(("content-type", content_type))
        self.conn.send_headers(sid, base + (headers or []))
        self._flush()
        return sid

    def send(self, sid: int, data: bytes, end: bool = True) -> None:
        """``data`` on stream ``sid`` as flow control allows (reading the server's WINDOW_UPDATEs)."""
        while data:
            room = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if room <= 0:
                self._read()
                continue
            self.conn.send_data(sid, data[:room])
            data = data[room:]
            self._flush()
        if end:
            self.conn.end_stream(sid)
            self._flush()

    def wait(self, sid: int) -> Answer:
        while sid not in self.ended:
            self._read()
        return self.answers.setdefault(sid, Answer())

    def call(self, path: str, message: bytes, headers: list[tuple[str, str]] | None = None,
             content_type: str | None = "application/grpc") -> Answer:
        sid = self.start(path, headers, content_type)
        self.send(sid, framed(message))
        return self.wait(sid)
