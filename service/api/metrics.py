"""Prometheus metrics of one HTTP process (its own registry, so tests can run several apps)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..operators import OPERATORS, OperatorDesc, short_name

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MODEL_VERSION = "1"  # every operator is a /v2 model with this one version


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
        self.triton = TritonMetrics()
        self._series: dict[str, OperatorSeries] = {}

    def operator(self, name: str) -> OperatorSeries:
        """The labelled series of one operator's successful executions (resolved once: prometheus_client's
        labels() is a few microseconds a call)."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = OperatorSeries(
                self.requests.labels(name, "200"),
                self.request_seconds.labels(name),
                self.queue_seconds.labels(name),
                self.kernel_seconds.labels(name),
                self.bytes_in.labels(name),
                self.bytes_out.labels(name),
            )
        return series

    def exposition(self) -> bytes:
        """The text of GET /metrics: vkact's registry, then the Triton-named family."""
        return generate_latest(self.registry) + self.triton.render()


@dataclass(frozen=True)
class OperatorSeries:
    ok: Counter
    request_seconds: Histogram
    queue_seconds: Histogram
    kernel_seconds: Histogram
    bytes_in: Counter
    bytes_out: Counter


@dataclass
class _ModelStats:
    """Triton's per-model values; the durations are cumulative microseconds, as Triton's are."""

    nv_inference_request_success: float = 0
    nv_inference_request_failure: float = 0
    nv_inference_count: float = 0
    nv_inference_exec_count: float = 0
    nv_inference_request_duration_us: float = 0
    nv_inference_queue_duration_us: float = 0
    nv_inference_compute_infer_duration_us: float = 0
    nv_inference_pending_request_count: float = 0


_HELP = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (one per request)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (a dynamic batch is one)"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative compute inference duration in microseconds"),
    "nv_inference_pending_request_count": ("gauge", "Instantaneous number of pending requests awaiting execution per-model"),
}


class _Pending:
    def __init__(self, stats: _ModelStats) -> None:
        self._stats = stats

    def add(self, n: int) -> None:
        self._stats.nv_inference_pending_request_count += n


class TritonMetrics:
    """Triton's per-model metric names, labelled ``model`` and ``version``, so existing Triton dashboards
    work unchanged. Rendered by hand: prometheus_client would add ``_total`` to every counter, and
    Triton's series are named without it. Both /v1 and /v2 executions count (the model is the operator)."""

    def __init__(self) -> None:
        # Every model from the start, at zero, as Triton lists each loaded model.
        self._models: dict[str, _ModelStats] = {short_name(op): _ModelStats() for op in OPERATORS.values()}
        self._by_type: dict[type, _ModelStats] = {}
        self._pending: dict[type, _Pending] = {}

    def _stats(self, op: OperatorDesc | type[OperatorDesc]) -> _ModelStats:
        kind = type(op) if isinstance(op, OperatorDesc) else op
        stats = self._by_type.get(kind)
        if stats is None:
            stats = self._by_type[kind] = self._models.setdefault(short_name(kind), _ModelStats())
        return stats

    def pending(self, op: OperatorDesc) -> _Pending:
        found = self._pending.get(type(op))
        if found is None:  # one per model, made once: every request asks for it
            found = self._pending[type(op)] = _Pending(self._stats(op))
        return found

    def failure(self, op: OperatorDesc | type[OperatorDesc]) -> None:
        self._stats(op).nv_inference_request_failure += 1

    def success(self, op: OperatorDesc, seconds: float, queue_seconds: float, kernel_seconds: float, batch_size: int = 1) -> None:
        s = self._stats(op)
        s.nv_inference_request_success += 1
        s.nv_inference_count += 1
        s.nv_inference_exec_count += 1 / batch_size  # one execution per batch, as Triton counts them
        s.nv_inference_request_duration_us += seconds * 1e6
        s.nv_inference_queue_duration_us += queue_seconds * 1e6
        s.nv_inference_compute_infer_duration_us += kernel_seconds * 1e6

    def render(self) -> bytes:
        lines = []
        for f in fields(_ModelStats):
            kind, text = _HELP[f.name]
            lines += [f"# HELP {f.name} {text}", f"# TYPE {f.name} {kind}"]
            for model, stats in sorted(self._models.items()):
                # integers, as Triton reports them (durations in whole microseconds)
                lines.append(f'{f.name}{{model="{model}",version="{MODEL_VERSION}"}} {round(getattr(stats, f.name))}')
        return ("\n".join(lines) + "\n").encode()
