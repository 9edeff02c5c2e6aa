"""The inference routes, served before FastAPI's middleware stack and router.

``POST /v1/execute`` and ``POST /v2/models/{model}[/versions/{version}]/infer`` carry every inference;
FastAPI still declares them (their OpenAPI entries, and the fallback for scopes this module does not
take), but VkactApp answers them first with the same handler functions and the same error handlers,
skipping Starlette's middleware, FastAPI's routing and its dependency solving: about 40 us of a
1,024-element request's 90 us in the HTTP process, measured in-process with the device stubbed.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from . import errors
from .v1 import routes as v1
from .v2 import routes as v2
from .runtime import Runtime

Handler = Callable[..., Awaitable[Response]]


def route(method: str, path: str) -> tuple[Handler, dict[str, str]] | None:
    """The inference handler of a request and its path parameters, or None (FastAPI routes it)."""
    if method != "POST":
        return None
    if path == "/v1/execute":
        return v1.execute, {}
    parts = path.split("/")  # "", "v2", "models", model, "infer" | ..., "versions", version, "infer"
    if len(parts) >= 5 and parts[1] == "v2" and parts[2] == "models" and parts[-1] == "infer" and parts[3]:
        if len(parts) == 5:
            return v2.infer, {"model": parts[3]}
        if len(parts) == 7 and parts[4] == "versions" and parts[5]:
            return v2.infer_version, {"model": parts[3], "version": parts[5]}
    return None


class VkactApp(FastAPI):
    runtime: Runtime  # set by create_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            found = route(scope["method"], scope["path"])
            if found is not None:
                scope["app"] = self
                # /v2's X-Request-ID (v2.RequestIdMiddleware's work, without wrapping send per request)
                rid = v2.request_id_of(scope) if scope["path"].startswith("/v2/") else None
                await answer(*found, scope, receive, send, rid)
                return
        await super().__call__(scope, receive, send)


async def answer(handler: Handler, params: dict[str, Any], scope: Scope, receive: Receive, send: Send,
                 request_id: bytes | None = None) -> None:
    """Call ``handler`` and send its response, or the error handlers' answer to what it raised, with
    ``request_id`` as its X-Request-ID header when given."""
    request = Request(scope, receive)
    try:
        response = await handler(request, **params)
    except Exception as exc:  # noqa: BLE001 - every error becomes its JSON answer, never a dropped connection
        response = await errors.answer(request, exc)
    if request_id is not None:
        response.raw_headers.append((b"x-request-id", request_id))  # each response's own list
    await response(scope, receive, send)
