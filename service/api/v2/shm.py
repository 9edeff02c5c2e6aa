"""/v2/systemsharedmemory: Triton's system shared memory extension (register, unregister, status).
The registry itself is service/shared_memory.py; inferences use it through v2.codec and v2.outputs."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...errors import InvalidRequest
from ...shared_memory import SharedMemoryRegistry, UnknownRegion
from ...limits import CONTROL_BODY_BYTES
from ..execution import read_body
from ..runtime import runtime

router = APIRouter(prefix="/v2/systemsharedmemory", tags=["v2"])


class RegisterRequest(BaseModel):
    """$system_shared_memory_register_request."""

    model_config = ConfigDict(extra="forbid")

    key: str
    offset: Annotated[int, Field(strict=True, ge=0)] = 0
    byte_size: Annotated[int, Field(strict=True, ge=1)]


def _registry(request: Request) -> SharedMemoryRegistry:
    return runtime(request).shared_memory


@router.get("/status", summary="Every registered region")
async def status(request: Request) -> list[dict]:
    return _registry(request).status()


@router.get("/region/{name}/status", summary="One registered region (404 if it is not registered)")
async def region_status(request: Request, name: str) -> list[dict]:
    return _registry(request).status(name)


@router.post("/region/{name}/register", summary="Register a region of a POSIX shared memory object")
async def register(request: Request, name: str) -> Response:
    # Parsed here rather than as a FastAPI body: clients send it without a JSON Content-Type.
    try:
        body = RegisterRequest.model_validate_json(bytes(await read_body(request, CONTROL_BODY_BYTES)))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise InvalidRequest(err["msg"], ".".join(str(p) for p in err["loc"]) or None) from None
    _registry(request).register(name, body.key, body.offset, body.byte_size)
    return Response()


@router.post("/region/{name}/unregister", summary="Unregister one region and release its mapping")
async def unregister(request: Request, name: str) -> Response:
    _registry(request).unregister(name)
    return Response()


@router.post("/unregister", summary="Unregister every region")
async def unregister_all(request: Request) -> Response:
    _registry(request).unregister()
    return Response()


# -- /v2/cudasharedmemory: answered as Triton built without GPU support answers it --------------------
# perf_analyzer unregisters CUDA regions at start and exit whatever --shared-memory says; Triton without
# GPUs lists no regions, refuses a registration (INVALID_ARG: 400) and unregisters nothing, successfully.

cuda_router = APIRouter(prefix="/v2/cudasharedmemory", tags=["v2"])


@cuda_router.get("/status", summary="CUDA shared memory regions: none, this server has no CUDA memory")
async def cuda_status() -> list[dict]:
    return []


@cuda_router.get("/region/{name}/status", summary="One CUDA shared memory region: never registered (404)")
async def cuda_region_status(name: str) -> list[dict]:
    raise UnknownRegion(f"no CUDA shared memory region {name!r} is registered: vkact has no CUDA memory")


@cuda_router.post("/region/{name}/register", summary="Register a CUDA region: refused (400), vkact has no CUDA memory")
async def cuda_register(name: str) -> Response:
    raise InvalidRequest(f"failed to register CUDA shared memory region: {name!r}, GPUs not supported: "
                         "vkact runs on Vulkan and serves system shared memory only (/v2/systemsharedmemory)")


@cuda_router.post("/region/{name}/unregister", summary="Unregister a CUDA region: nothing is registered")
async def cuda_unregister(name: str) -> Response:
    return Response()


@cuda_router.post("/unregister", summary="Unregister every CUDA region: nothing is registered")
async def cuda_unregister_all() -> Response:
    return Response()
