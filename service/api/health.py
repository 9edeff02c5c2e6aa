"""Probes and metrics: they never wait for the device."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from ..dataplane import is_ready
from .runtime import device_worker, runtime

router = APIRouter(tags=["health"])


@router.get("/health/live")
async def live() -> dict:
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    ok = is_ready(device_worker(request))
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    state, worker = runtime(request), device_worker(request)
    state.metrics.queue_depth.set(worker.queue_depth)
    state.metrics.worker_restarts.set(worker.restarts)
    state.metrics.inflight_bytes.set(state.inflight.held)
    if state.grpc is not None:
        state.metrics.grpc_connections.set(len(state.grpc.connections))
        state.metrics.grpc_calls.set(state.grpc.calls)
    return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
