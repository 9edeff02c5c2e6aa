"""api.execution.write_whole's status line and headers, which it keeps from one answer to the next
(_head_bytes): each answer's own, whatever the previous one was: uvicorn's Date (a new default-header
list once a second), Connection: close, a header list with an X-Request-ID of its own."""
from __future__ import annotations

from types import SimpleNamespace

from service.api.execution import write_whole


class _Transport:
    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    @staticmethod
    def is_closing() -> bool:
        return False


def _answer(default_headers, headers, keep_alive: bool) -> bytes:
    cycle = SimpleNamespace(disconnected=False, response_started=False, waiting_for_100_continue=True, default_headers=default_headers,
                            keep_alive=keep_alive, transport=_Transport(), response_complete=False,
                            message_event=SimpleNamespace(set=lambda: None))
    assert write_whole(cycle, headers, b"body")
    return cycle.transport.written


def _expected(default_headers, headers, keep_alive: bool) -> bytes:
    lines = ["HTTP/1.1 200 OK", *(f"{n.decode()}: {v.decode()}" for n, v in [*default_headers, *headers])]
    return ("\r\n".join(lines + ([] if keep_alive else ["connection: close"])) + "\r\n\r\nbody").encode()


def test_each_answer_has_its_own_date_connection_and_request_id():
    frame = [(b"content-type", b"application/octet-stream"), (b"content-length", b"4")]
    second = [(b"date", b"Thu, 26 Nov 2026 13:00:00 GMT"), (b"server", b"uvicorn")]
    third = [(b"date", b"Thu, 26 Nov 2026 13:00:01 GMT"), (b"server", b"uvicorn")]
    answers = [
        (second, frame, True), (second, frame, True),   # the same: kept
        (third, frame, True),                            # the next second's list
        (third, frame, False),                           # Connection: close
        (third, [*frame, (b"x-request-id", b"a" * 32)], True),
        (third, [*frame, (b"x-request-id", b"b" * 32)], True),  # /v2: each answer's list its own
        (second, frame, True),                           # back to a list seen before
    ]
    for default_headers, headers, keep_alive in answers:
        assert _answer(default_headers, headers, keep_alive) == _expected(default_headers, headers, keep_alive)
