"""/v2's control plane: health, server and model metadata, readiness, a model's configuration (Triton's,
as perf_analyzer reads it) and the model repository extension (api.repository does the work). The
inferences are v2.routes'."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ...dataplane import is_ready
from ...errors import InvalidRequest, UnknownOperator, VkactError
from ...limits import CONTROL_BODY_BYTES, GRAPH_CONFIG_BYTES
from .. import repository
from ..execution import read_body
from ..json_text import load_header
from ..runtime import device_worker, runtime

router = APIRouter(prefix="/v2", tags=["v2"])

#: What GET /v2 advertises: only what is implemented. model_repository is the index, load and unload
#: (graph models; an operator model is built in: its load sets its batching, its unload is refused);
#: model_configuration is GET .../config.
EXTENSIONS = ["binary_tensor_data", "system_shared_memory", "model_repository", "model_configuration", "statistics"]


def _ready(request: Request) -> bool:
    return is_ready(device_worker(request))


# -- health and metadata --------------------------------------------------------------------------------


@router.get("/health/live", summary="Server liveness")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", summary="Server readiness: the device is up and every shader loaded")
async def ready(request: Request) -> JSONResponse:
    ok = _ready(request)
    return JSONResponse({"ready": ok}, status_code=200 if ok else 503)


@router.get("", summary="Server metadata")
async def server_metadata(request: Request) -> dict[str, Any]:
    return {"name": "vkact", "version": request.app.version, "extensions": EXTENSIONS}


@router.get("/models/{model}", summary="Model metadata")
async def model_metadata(request: Request, model: str) -> dict[str, Any]:
    return await repository.metadata(runtime(request), model)


@router.get("/models/{model}/versions/{version}", summary="Model metadata of one version")
async def model_version_metadata(request: Request, model: str, version: str) -> dict[str, Any]:
    return await repository.metadata(runtime(request), model, version)


@router.get("/models/{model}/ready", summary="Model readiness")
async def model_ready(request: Request, model: str) -> JSONResponse:
    return _model_ready(request, {"name": model})


@router.get("/models/{model}/versions/{version}/ready", summary="Model readiness of one version")
async def model_version_ready(request: Request, model: str, version: str) -> JSONResponse:
    return _model_ready(request, {"name": model, "version": version})


def _model_ready(request: Request, answer: dict[str, Any]) -> JSONResponse:
    """$model_ready_response. An unknown model or version is not ready: ``ready`` false (404, with the
    reason in ``error``), as gRPC's ModelReady answers ready=false, so a probe that reads the flag
    works on either protocol."""
    try:
        ok = repository.ready(runtime(request), answer["name"], answer.get("version"))
    except UnknownOperator as exc:
        return JSONResponse({**answer, "ready": False, "error": str(exc)}, status_code=404)
    return JSONResponse({**answer, "ready": ok}, status_code=200 if ok else 503)


@router.get("/models/{model}/config", summary="Model configuration (Triton's, as perf_analyzer reads it)")
async def model_config(request: Request, model: str) -> dict[str, Any]:
    return await repository.config(runtime(request), model)


@router.get("/models/{model}/versions/{version}/config", summary="Model configuration of one version")
async def model_version_config(request: Request, model: str, version: str) -> dict[str, Any]:
    return await repository.config(runtime(request), model, version)


# -- model repository ---------------------------------------------------------------------------------


@router.post("/repository/index", summary="The models, with their state")
async def repository_index(request: Request) -> list[dict[str, Any]]:
    # tritonclient sends an empty body; Triton also takes {"ready": true}
    body = await read_body(request, CONTROL_BODY_BYTES)
    options: Any = {}
    if bytes(body).strip():
        try:
            options = load_header(body, CONTROL_BODY_BYTES)
        except VkactError:
            raise
        except ValueError:  # CodecError: not JSON, nested too deeply, not an object
            options = None
        if not isinstance(options, dict):
            raise InvalidRequest("the body must be empty or a JSON object such as {\"ready\": true}")
    if not isinstance(options.get("ready", False), bool):  # as Triton: not a filter quietly ignored
        raise InvalidRequest(f"ready must be true or false, got {options['ready']!r}", "ready")
    return repository.index(runtime(request), options.get("ready") is True)


@router.post("/repository/models/{model}/load", summary="Load a graph model (parameters.config: its DML_GRAPH_DESC as JSON text), "
             "or set an operator model's batching (parameters.config: Triton's model configuration)")
async def load_model(request: Request, model: str) -> Response:
    """Triton's load (see api.repository): ``parameters.config`` (a JSON string) is a graph to load as
    model ``model``, or, for an operator model, Triton's model configuration, which sets max_batch_size
    and dynamic_batching and is refused with 400 if it changes anything else; no config restores an
    operator model's batching."""
    limit = GRAPH_CONFIG_BYTES + CONTROL_BODY_BYTES  # a graph's JSON, escaped in a string
    claim = runtime(request).inflight.claim()  # up to a MiB a load, held while it waits: within the budget
    try:
        body = await read_body(request, limit, claim)
        try:  # values bounded by the body's length: the config's text is one value, parsed when loaded
            options: Any = load_header(body, limit) if bytes(body).strip() else {}
        except VkactError:
            raise
        except ValueError:  # CodecError: not JSON, nested too deeply
            options = None
        params = options.get("parameters", {}) if isinstance(options, dict) else None
        if not isinstance(params, dict):
            raise InvalidRequest('the body must be empty or {"parameters": {"config": "<a graph\'s or a model configuration\'s JSON>"}}', "parameters")
        await repository.load(runtime(request), model, params)
    finally:
        claim.release()
    return Response()


@router.post("/repository/models/{model}/unload", summary="Unload a graph model (operator models are built in: refused)")
async def unload_model(request: Request, model: str) -> Response:
    await repository.unload(runtime(request), model)
    return Response()
