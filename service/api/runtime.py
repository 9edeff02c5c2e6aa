"""What the routes of one HTTP process share, as typed attributes of the app.

Starlette's ``app.state`` is untyped, and each read of it raises and catches an AttributeError inside
State.__getattr__ (about 0.6 us; a small inference read it seven times): the routes reach this
instead, through ``runtime(request)``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import HTTPConnection

from ..config import Settings
from ..inflight import InflightBudget
from ..shared_memory import SharedMemoryRegistry
from .header_cache import HeaderCache
from ..dataplane.batching import ModelBatching
from ..dataplane.deadlines import Deadlines
from ..dataplane.graph_models import GraphModels
from ..dataplane.readiness import is_ready
from ..dataplane.metrics import Metrics

if TYPE_CHECKING:
    from ..worker import DeviceWorker
    from .grpc.transport import GrpcTransport


@dataclass
class Runtime:
    settings: Settings
    metrics: Metrics
    shared_memory: SharedMemoryRegistry
    v1_headers: HeaderCache[Any]
    v2_headers: HeaderCache[Any]
    worker: DeviceWorker | None = None  # set when the app starts (its lifespan), with the event loop
    grpc: GrpcTransport | None = None  # gRPC's connections and calls, where gRPC is served (set with the worker)
    grpc_requests: HeaderCache[Any] = field(default_factory=HeaderCache)  # gRPC's ModelInfer, as v2_headers
    v2_json: HeaderCache[Any] = field(default_factory=HeaderCache)  # /v2 JSON requests by structure (v2.json_repeat)
    graphs_path: str = ""  # the server's graph model file (slots.server_file); "": graphs.json beside the registry's
    batching_path: str = ""  # the server's model batching file (slots.server_file); "": batching.json beside the registry's
    inflight: InflightBudget = field(init=False)  # request bytes in flight, HTTP's and gRPC's (VKACT_INFLIGHT_BYTES)
    graphs: GraphModels = field(init=False)  # graph models loaded through the repository extension
    batching: ModelBatching = field(init=False)  # operator models' batching, set by load_model with a config
    deadlines: Deadlines = field(init=False)  # every execution's request_timeout_s, on one timer

    def __post_init__(self) -> None:
        self.inflight = InflightBudget(self.settings.inflight_limit)
        beside = os.path.dirname(self.shared_memory.path)
        self.graphs = GraphModels(self.settings, self.metrics.triton, self.graphs_path or os.path.join(beside, "graphs.json"), self.device)
        self.batching = ModelBatching(self.batching_path or os.path.join(beside, "batching.json"))
        self.deadlines = Deadlines(self.settings.request_timeout_s)


    def device(self) -> dict[str, Any] | None:
        """The ready device worker's report (the device's limits), or None while it is not ready."""
        worker = self.worker
        return worker.info if worker is not None and is_ready(worker) and worker.info else None


def runtime(connection: HTTPConnection) -> Runtime:
    """The runtime of the app that serves ``connection`` (a request)."""
    return connection.scope["app"].runtime


def device_worker(connection: HTTPConnection) -> DeviceWorker:
    worker = runtime(connection).worker
    assert worker is not None, "the app has not started"
    return worker
