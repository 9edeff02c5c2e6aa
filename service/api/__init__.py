"""The FastAPI application: /v1, /v2 (Open Inference Protocol), health, metrics, one error handler;
no kp in this process."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ..config import Settings
from ..shared_memory import SharedMemoryRegistry
from ..slots import server_file
from ..supervisor import registry_owner
from ..worker import DeviceWorker
from . import errors, health, openapi
from .grpc import descriptors as grpc_descriptors
from .v2 import control as v2_control
from .v2 import statistics
from .v1 import routes as v1
from .v2 import routes as v2
from .v2 import settings as v2_settings
from .v2 import shm as v2_shm
from .header_cache import HeaderCache
from .hot_routes import VkactApp
from ..dataplane.metrics import Metrics
from .runtime import Runtime

log = logging.getLogger("vkact.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = runtime.worker = DeviceWorker(settings)
        worker.on_execution = runtime.metrics.triton.execution
        worker.model_batch_limit = runtime.batching.limit
        worker.start()  # readiness follows when the worker reports its device and shaders
        grpc_server = None
        if settings.grpc_port:
            from .grpc.server import GrpcServer  # compiles the protocol's .proto files: only when served

            grpc_server = GrpcServer(runtime, app.version)
            runtime.grpc = grpc_server.transport
            try:
                await grpc_server.start()
            except BaseException:
                await worker.close()
                raise
        yield
        if grpc_server is not None:
            await grpc_server.stop()
        await worker.close()
        runtime.shared_memory.close()
        runtime.graphs.close()
        runtime.batching.close()

    app = VkactApp(title="vkact", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,  # openapi.install
                  description="DirectML's activation operators on any Vulkan device")
    # One registration file, one graph model file and one model batching file per server, shared by its
    # HTTP processes and kept across their restarts.
    server = registry_owner(settings.workers)
    registry = SharedMemoryRegistry(server_file("regions", server), settings.max_shm_regions)
    runtime = app.runtime = Runtime(settings, Metrics(), registry, HeaderCache(), HeaderCache(),
                                    graphs_path=server_file("graphs", server), batching_path=server_file("batching", server))
    errors.install(app)
    app.include_router(v1.router)
    app.include_router(health.router)
    app.include_router(grpc_descriptors.router)
    app.include_router(statistics.router)  # before v2.control's: /v2/models/stats is no model's metadata
    app.include_router(v2_control.router)
    app.include_router(v2.router)
    app.include_router(v2_shm.router)
    app.include_router(v2_shm.cuda_router)
    app.include_router(v2_settings.router)
    app.add_middleware(v2.RequestIdMiddleware)
    openapi.install(app)

    return app
