"""The FastAPI application: /v1, health, metrics, one error handler; no kp in this process."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ..config import Settings
from ..worker import DeviceWorker
from . import errors, health, v1
from .metrics import Metrics

log = logging.getLogger("vkact.api")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker = app.state.worker = DeviceWorker(settings)
        worker.start()  # readiness follows when the worker reports its device and shaders
        yield
        await worker.close()

    app = FastAPI(title="vkact", version="0.1.0", lifespan=lifespan,
                  description="DirectML's activation operators on any Vulkan device")
    app.state.settings = settings
    app.state.metrics = Metrics()
    errors.install(app)
    app.include_router(v1.router)
    app.include_router(health.router)

    return app
