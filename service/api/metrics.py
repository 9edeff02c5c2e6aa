"""Prometheus metrics of one HTTP process (its own registry, so tests can run several apps)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("vkact_requests", "Execute requests by operator and HTTP status", ["operator", "code"], registry=r)
        self.errors = Counter("vkact_errors", "Requests answered with an error, by status", ["code"], registry=r)
        self.queue_depth = Gauge("vkact_queue_depth", "Requests holding a device slot (queued or running)", registry=r)
        self.request_seconds = Histogram("vkact_request_duration_seconds", "Request handling time", ["operator"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_seconds = Histogram("vkact_queue_duration_seconds", "Time queued before the device", ["operator"], buckets=LATENCY_BUCKETS, registry=r)
        self.kernel_seconds = Histogram("vkact_kernel_duration_seconds", "Device time per request", ["operator"], buckets=LATENCY_BUCKETS, registry=r)
        self.bytes_in = Counter("vkact_tensor_bytes_in", "Input tensor bytes", ["operator"], registry=r)
        self.bytes_out = Counter("vkact_tensor_bytes_out", "Output tensor bytes", ["operator"], registry=r)
        self.worker_restarts = Gauge("vkact_worker_restarts", "Times the device worker was restarted", registry=r)
