"""vkact's per-operator metrics (service/dataplane/metrics.py): kept as plain numbers, exposed as Prometheus
families; read back with prometheus_client's own text parser."""
from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from service.dataplane.metrics import LATENCY_BUCKETS, Histogram, Metrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_histogram_buckets_are_cumulative_with_inclusive_bounds():
    h = Histogram()
    for v in (0.0005, 0.0007, 3.0, 20.0):  # on a bound, between two, high, beyond the last
        h.observe(v)
    got = dict(h.buckets())
    assert got["0.0005"] == 1 and got["0.001"] == 2 and got["2.5"] == 2 and got["5.0"] == 3 and got["10.0"] == 3 and got["+Inf"] == 4
    assert len(got) == len(LATENCY_BUCKETS) + 1 and math.isclose(h.sum, 23.0012)


def test_exposition():
    m = Metrics()
    m.operator("DML_OPERATOR_ACTIVATION_SHRINK").record(0.0008, 0.0001, 0.00005, 4096, 4096)
    m.operator("DML_OPERATOR_ACTIVATION_SHRINK").record(0.2, 0.15, 0.04, 64, 64)
    m.operator("DML_OPERATOR_ACTIVATION_CELU").record(0.003, 0.0, 0.001, 16, 16)
    m.failed("DML_OPERATOR_ACTIVATION_SHRINK", 400)
    m.failed("-", 400)
    m.failed("-", 400)
    s = _samples(m.exposition().decode())
    shrink = (("operator", "DML_OPERATOR_ACTIVATION_SHRINK"),)
    assert s[("vkact_requests_total", (("code", "200"), ("operator", "DML_OPERATOR_ACTIVATION_SHRINK")))] == 2
    assert s[("vkact_requests_total", (("code", "400"), ("operator", "DML_OPERATOR_ACTIVATION_SHRINK")))] == 1
    assert s[("vkact_requests_total", (("code", "400"), ("operator", "-")))] == 2
    assert s[("vkact_requests_total", (("code", "200"), ("operator", "DML_OPERATOR_ACTIVATION_CELU")))] == 1
    assert s[("vkact_request_duration_seconds_count", shrink)] == 2
    assert math.isclose(s[("vkact_request_duration_seconds_sum", shrink)], 0.2008)
    assert s[("vkact_request_duration_seconds_bucket", (("le", "0.001"), *shrink))] == 1
    assert s[("vkact_request_duration_seconds_bucket", (("le", "0.25"), *shrink))] == 2
    assert s[("vkact_queue_duration_seconds_bucket", (("le", "0.1"), *shrink))] == 1
    assert s[("vkact_kernel_duration_seconds_bucket", (("le", "0.05"), *shrink))] == 2
    assert s[("vkact_tensor_bytes_in_total", shrink)] == 4160 and s[("vkact_tensor_bytes_out_total", shrink)] == 4160
    assert s[("vkact_queue_depth", ())] == 0
