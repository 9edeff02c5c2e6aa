"""Triton's trace and logging extensions, answered as a Triton server built without them answers
(since 2.42): 503 with {"error": "the server does not support tracing"} (or "dynamic logging") over
HTTP, UNAVAILABLE over gRPC (grpc.server). GET /v2 does not list "trace" or "logging". No Retry-After:
unlike vkact's other 503s, asking again will not help."""
from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

router = APIRouter(prefix="/v2", tags=["v2"])

NO_TRACE = "the server does not support tracing"
NO_TRACE_GRPC = "the server does not support trace"  # Triton's gRPC wording
NO_LOGGING = "the server does not support dynamic logging"


def _unsupported(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=503)


_TRACE = "not supported (as Triton built without tracing)"
_LOGGING = "not supported (as Triton built without dynamic logging)"


@router.get("/trace/setting", summary=f"Trace settings: {_TRACE}", status_code=503)
@router.post("/trace/setting", summary=f"Update the trace settings: {_TRACE}", status_code=503)
async def trace_setting() -> JSONResponse:
    return _unsupported(NO_TRACE)


@router.get("/models/{model}/trace/setting", summary=f"A model's trace settings: {_TRACE}", status_code=503)
@router.post("/models/{model}/trace/setting", summary=f"Update a model's trace settings: {_TRACE}", status_code=503)
async def model_trace_setting(model: str) -> JSONResponse:
    return _unsupported(NO_TRACE)


@router.get("/logging", summary=f"Log settings: {_LOGGING}", status_code=503)
@router.post("/logging", summary=f"Update the log settings: {_LOGGING}", status_code=503)
async def logging_setting() -> JSONResponse:
    return _unsupported(NO_LOGGING)
