"""A server that costs (almost) nothing: ``python -m bench.canned --port P --answer FILE``.

It reads each HTTP/1.1 request (head and Content-Length body, into one reused buffer) and writes the same
prebuilt response, FILE's bytes, whatever was asked. The Triton bench gives it vkact's checked answer to the
16 MiB request, so that tritonclient.http, timed against it, shows its own ceiling on this machine: the
MB/s no server can beat with that client (bench/triton.py)."""
from __future__ import annotations

import argparse
import socket
import threading
from pathlib import Path

MAX_HEAD = 1 << 16


def _serve(conn: socket.socket, answer: bytes) -> None:
    pending = bytearray()
    body = bytearray()
    with conn:
        while True:
            while (end := pending.find(b"\r\n\r\n")) < 0:
                chunk = conn.recv(MAX_HEAD)
                if not chunk or len(pending) > MAX_HEAD:
                    return
                pending += chunk
            length = 0
            for line in bytes(pending[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            del pending[:end + 4]
            have = min(length, len(pending))
            del pending[:have]
            if len(body) < length - have:
                body = bytearray(length - have)
            view, need = memoryview(body), length - have
            while need:
                got = conn.recv_into(view[:need])
                if not got:
                    return
                need -= got
            conn.sendall(answer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.canned", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer", type=Path, required=True, help="the whole HTTP response, head and body")
    parser.add_argument("--log-level", default="warning")  # as bench.service launches every server
    args = parser.parse_args(argv)
    answer = args.answer.read_bytes()
    with socket.create_server((args.host, args.port), backlog=16) as listener:
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=_serve, args=(conn, answer), daemon=True).start()


if __name__ == "__main__":
    main()
