"""Triton's trace and logging extensions, answered as a Triton server built without them answers
(since 2.42): 503 with {"error": "the server does not support tracing"} (or "dynamic logging") over
HTTP, UNAVAILABLE over gRPC (grpc_server). GET /v2 does not list "trace" or "logging". No Retry-After:
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


@router.api_route("/trace/setting", methods=["GET", "POST"], summary="Trace settings: not supported (as Triton without tracing)",
                  status_code=503)
async def trace_setting() -> JSONResponse:
    return _unsupported(NO_TRACE)


@router.api_route("/models/{model}/trace/setting", methods=["GET", "POST"], status_code=503,
                  summary="A model's trace settings: not supported (as Triton without tracing)")
async def model_trace_setting(model: str) -> JSONResponse:
    return _unsupported(NO_TRACE)


@router.api_route("/logging", methods=["GET", "POST"], summary="Log settings: not supported (as Triton without dynamic logging)",
                  status_code=503)
async def logging_setting() -> JSONResponse:
    return _unsupported(NO_LOGGING)
