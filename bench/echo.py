"""The bare HTTP ceiling of the service benchmark: ``python -m bench.echo --port P``.

A raw ASGI callable (no Starlette, no FastAPI: nothing between uvicorn and the body) that reads each
request's whole body and answers with it, served by uvicorn with vkact's own settings (httptools,
uvloop, one process, no access log; see service/__main__.py). Whatever vkact's /v1/execute costs
beyond this endpoint is the framework, the request handling and the device."""
from __future__ import annotations

import argparse
from typing import Any, Awaitable, Callable

import uvicorn

Message = dict[str, Any]


async def app(scope: Message, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    # Chunks go straight into one buffer of the declared length: joining a list of chunks instead
    # costs a third more time per 16 MiB request (measured), and a ceiling should not be handicapped.
    declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    buffer = bytearray(int(declared) if declared is not None else 0)
    filled = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        end = filled + len(chunk)
        if end > len(buffer):  # no (or a wrong) Content-Length
            buffer.extend(bytes(end - len(buffer)))
        buffer[filled:end] = chunk
        filled = end
        if not message.get("more_body", False):
            break
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(filled).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": memoryview(buffer)[:filled]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.echo", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    # The same uvicorn settings as ``python -m service`` (service/__main__.py).
    uvicorn.run(app, host=args.host, port=args.port, workers=1, loop="uvloop", http="httptools",
                log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
