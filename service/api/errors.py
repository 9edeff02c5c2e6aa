"""One place that turns every failure into ``{"error": message, "field": path}`` with its status."""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from client.codec import CodecError

from ..errors import Busy, VkactError
from ..operators import descriptor_error

log = logging.getLogger("vkact.api")


def error_response(status: int, message: str, field: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


def _count(request: Request, status: int) -> None:
    metrics = request.app.state.metrics
    metrics.errors.labels(str(status)).inc()
    if request.url.path.startswith("/v1/execute"):
        metrics.requests.labels(getattr(request.state, "operator", "-"), str(status)).inc()


def install(app: FastAPI) -> None:
    @app.exception_handler(VkactError)
    async def vkact_error(request: Request, exc: VkactError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s %s: %s", request.method, request.url.path, exc.message)
        headers = {"Retry-After": "1"} if isinstance(exc, Busy) else None
        _count(request, exc.status)
        return error_response(exc.status, exc.message, exc.field, headers)

    @app.exception_handler(CodecError)
    async def codec_error(request: Request, exc: CodecError) -> JSONResponse:
        _count(request, 400)
        return error_response(400, exc.message, exc.field)

    @app.exception_handler(ValidationError)
    async def validation_error(request: Request, exc: ValidationError) -> JSONResponse:
        err = descriptor_error(exc)
        _count(request, err.status)
        return error_response(err.status, err.message, err.field)

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(p) for p in first["loc"] if p not in ("body", "query", "path"))
        _count(request, 422)
        return error_response(422, first["msg"], field or None)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        _count(request, exc.status_code)
        return error_response(exc.status_code, str(exc.detail), None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        _count(request, 500)
        return error_response(500, f"internal error: {type(exc).__name__}")
