"""Prometheus metrics of one server (its own registry, so several servers can live in one process).

    hugerec_requests_total{model, version, endpoint, code}       counter
    hugerec_request_seconds{model, endpoint}                     histogram, decode to response
    hugerec_batch_rows{model, version} / _batch_requests         histograms, one sample per model call
    hugerec_batch_seconds{model, version}                        histogram, lookups + dense program
    hugerec_updates_total{model, version, result}                counter of live updates applied / refused
    hugerec_ps_{keys,hits}_total{model, version, table, tier}    keys asked of / found in each tier
    hugerec_ps_{calls,seconds}_total{model, version, tier}       lookups reaching each tier, time spent there
    hugerec_ps_hit_rate{model, version, tier}                    hits / keys over all tables
    hugerec_ps_cache_rows{model, version, table}                 rows held by the cache tier
    hugerec_ps_table_version{model, version, table}              updates applied to each table

The parameter-server numbers are read when Prometheus scrapes (a custom collector), so the lookup
path only bumps plain integers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hugerec.serving.store.parameter_server import TIERS, ParameterServer

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_ROW_BUCKETS = tuple(float(2**i) for i in range(0, 17))


class _ParameterServerCollector(Collector):
    def __init__(self) -> None:
        self._servers: dict[tuple[str, str], ParameterServer] = {}
        self._lock = threading.Lock()

    def add(self, model: str, version: str, ps: ParameterServer) -> None:
        with self._lock:
            self._servers[(model, version)] = ps

    def remove(self, model: str, version: str) -> None:
        with self._lock:
            self._servers.pop((model, version), None)

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version", "table", "tier"]
        keys = CounterMetricFamily("hugerec_ps_keys", "Keys asked from a tier", labels=labels)
        hits = CounterMetricFamily("hugerec_ps_hits", "Keys found in a tier", labels=labels)
        calls = CounterMetricFamily(
            "hugerec_ps_calls", "Lookups that reached a tier", labels=["model", "version", "tier"]
        )
        seconds = CounterMetricFamily(
            "hugerec_ps_seconds", "Seconds spent in a tier", labels=["model", "version", "tier"]
        )
        rate = GaugeMetricFamily(
            "hugerec_ps_hit_rate", "Hits / keys of a tier over all tables", labels=["model", "version", "tier"]
        )
        cached = GaugeMetricFamily(
            "hugerec_ps_cache_rows", "Rows held by the cache tier", labels=["model", "version", "table"]
        )
        table_version = GaugeMetricFamily(
            "hugerec_ps_table_version", "Updates applied to a table", labels=["model", "version", "table"]
        )
        with self._lock:
            servers = dict(self._servers)
        for (model, version), ps in servers.items():
            stats = ps.stats()
            for i, tier in enumerate(TIERS):
                for j, table in enumerate(stats.tables):
                    keys.add_metric([model, version, table, tier], int(stats.keys[i, j]))
                    hits.add_metric([model, version, table, tier], int(stats.hits[i, j]))
                calls.add_metric([model, version, tier], int(stats.calls[i]))
                seconds.add_metric([model, version, tier], float(stats.seconds[i]))
                asked = int(stats.keys[i].sum())
                rate.add_metric([model, version, tier], int(stats.hits[i].sum()) / asked if asked else 0.0)
            for table, cache in ps.caches.items():
                cached.add_metric([model, version, table], len(cache))
            for table, v in ps.versions().items():
                table_version.add_metric([model, version, table], v)
        yield from (keys, hits, calls, seconds, rate, cached, table_version)


class ServerMetrics:
    """The metrics of one server; `render()` is the /metrics body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hugerec_requests", "Requests answered", ["model", "version", "endpoint", "code"], registry=self.registry
        )
        self.latency = Histogram(
            "hugerec_request_seconds",
            "Request latency",
            ["model", "endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_rows = Histogram(
            "hugerec_batch_rows",
            "Rows per model call",
            ["model", "version"],
            buckets=_ROW_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "hugerec_batch_requests",
            "Requests merged per model call",
            ["model", "version"],
            buckets=_ROW_BUCKETS,
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "hugerec_batch_seconds",
            "Seconds per model call",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.updates = Counter(
            "hugerec_updates", "Live updates", ["model", "version", "result"], registry=self.registry
        )
        self.parameter_servers = _ParameterServerCollector()
        self.registry.register(self.parameter_servers)

        self._answered: dict[tuple[str, str, str, int], tuple[Counter, Histogram]] = {}

    def answered(self, model: str, version: str, endpoint: str, code: int, seconds: float) -> None:
        """Count one request and its latency (the labelled children are looked up once per label set)."""
        key = (model, version, endpoint, code)
        children = self._answered.get(key)
        if children is None:
            children = (
                self.requests.labels(model, version, endpoint, str(code)),
                self.latency.labels(model, endpoint),
            )
            self._answered[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def batch_observer(self, model: str, version: str) -> BatchObserver:
        return BatchObserver(self, model, version)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class BatchObserver:
    """DynamicBatcher's on_batch callback for one model version."""

    def __init__(self, metrics: ServerMetrics, model: str, version: str) -> None:
        self._rows = metrics.batch_rows.labels(model, version)
        self._requests = metrics.batch_requests.labels(model, version)
        self._seconds = metrics.batch_seconds.labels(model, version)

    def __call__(self, rows: int, requests: int, seconds: float) -> None:
        self._rows.observe(rows)
        self._requests.observe(requests)
        self._seconds.observe(seconds)
