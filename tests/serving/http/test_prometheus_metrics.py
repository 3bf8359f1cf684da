"""ServerMetrics: the /metrics body in Prometheus' text format, parsed back with prometheus_client's own
parser: request counts and latencies, batch sizes, and the parameter servers' tier counters read at scrape time."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hugerec.serving.http.prometheus_metrics import ServerMetrics
from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.parameter_server import ParameterServer, TableSpec, TableUpdate


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_an_empty_server_renders_no_samples_of_labelled_metrics() -> None:
    samples = _samples(ServerMetrics())
    assert not any(name.startswith(("hugerec_requests", "hugerec_ps_")) for name, _ in samples)


def test_answered_requests_are_counted_per_label_set() -> None:
    metrics = ServerMetrics()
    metrics.answered("m", "1", "infer", 200, 0.003)
    metrics.answered("m", "1", "infer", 200, 0.3)
    metrics.answered("m", "1", "infer", 400, 0.001)
    samples = _samples(metrics)
    ok = (("code", "200"), ("endpoint", "infer"), ("model", "m"), ("version", "1"))
    bad = (("code", "400"), ("endpoint", "infer"), ("model", "m"), ("version", "1"))
    assert samples[("hugerec_requests_total", ok)] == 2.0
    assert samples[("hugerec_requests_total", bad)] == 1.0
    latency = (("endpoint", "infer"), ("model", "m"))
    assert samples[("hugerec_request_seconds_count", latency)] == 3.0
    assert samples[("hugerec_request_seconds_sum", latency)] == pytest.approx(0.304)
    assert samples[("hugerec_request_seconds_bucket", tuple(sorted((*latency, ("le", "0.005")))))] == 2.0
    assert samples[("hugerec_request_seconds_bucket", tuple(sorted((*latency, ("le", "+Inf")))))] == 3.0


def test_batch_observer_records_rows_requests_and_seconds() -> None:
    metrics = ServerMetrics()
    observe = metrics.batch_observer("m", "2")
    observe(rows=5, requests=2, seconds=0.01)
    observe(rows=64, requests=1, seconds=0.02)
    samples = _samples(metrics)
    labels = (("model", "m"), ("version", "2"))
    assert samples[("hugerec_batch_rows_sum", labels)] == 69.0
    assert samples[("hugerec_batch_requests_sum", labels)] == 3.0
    assert samples[("hugerec_batch_seconds_count", labels)] == 2.0
    assert samples[("hugerec_batch_rows_bucket", tuple(sorted((*labels, ("le", "8.0")))))] == 1.0


def test_parameter_server_counters_are_read_at_scrape_and_dropped_on_remove() -> None:
    ps = ParameterServer([TableSpec("user", 2)], MemoryStore({"user": 2}), device="cpu")
    ps.load([TableUpdate("user", np.array([1, 2], np.int64), np.ones((2, 2), np.float32))])
    metrics = ServerMetrics()
    metrics.parameter_servers.add("m", "1", ps)
    ps.apply([TableUpdate("user", np.array([3], np.int64), np.ones((1, 2), np.float32), deleted=np.array([2]))])
    ps.lookup("user", np.array([1, 2, 3, 1], np.int64))  # after add: the collector reads the live counters
    samples = _samples(metrics)
    memory = (("model", "m"), ("table", "user"), ("tier", "memory"), ("version", "1"))
    asked, found = ps.stats().at("user", "memory")
    assert (asked, found) == (4, 3)
    assert samples[("hugerec_ps_keys_total", memory)] == 4.0
    assert samples[("hugerec_ps_hits_total", memory)] == 3.0
    assert samples[("hugerec_ps_hit_rate", (("model", "m"), ("tier", "memory"), ("version", "1")))] == 0.75
    assert samples[("hugerec_ps_table_version", (("model", "m"), ("table", "user"), ("version", "1")))] == 1.0
    metrics.parameter_servers.remove("m", "1")
    metrics.parameter_servers.remove("m", "1")  # twice is harmless
    assert not any(name.startswith("hugerec_ps_") for name, _ in _samples(metrics))
    ps.close()


def test_two_servers_in_one_process_keep_their_own_counts() -> None:
    one, two = ServerMetrics(), ServerMetrics()
    one.answered("m", "1", "infer", 200, 0.001)
    assert not any(name == "hugerec_requests_total" for name, _ in _samples(two))
