"""One place that turns every failure into an error body with its status.

/v1 answers ``{"error": message, "field": path}``. /v2 speaks the Open Inference Protocol, whose error
body is ``{"error": message}`` alone: there the field path goes into the message, and the statuses that
the protocol does not use for bad input (422 for a descriptor that breaks DirectML's rules, FastAPI's
422 for a malformed body) become 400, as Triton and KServe answer them.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from client.codec import CodecError

from ..errors import VkactError
from ..operators import OPERATORS, descriptor_error
from .execution import OPERATOR_KEY
from ..dataplane.graph_models import LABEL_PREFIX as GRAPH_MODEL
from ..dataplane.graphs import GRAPH_LABEL
from ..dataplane.metrics import Metrics
from .runtime import runtime
from ..dataplane.models import oip_names

log = logging.getLogger("vkact.api")


class _EveryInterval:
    """Log lines that requests cause, at most one per ``interval`` seconds (the rest counted into the
    next): a client can cause thousands of 503s a second, and each line is written on the event loop,
    which then runs at the speed of the log's reader (a full pipe blocks it outright)."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._next = 0.0
        self._skipped = 0

    def error(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._skipped += 1
            return
        self._next = now + self.interval
        if self._skipped:
            message += f" (and {self._skipped} more such answer(s) not logged)"
            self._skipped = 0
        log.error(message, *args)


_server_errors = _EveryInterval()


class ErrorResponse(JSONResponse):
    """An error body with non-ASCII characters escaped: a message that quotes a client's text can always
    be written, even text that is not Unicode (a lone surrogate has no UTF-8 form)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def error_response(status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    return ErrorResponse({"error": message, "field": field}, status_code=status, headers=headers)


def is_v2(request: Request) -> bool:
    path = request.url.path
    return path == "/v2" or path.startswith("/v2/")


def _is_execution(path: str) -> bool:
    return path.startswith("/v1/execute") or (path.startswith("/v2/models/") and path.endswith("/infer"))


def _count(request: Request, status: int) -> None:
    operator = request.scope.get(OPERATOR_KEY, "-") if _is_execution(request.url.path) else None
    count_error(runtime(request).metrics, status, operator)


def count_error(metrics: Metrics, status: int, operator: str | None, seconds: float = 0.0) -> None:
    """An answered error, whichever protocol; ``operator``: the execution's operator ('-' before it is
    known), None when the request was no execution."""
    metrics.errors.labels(str(status)).inc()
    if operator is not None:
        if operator in OPERATORS:  # a failed inference of a known model, in Triton's terms
            metrics.triton.failure(OPERATORS[operator], seconds)
        elif operator.startswith(GRAPH_MODEL):  # a loaded graph model's; vkact's series count all graphs as one
            if (stats := metrics.triton.model(operator[len(GRAPH_MODEL):])) is not None:
                metrics.triton.failure(stats, seconds)
            operator = GRAPH_LABEL
        metrics.failed(operator, status)


def _answer(request: Request, status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    if is_v2(request):
        status = 400 if status == 422 else status
        if field and not message.startswith(field):
            message = f"{field}: {message}"
        _count(request, status)
        return ErrorResponse({"error": oip_names(message)}, status_code=status, headers=headers)
    _count(request, status)
    return error_response(status, message, field, headers)


async def _vkact_error(request: Request, exc: VkactError) -> JSONResponse:
    if exc.status >= 500:
        _server_errors.error("%s %s: %s", request.method, request.url.path, exc.message)
    # Every 503 (queue full, worker starting or lost) is transient: clients retry after Retry-After.
    headers = {"Retry-After": "1"} if exc.status == 503 else getattr(exc, "headers", None)
    return _answer(request, exc.status, exc.message, exc.field, headers)


async def _codec_error(request: Request, exc: CodecError) -> JSONResponse:
    return _answer(request, 400, exc.message, exc.field)


async def _validation_error(request: Request, exc: ValidationError) -> JSONResponse:
    err = descriptor_error(exc)
    return _answer(request, err.status, err.message, err.field)


async def _request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    field = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
    return _answer(request, 422, first["msg"], field or None)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return _answer(request, exc.status_code, str(exc.detail), None, getattr(exc, "headers", None))


async def _client_gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
    # Nobody reads this answer; it keeps the departure out of the 500s.
    return _answer(request, 499, "the client disconnected before its request was read")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _answer(request, 500, f"internal error: {type(exc).__name__}")


HANDLERS: dict[type[Exception], Callable[[Request, Any], Awaitable[JSONResponse]]] = {
    VkactError: _vkact_error,
    CodecError: _codec_error,
    ValidationError: _validation_error,
    RequestValidationError: _request_validation_error,
    HTTPException: _http_error,
    ClientDisconnect: _client_gone,
    Exception: _unexpected,
}


async def answer(request: Request, exc: Exception) -> JSONResponse:
    """The error response for ``exc``, by the nearest handler in its class hierarchy (as Starlette
    picks them): for routes served outside FastAPI's exception middleware (hot_routes)."""
    for cls in type(exc).__mro__:
        handler = HANDLERS.get(cls)
        if handler is not None:
            return await handler(request, exc)
    raise exc


def install(app: FastAPI) -> None:
    for cls, handler in HANDLERS.items():
        app.add_exception_handler(cls, handler)


def protocol_error(exc: Exception) -> tuple[int, str]:
    """The status and /v2 message of a failure, for a protocol answered outside these handlers (gRPC):
    the same statuses as /v2 (a descriptor error 400), the field path leading the message."""
    if isinstance(exc, VkactError):
        status, message, field = exc.status, exc.message, exc.field
    elif isinstance(exc, CodecError):
        status, message, field = 400, exc.message, exc.field
    elif isinstance(exc, ValidationError):
        err = descriptor_error(exc)
        status, message, field = err.status, err.message, err.field
    else:
        log.error("unexpected error", exc_info=exc)
        return 500, f"internal error: {type(exc).__name__}"
    if field and not message.startswith(field):
        message = f"{field}: {message}"
    return (400 if status == 422 else status), oip_names(message)
