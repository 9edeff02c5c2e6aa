"""Prometheus metrics of one HTTP process (its own registry, so tests can run several apps).

The per-operator execution series (requests by status, durations, tensor bytes) are written on every
request, so they are plain numbers kept by this module and turned into Prometheus families only when
/metrics is read: prometheus_client takes a lock and scans a histogram's buckets in Python for each
observation (three histograms and three counters cost ~20 us a request here, and their code and
data crowd the CPU caches the next request needs). Everything happens on the event loop's thread."""
from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from ..operators import OPERATORS, OperatorDesc, short_name

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MODEL_VERSION = "1"  # every operator is a /v2 model with this one version

# name, help: the histograms of OperatorSeries, in its field order
_HISTOGRAMS = (
    ("vkact_request_duration_seconds", "Request handling time"),
    ("vkact_queue_duration_seconds", "Time queued before the device"),
    ("vkact_kernel_duration_seconds", "Device time per request"),
)


class Histogram:
    """Counts per LATENCY_BUCKETS bucket (the last one +Inf) and the sum of the observations."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound, as Prometheus exposes them."""
        out, total = [], 0
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), self.counts):
            total += count
            out.append((floatToGoString(bound), total))
        return out


@dataclass
class OperatorSeries:
    """One operator's successful executions."""

    ok: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    request_seconds: Histogram = field(default_factory=Histogram)
    queue_seconds: Histogram = field(default_factory=Histogram)
    kernel_seconds: Histogram = field(default_factory=Histogram)

    def record(self, seconds: float, queue_seconds: float, kernel_seconds: float, bytes_in: int, bytes_out: int) -> None:
        self.ok += 1
        self.bytes_in += bytes_in
        self.bytes_out += bytes_out
        self.request_seconds.observe(seconds)
        self.queue_seconds.observe(queue_seconds)
        self.kernel_seconds.observe(kernel_seconds)


class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.errors = Counter("vkact_errors", "Requests answered with an error, by status", ["code"], registry=r)
        self.queue_depth = Gauge("vkact_queue_depth", "Requests holding a device slot (queued or running)", registry=r)
        self.worker_restarts = Gauge("vkact_worker_restarts", "Times the device worker was restarted", registry=r)
        self.grpc_connections = Gauge("vkact_grpc_connections", "gRPC connections open in this HTTP process", registry=r)
        self.grpc_calls = Gauge("vkact_grpc_calls", "gRPC calls in progress in this HTTP process (bounded by VKACT_MAX_CONNECTIONS)", registry=r)
        self.inflight_bytes = Gauge("vkact_inflight_bytes", "Request bytes held by requests in flight, and gRPC answers not yet read (bounded by VKACT_INFLIGHT_BYTES)", registry=r)
        self.triton = TritonMetrics()
        self._series: dict[str, OperatorSeries] = {}
        self._failed: dict[tuple[str, str], int] = {}  # (operator, status): failed executions
        r.register(_OperatorFamilies(self))

    def operator(self, name: str) -> OperatorSeries:
        """The series of one operator's successful executions."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = OperatorSeries()
        return series

    def failed(self, operator: str, status: int) -> None:
        """An execution request of ``operator`` ('-' before it is known) answered with ``status``."""
        key = (operator, str(status))
        self._failed[key] = self._failed.get(key, 0) + 1

    def exposition(self) -> bytes:
        """The text of GET /metrics: vkact's registry, then the Triton-named family."""
        return generate_latest(self.registry) + self.triton.render()


class _OperatorFamilies:
    """The per-operator series as Prometheus families, made when /metrics is read."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        series = sorted(self._metrics._series.items())
        requests = CounterMetricFamily("vkact_requests", "Execute requests by operator and HTTP status", labels=["operator", "code"])
        for name, s in series:
            requests.add_metric([name, "200"], s.ok)
        for (name, code), count in sorted(self._metrics._failed.items()):
            requests.add_metric([name, code], count)
        yield requests
        for i, (family, text) in enumerate(_HISTOGRAMS):
            histogram = HistogramMetricFamily(family, text, labels=["operator"])
            for name, s in series:
                h = (s.request_seconds, s.queue_seconds, s.kernel_seconds)[i]
                histogram.add_metric([name], h.buckets(), h.sum)
            yield histogram
        for family, text, attr in (("vkact_tensor_bytes_in", "Input tensor bytes", "bytes_in"), ("vkact_tensor_bytes_out", "Output tensor bytes", "bytes_out")):
            counter = CounterMetricFamily(family, text, labels=["operator"])
            for name, s in series:
                counter.add_metric([name], getattr(s, attr))
            yield counter


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
    nv_inference_compute_input_duration_us: float = 0
    nv_inference_compute_output_duration_us: float = 0
    nv_inference_pending_request_count: float = 0
    # for the statistics extension only (not rendered as metrics)
    failure_duration_us: float = 0
    last_inference_ms: int = 0  # ms since the epoch of the last answered inference, success or failure
    batches: dict[int, list[float]] = field(default_factory=dict)  # batch size -> [executions, kernel us]


ModelStats = _ModelStats  # what a graph model (dataplane.graph_models) holds of its statistics


_HELP = {
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_count": ("counter", "Number of inferences performed (one per request)"),
    "nv_inference_exec_count": ("counter", "Number of model executions performed (a dynamic batch is one)"),
    "nv_inference_request_duration_us": ("counter", "Cumulative inference request duration in microseconds"),
    "nv_inference_queue_duration_us": ("counter", "Cumulative inference queuing duration in microseconds"),
    "nv_inference_compute_infer_duration_us": ("counter", "Cumulative compute inference duration in microseconds"),
    "nv_inference_compute_input_duration_us": ("counter", "Cumulative compute input duration in microseconds (the host's work around the dispatch)"),
    "nv_inference_compute_output_duration_us": ("counter", "Cumulative compute output duration in microseconds (0: within compute input)"),
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

    def add_model(self, name: str) -> _ModelStats:
        """A loaded graph model's statistics, at zero (dataplane.graph_models)."""
        stats = self._models[name] = _ModelStats()
        return stats

    def model(self, name: str) -> _ModelStats | None:
        return self._models.get(name)

    def drop_model(self, name: str) -> None:
        """An unloaded graph model leaves the statistics and /metrics, as Triton's unloaded models do."""
        self._models.pop(name, None)

    def _stats(self, op: OperatorDesc | type[OperatorDesc] | _ModelStats) -> _ModelStats:
        if isinstance(op, _ModelStats):  # a graph model's
            return op
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

    def failure(self, op: OperatorDesc | type[OperatorDesc] | _ModelStats, seconds: float = 0.0) -> None:
        """A failed inference; ``seconds`` from its arrival to its failure, where the protocol measured it."""
        s = self._stats(op)
        s.nv_inference_request_failure += 1
        s.failure_duration_us += seconds * 1e6
        s.last_inference_ms = time.time_ns() // 1_000_000

    def success(self, op: OperatorDesc | _ModelStats, seconds: float, queue_seconds: float, kernel_seconds: float) -> None:
        s = self._stats(op)
        s.nv_inference_request_success += 1
        s.nv_inference_count += 1
        s.nv_inference_request_duration_us += seconds * 1e6
        s.nv_inference_queue_duration_us += queue_seconds * 1e6
        s.nv_inference_compute_infer_duration_us += kernel_seconds * 1e6
        s.nv_inference_compute_input_duration_us += max(0.0, seconds - queue_seconds - kernel_seconds) * 1e6
        s.last_inference_ms = time.time_ns() // 1_000_000

    def execution(self, op: type[OperatorDesc] | _ModelStats, batch_size: int, kernel_seconds: float) -> None:
        """One dispatch the device answered (DeviceWorker.on_execution): ``batch_size`` jobs in it."""
        s = self._stats(op)
        s.nv_inference_exec_count += 1
        counts = s.batches.setdefault(batch_size, [0, 0.0])
        counts[0] += 1
        counts[1] += kernel_seconds * 1e6

    def render(self) -> bytes:
        lines = []
        for name, (kind, text) in _HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for model, stats in sorted(self._models.items()):
                # integers, as Triton reports them (durations in whole microseconds)
                lines.append(f'{name}{{model="{model}",version="{MODEL_VERSION}"}} {round(getattr(stats, name))}')
        return ("\n".join(lines) + "\n").encode()

    def statistics(self, model: str | None = None) -> list[dict[str, Any]]:
        """Triton's statistics extension (``model_stats``) for one model or all, every number a JSON
        integer (perf_analyzer reads them as such). vkact times three spans of an inference: the whole
        request (success), its wait for the device (queue) and the dispatch (compute_infer); the host's
        work around the dispatch (decoding inputs, copies, encoding outputs) is compute_input, and
        compute_output, which vkact does not time apart, has the same count and 0 ns. fail's ns are
        those gRPC measures (an HTTP failure is answered by the error handlers, which know no start
        time: it adds 0 ns). Each success is one inference; execution_count counts the dispatches the
        device answered (a dynamic batch is one), and batch_stats splits them by size: compute_infer
        is each dispatch's time, compute_input and compute_output count them with 0 ns (not timed
        per dispatch)."""
        names = sorted(self._models) if model is None else [model]
        out = []
        for name in names:
            s = self._models[name]
            ok = int(s.nv_inference_request_success)

            def span(count: int, us: float) -> dict[str, int]:
                return {"count": count, "ns": round(us * 1000)}

            out.append({
                "name": name,
                "version": MODEL_VERSION,
                "last_inference": s.last_inference_ms,
                "inference_count": int(s.nv_inference_count),
                "execution_count": round(s.nv_inference_exec_count),
                "inference_stats": {
                    "success": span(ok, s.nv_inference_request_duration_us),
                    "fail": span(int(s.nv_inference_request_failure), s.failure_duration_us),
                    "queue": span(ok, s.nv_inference_queue_duration_us),
                    "compute_input": span(ok, s.nv_inference_compute_input_duration_us),
                    "compute_infer": span(ok, s.nv_inference_compute_infer_duration_us),
                    "compute_output": span(ok, 0.0),
                    "cache_hit": span(0, 0.0),
                    "cache_miss": span(0, 0.0),
                },
                "batch_stats": [
                    {"batch_size": size, "compute_input": span(n, 0.0), "compute_infer": span(n, us), "compute_output": span(n, 0.0)}
                    for size, (n, us) in sorted(s.batches.items())
                ],
                "memory_usage": [],
                "response_stats": {},
            })
        return out
