"""Triton's statistics extension over HTTP: GET /v2/models/stats, /v2/models/{model}/stats and
/v2/models/{model}/versions/{version}/stats answer ``{"model_stats": [...]}`` (gRPC's ModelStatistics
answers the same, see grpc.server). The numbers are the per-model series of metrics.TritonMetrics, kept
by every /v1, /v2 and gRPC execution of the HTTP process that answers (one per VKACT_WORKERS process)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from .. import repository
from ..runtime import Runtime, runtime

# Included before /v2's router: its GET /v2/models/{model} would take "stats" for a model name.
router = APIRouter(prefix="/v2/models", tags=["v2"])


def model_stats(state: Runtime, model: str = "", version: str = "") -> dict[str, Any]:
    """``model_stats`` of every model (no name) or of one model (and version), operator or graph model:
    unknown ones are 404."""
    name = repository.known(state, model, version or None) if model else None
    return {"model_stats": state.metrics.triton.statistics(name)}


@router.get("/stats", summary="Inference statistics of every model")
async def all_stats(request: Request) -> dict[str, Any]:
    return model_stats(runtime(request))


@router.get("/{model}/stats", summary="Inference statistics of one model")
async def stats(request: Request, model: str) -> dict[str, Any]:
    return model_stats(runtime(request), model)


@router.get("/{model}/versions/{version}/stats", summary="Inference statistics of one model version")
async def version_stats(request: Request, model: str, version: str) -> dict[str, Any]:
    return model_stats(runtime(request), model, version)
