"""The Open Inference Protocol over gRPC (Triton's GRPCInferenceService, so tritonclient.grpc, KServe's
and MLServer's clients work) and grpc.health.v1, served by a grpcio asyncio server on the event loop of
each HTTP process, beside uvicorn, on VKACT_GRPC_PORT (0: none).

Every RPC answers from the same functions as its /v2 route (v2_models, statistics, the shared memory
registry, grpc_infer for ModelInfer); errors carry /v2's messages with Triton's status codes.

With VKACT_WORKERS > 1 every HTTP process serves gRPC on the same port (SO_REUSEPORT): each process has
its own device worker, so the kernel spreads gRPC connections over them as it spreads HTTP ones. With
one process the port is taken exclusively, so a second server on it fails to start instead of silently
sharing its clients."""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ..errors import InvalidRequest
from .errors import count_error, protocol_error
from .grpc_infer import model_infer
from .grpc_messages import config_pb, pb, services
from .metrics import MODEL_VERSION
from .runtime import Runtime
from .statistics import model_stats
from .v2 import EXTENSIONS
from .v2_models import MODELS, config, find_model, metadata

log = logging.getLogger("vkact.grpc")

#: Triton's mapping of its error kinds onto gRPC codes, from the statuses vkact's errors carry.
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,   # no room in /dev/shm for the shared-memory registry
}
SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_POLL_S = 1.0  # how soon health Watch streams see readiness change (Check is always current)

Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]


def rpc(method: Method) -> Method:
    """An RPC whose errors become the status code and message Triton would send."""

    @functools.wraps(method)
    async def answer(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its code
            status, message = protocol_error(exc)
            count_error(self.state.metrics, status, None)
            await context.abort(CODES.get(status, grpc.StatusCode.INTERNAL), message)

    return answer


class InferenceServicer(services.GRPCInferenceServiceServicer):
    def __init__(self, state: Runtime, version: str) -> None:
        self.state = state
        self.version = version

    def _ready(self) -> bool:
        return self.state.worker is not None and self.state.worker.ready

    # -- health and metadata ---------------------------------------------------------------------

    @rpc
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    @rpc
    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._ready())

    @rpc
    async def ModelReady(self, request: Any, context: Any) -> Any:
        find_model(request.name, request.version or None)
        return pb.ModelReadyResponse(ready=self._ready())

    @rpc
    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="vkact", version=self.version, extensions=EXTENSIONS)

    @rpc
    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        meta = metadata(find_model(request.name, request.version or None))
        tensors = {key: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[key]] for key in ("inputs", "outputs")}
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"], **tensors)

    @rpc
    async def ModelConfig(self, request: Any, context: Any) -> Any:
        model = config(find_model(request.name, request.version or None))
        return pb.ModelConfigResponse(config=json_format.ParseDict(model, config_pb.ModelConfig()))

    @rpc
    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        stats = model_stats(self.state.metrics, request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    # -- model repository (the models are built in) ----------------------------------------------

    @rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        ready = self._ready()
        if request.ready and not ready:
            return pb.RepositoryIndexResponse()
        state, reason = ("READY", "") if ready else ("UNAVAILABLE", "the device is not ready yet")
        entries = [pb.RepositoryIndexResponse.ModelIndex(name=name, version=MODEL_VERSION, state=state, reason=reason) for name in MODELS]
        return pb.RepositoryIndexResponse(models=entries)

    @rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        find_model(request.model_name)
        return pb.RepositoryModelLoadResponse()

    @rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        find_model(request.model_name)
        raise InvalidRequest(f"model {request.model_name!r} is built into vkact and cannot be unloaded")

    # -- shared memory: system memory as /v2/systemsharedmemory; no CUDA memory here -------------

    @rpc
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = self.state.shared_memory.status(request.name or None)
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**r) for r in regions})

    @rpc
    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        if request.byte_size < 1:
            raise InvalidRequest("byte_size must be at least 1", "byte_size")
        self.state.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @rpc
    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        self.state.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    @rpc
    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        return pb.CudaSharedMemoryStatusResponse()

    @rpc
    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        raise InvalidRequest("vkact has no CUDA memory: use system shared memory (SystemSharedMemoryRegister)")

    @rpc
    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- inference --------------------------------------------------------------------------------

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        operator = "-"  # failures count against the model once it is known, as on /v2
        try:
            model = find_model(request.model_name, request.model_version or None)
            operator = model.type_name()
            return await model_infer(self.state, model, request, started)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its code
            status, message = protocol_error(exc)
            count_error(self.state.metrics, status, operator, time.perf_counter() - started)
            await context.abort(CODES.get(status, grpc.StatusCode.INTERNAL), message)


class HealthServicer(health.aio.HealthServicer):
    """grpc.health.v1: SERVING for "" and the inference service while the device is ready, as Triton."""

    def __init__(self, state: Runtime) -> None:
        super().__init__()
        self.state = state
        self._serving: bool | None = None

    async def sync(self) -> None:
        serving = self.state.worker is not None and self.state.worker.ready
        if serving != self._serving:
            self._serving = serving
            status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", SERVICE_NAME):
                await self.set(name, status)

    async def Check(self, request: Any, context: Any) -> Any:
        await self.sync()
        return await super().Check(request, context)

    async def follow(self) -> None:
        while True:
            await self.sync()
            await asyncio.sleep(HEALTH_POLL_S)


class _Registration:
    """Stands in for the server while the generated code registers a servicer: keeps its handler table."""

    handlers: dict[str, grpc.RpcMethodHandler]

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def _handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The generated handler table, except that ModelInfer answers bytes it serialized itself
    (grpc_infer.model_infer): a 16 MiB output then costs one copy where protobuf makes three."""
    registration = _Registration()
    services.add_GRPCInferenceServiceServicer_to_server(servicer, registration)
    handlers = registration.handlers
    infer = handlers["ModelInfer"]
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(infer.unary_unary, request_deserializer=infer.request_deserializer)
    return handlers


class GrpcServer:
    """The gRPC server of one HTTP process, started and stopped by the app's lifespan."""

    def __init__(self, state: Runtime, version: str) -> None:
        settings = state.settings
        # RPCs at once beyond VKACT_MAX_CONNECTIONS are refused by grpcio with RESOURCE_EXHAUSTED, as
        # the HTTP port answers connections beyond it with 503: a flood cannot pile up handlers.
        self.server = grpc.aio.server(maximum_concurrent_rpcs=settings.max_connections, options=[
            ("grpc.max_receive_message_length", settings.max_body_bytes),  # the HTTP body limit; grpc's own is 4 MiB
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
        ])
        handlers = _handlers(InferenceServicer(state, version))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        self.server.add_registered_method_handlers(SERVICE_NAME, handlers)
        self.health = HealthServicer(state)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.address = f"{host}:{settings.grpc_port}"
        self._follower: asyncio.Task | None = None

    async def start(self) -> None:
        try:
            self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise RuntimeError(f"gRPC cannot listen on {self.address} (in use? set VKACT_GRPC_PORT, or 0 for no gRPC): {exc}") from None
        await self.server.start()
        self._follower = asyncio.ensure_future(self.health.follow())
        log.info("gRPC on %s", self.address)

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace=5)
