"""The Open Inference Protocol over gRPC (Triton's GRPCInferenceService, so tritonclient.grpc, KServe's
and MLServer's clients work) and grpc.health.v1, served on the event loop of each HTTP process, beside
uvicorn, on VKACT_GRPC_PORT (0: none). The transport is grpc.transport (HTTP/2 in C, libnghttp2); the
messages are protobuf's, compiled from Triton's .proto files (grpc.messages).

Every RPC answers from the same functions as its /v2 route (dataplane.models, statistics, the shared memory
registry, grpc.infer for ModelInfer); errors carry /v2's messages with Triton's status codes.

With VKACT_WORKERS > 1 every HTTP process serves gRPC on the same port (SO_REUSEPORT): each process has
its own device worker, so the kernel spreads gRPC connections over them as it spreads HTTP ones. With
one process the port is taken exclusively, so a second server on it fails to start instead of silently
sharing its clients."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from ...dataplane import is_ready
from ...errors import InvalidRequest, UnknownOperator
from . import status as status_codes
from ..errors import count_error, protocol_error
from .graph_infer import graph_model_infer
from .infer import model_infer
from .messages import config_pb, pb
from .reflection import reflection_routes
from .status import RpcError, status_text
from .transport import GrpcTransport, Route, Send
from ..runtime import Runtime
from ..v2.statistics import model_stats
from ..v2.control import EXTENSIONS
from ..v2.settings import NO_LOGGING, NO_TRACE_GRPC
from .. import repository
from ...dataplane.models import MODELS, find_model

log = logging.getLogger("vkact.grpc")

#: Triton's mapping of its error kinds onto gRPC codes, from the statuses vkact's errors carry.
CODES = {
    400: status_codes.INVALID_ARGUMENT,
    404: status_codes.NOT_FOUND,
    413: status_codes.RESOURCE_EXHAUSTED,
    499: status_codes.CANCELLED,
    500: status_codes.INTERNAL,
    503: status_codes.UNAVAILABLE,
    504: status_codes.DEADLINE_EXCEEDED,
    507: status_codes.RESOURCE_EXHAUSTED,   # no room in /dev/shm for the shared-memory registry
}
SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_SERVICE_NAME = "grpc.health.v1.Health"
HEALTH_POLL_S = 1.0  # how soon health Watch streams see readiness change (Check is always current)
from ...limits import STREAM_IN_FLIGHT


class InferenceServicer:
    def __init__(self, state: Runtime, version: str) -> None:
        self.state = state
        self.version = version

    def _ready(self) -> bool:
        return is_ready(self.state.worker)

    # -- health and metadata ---------------------------------------------------------------------

    async def ServerLive(self, request: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any) -> Any:
        return pb.ServerReadyResponse(ready=self._ready())

    async def ModelReady(self, request: Any) -> Any:
        """An unknown model or version is not ready (ready=false, OK), as Triton answers: readiness
        probes written for Triton read the flag, not a NOT_FOUND."""
        try:
            return pb.ModelReadyResponse(ready=repository.ready(self.state, request.name, request.version or None))
        except UnknownOperator:
            return pb.ModelReadyResponse(ready=False)

    async def ServerMetadata(self, request: Any) -> Any:
        return pb.ServerMetadataResponse(name="vkact", version=self.version, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: Any) -> Any:
        meta = await repository.metadata(self.state, request.name, request.version or None)
        tensors = {key: [pb.ModelMetadataResponse.TensorMetadata(**t) for t in meta[key]] for key in ("inputs", "outputs")}
        return pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"], **tensors)

    async def ModelConfig(self, request: Any) -> Any:
        model = await repository.config(self.state, request.name, request.version or None)
        return pb.ModelConfigResponse(config=json_format.ParseDict(model, config_pb.ModelConfig()))

    async def ModelStatistics(self, request: Any) -> Any:
        stats = model_stats(self.state, request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    # -- model repository: the operator models (built in) and graph models (loaded) ----------------

    async def RepositoryIndex(self, request: Any) -> Any:
        entries = [pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in repository.index(self.state, request.ready)]
        return pb.RepositoryIndexResponse(models=entries)

    async def RepositoryModelLoad(self, request: Any) -> Any:
        """As POST /v2/repository/models/{model}/load: a ``config`` parameter (a string) is a graph to load
        as that model, or an operator model's batching (see api.repository)."""
        params = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param") for key, value in request.parameters.items()}
        await repository.load(self.state, request.model_name, params)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any) -> Any:
        await repository.unload(self.state, request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory: system memory as /v2/systemsharedmemory; no CUDA memory here -------------

    async def SystemSharedMemoryStatus(self, request: Any) -> Any:
        regions = self.state.shared_memory.status(request.name or None)
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: pb.SystemSharedMemoryStatusResponse.RegionStatus(**r) for r in regions})

    async def SystemSharedMemoryRegister(self, request: Any) -> Any:
        if request.byte_size < 1:
            raise InvalidRequest("byte_size must be at least 1", "byte_size")
        self.state.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any) -> Any:
        self.state.shared_memory.unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any) -> Any:
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any) -> Any:
        raise InvalidRequest("vkact has no CUDA memory: use system shared memory (SystemSharedMemoryRegister)")

    async def CudaSharedMemoryUnregister(self, request: Any) -> Any:
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace and log settings: as Triton built without them -------------------------------------

    async def TraceSetting(self, request: Any) -> Any:
        raise RpcError(status_codes.UNAVAILABLE, NO_TRACE_GRPC)

    async def LogSettings(self, request: Any) -> Any:
        raise RpcError(status_codes.UNAVAILABLE, NO_LOGGING)

    # -- inference --------------------------------------------------------------------------------

    async def ModelStreamInfer(self, requests: AsyncIterator[bytes], send: Send) -> None:
        """Triton's bidirectional stream: each request runs as a ModelInfer (the same path, counted the
        same) as soon as it arrives, and its answer is sent when it completes (order of completion),
        each with its request's id; a request's failure is its response's error_message, and the stream
        goes on. The call ends, OK, once the client has sent its last request and every answer is out."""
        running: set[asyncio.Task] = set()
        try:
            async for data in requests:
                if len(running) >= STREAM_IN_FLIGHT:
                    send(stream_response(error=f"more than {STREAM_IN_FLIGHT} requests of this stream in flight: wait for answers"))
                    continue
                task = asyncio.ensure_future(self._stream_one(data, send))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(running)
        finally:  # the client reset the stream or its deadline passed: its requests go with it
            for task in running:
                task.cancel()

    async def _stream_one(self, data: bytes, send: Send) -> None:
        try:
            request = pb.ModelInferRequest.FromString(data)
        except DecodeError:
            send(stream_response(error="the request is not a inference.ModelInferRequest message"))
            return
        # A client that asks for final-response flags (perf_analyzer, for decoupled models) gets Triton's
        # triton_final_response on each answer: every request has exactly one, its final.
        flag = request.parameters.get("triton_enable_empty_final_response")
        final = flag is not None and flag.bool_param
        try:
            answer = await self.ModelInfer(request)
        except RpcError as exc:
            ids = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
            send(stream_response(error=exc.message, answer=ids.SerializeToString() + (FINAL_FLAG if final else b"")))
        else:
            send(stream_response(answer=answer + FINAL_FLAG if final else answer))

    async def ModelInfer(self, request: Any) -> bytes:
        started = time.perf_counter()
        operator = "-"  # failures count against the model once it is known, as on /v2
        try:
            if request.model_name not in MODELS and self.state.graphs.has(request.model_name):
                graph = await self.state.graphs.find(request.model_name, request.model_version or None)
                operator = graph.label
                return await graph_model_infer(self.state, graph, request, started)
            model = find_model(request.model_name, request.model_version or None)
            operator = model.type_name()
            return await model_infer(self.state, model, request, started)
        except Exception as exc:  # noqa: BLE001 - every failure is answered with its code
            status, message = protocol_error(exc)
            count_error(self.state.metrics, status, operator, time.perf_counter() - started)
            raise RpcError(CODES.get(status, status_codes.INTERNAL), message) from None


class HealthServicer:
    """grpc.health.v1: SERVING for "" and the inference service while the device is ready, as Triton;
    NOT_FOUND for any other service name."""

    def __init__(self, state: Runtime) -> None:
        self.state = state

    def status(self, service: str) -> Any:
        if service not in ("", SERVICE_NAME):
            raise RpcError(status_codes.NOT_FOUND, f"unknown service {service!r}")
        serving = is_ready(self.state.worker)
        return health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING

    async def Check(self, request: Any) -> Any:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def Watch(self, request: Any, send: Send) -> None:
        """The status now, then each change, until the client cancels (an unknown service: SERVICE_UNKNOWN)."""
        last = None
        while True:
            try:
                status = self.status(request.service)
            except RpcError:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                last = status
            await asyncio.sleep(HEALTH_POLL_S)


def _final_flag() -> bytes:
    """ModelInferResponse's parameters entry (field 4) triton_final_response = bool_param (field 1) true,
    appended to a serialized response: a map's entries may come in any order."""
    return _field(4, _field(1, b"triton_final_response") + _field(2, b"\x08\x01"))


def stream_response(error: str = "", answer: bytes = b"") -> bytes:
    """A ModelStreamInferResponse's bytes, the ModelInferResponse already serialized: error_message is
    field 1, infer_response field 2 (both length-delimited), written as protobuf writes them."""
    text = status_text(error).encode()
    return (_field(1, text) if text else b"") + _field(2, answer)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (its number below 16) as protobuf writes it."""
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


FINAL_FLAG = _final_flag()


def unary(method: Callable[[Any], Awaitable[Any]], request_type: Any) -> Route:
    parse = request_type.FromString

    async def call(data: bytes) -> bytes:
        try:
            request = parse(data)
        except DecodeError:
            raise InvalidRequest(f"the request is not a {request_type.DESCRIPTOR.full_name} message") from None
        answer = await method(request)
        return answer if isinstance(answer, bytes) else answer.SerializeToString()

    return Route(unary=call)


def streaming(method: Callable[[Any, Send], Awaitable[None]], request_type: Any) -> Route:
    async def call(data: bytes, send: Send) -> None:
        try:
            request = request_type.FromString(data)
        except DecodeError:
            raise InvalidRequest(f"the request is not a {request_type.DESCRIPTOR.full_name} message") from None
        await method(request, send)

    return Route(streaming=call)


def routes(servicer: InferenceServicer, health: HealthServicer) -> dict[str, Route]:
    """Each :path vkact answers: every GRPCInferenceService method (ModelStreamInfer bidirectional, the
    others unary), the health service and server reflection."""
    table = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        handler = getattr(servicer, method.name)
        path = f"/{SERVICE_NAME}/{method.name}"
        table[path] = Route(bidi=handler) if method.client_streaming else unary(handler, getattr(pb, method.input_type.name))
    table[f"/{HEALTH_SERVICE_NAME}/Check"] = unary(health.Check, health_pb2.HealthCheckRequest)
    table[f"/{HEALTH_SERVICE_NAME}/Watch"] = streaming(health.Watch, health_pb2.HealthCheckRequest)
    table.update(reflection_routes((SERVICE_NAME, HEALTH_SERVICE_NAME)))
    return table


class GrpcServer:
    """The gRPC server of one HTTP process, started and stopped by the app's lifespan."""

    def __init__(self, state: Runtime, version: str) -> None:
        self.settings = settings = state.settings
        self.metrics = state.metrics
        # Calls at once beyond VKACT_MAX_CONNECTIONS are refused with RESOURCE_EXHAUSTED, as the HTTP
        # port answers connections beyond it with 503: a flood cannot pile up handlers.
        self.transport = GrpcTransport(routes(InferenceServicer(state, version), HealthServicer(state)), self._error_status,
                                       max_message=settings.max_body_bytes,  # the HTTP body limit
                                       max_calls=settings.max_connections, max_connections=settings.max_connections,
                                       budget=state.inflight, idle_timeout=settings.grpc_idle_timeout_s,
                                       body_timeout=settings.body_timeout_s)  # HTTP's: a request's pauses, an unread answer's
        self.address = f"[{settings.host}]:{settings.grpc_port}" if ":" in settings.host else f"{settings.host}:{settings.grpc_port}"

    def _error_status(self, exc: BaseException) -> tuple[int, str]:
        status, message = protocol_error(exc)  # type: ignore[arg-type]
        count_error(self.metrics, status, None)
        return CODES.get(status, status_codes.INTERNAL), message

    async def start(self) -> None:
        try:
            await self.transport.start(self.settings.host, self.settings.grpc_port, reuse_port=self.settings.workers > 1)
        except OSError as exc:
            raise RuntimeError(f"gRPC cannot listen on {self.address} (in use? set VKACT_GRPC_PORT, or 0 for no gRPC): {exc}") from None
        log.info("gRPC on %s", self.address)

    async def stop(self) -> None:
        await self.transport.stop(grace=5)
