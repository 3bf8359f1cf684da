"""Monitor kernels against plain-Python references, the report, its Prometheus and PNG outputs, drift on the stream."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.continuous.decisions import DecisionConfig, retrain_reason
from hugerec.continuous.monitor import (
    MonitorConfig,
    Reference,
    auc,
    categorical_counts,
    js_distance,
    numeric_counts,
    numeric_edges,
    profile_counts,
    psi,
    report,
    top_ids,
    write_png,
    write_prometheus,
)
from hugerec.data.synthetic_stream import Stream, StreamConfig


def slow_psi(r: list[float], c: list[float]) -> float:
    rs, cs = sum(r) or 1, sum(c) or 1
    total = 0.0
    for a, b in zip(r, c, strict=True):
        pa_, pb = max(a / rs, 1e-4), max(b / cs, 1e-4)
        total += (pb - pa_) * math.log(pb / pa_)
    return total


def slow_js(r: list[float], c: list[float]) -> float:
    p = [a / sum(r) for a in r]
    q = [b / sum(c) for b in c]
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl = lambda x, y: sum(a * math.log2(a / b) for a, b in zip(x, y, strict=True) if a > 0)  # noqa: E731
    return math.sqrt(max((kl(p, m) + kl(q, m)) / 2, 0.0))


def slow_auc(s: list[float], y: list[float]) -> float:
    pos = [a for a, b in zip(s, y, strict=True) if b > 0.5]
    neg = [a for a, b in zip(s, y, strict=True) if b <= 0.5]
    if not pos or not neg:
        return math.nan
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg) / (len(pos) * len(neg))


counts = st.lists(st.integers(0, 50), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(counts, st.data())
def test_psi_and_js_match_the_plain_formulas(r: list[int], data: st.DataObject) -> None:
    c = data.draw(st.lists(st.integers(0, 50), min_size=len(r), max_size=len(r)))
    got = psi(np.array([r], float), np.array([c], float))[0]
    assert got == pytest.approx(slow_psi(r, c), rel=1e-9, abs=1e-12)
    if sum(r) and sum(c):
        assert js_distance(np.array([r], float), np.array([c], float))[0] == pytest.approx(slow_js(r, c), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.1, 0.2, 0.5, 0.7, 0.9]), st.integers(0, 1)), max_size=40))
def test_auc_matches_pairwise_count_with_ties(pairs: list[tuple[float, int]]) -> None:
    s = [p for p, _ in pairs]
    y = [float(t) for _, t in pairs]
    got, want = auc(np.array(s), np.array(y)), slow_auc(s, y)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-5, 5), st.just(math.nan)), min_size=1, max_size=60), st.integers(2, 6))
def test_numeric_buckets_match_a_loop(values: list[float], buckets: int) -> None:
    x = np.array(values)
    edges = numeric_edges(x, buckets)
    want = [0] * (edges.size + 2)
    for v in values:
        if math.isnan(v):
            want[-1] += 1
        else:
            want[sum(1 for e in edges if e <= v)] += 1
    assert numeric_counts(x, edges).tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=60), st.integers(1, 5))
def test_categorical_buckets_match_a_loop(rows: list[tuple[int, bool]], k: int) -> None:
    ids = np.array([i for i, _ in rows])
    valid = np.array([v for _, v in rows])
    top = top_ids(ids, valid, k)
    freq = Counter(i for i, v in rows if v)
    assert set(top.tolist()) <= set(freq) and len(top) == min(k, len(freq))
    assert all(freq[t] >= freq[o] for t in top.tolist() for o in set(freq) - set(top.tolist()))
    want = [0] * (top.size + 2)
    for i, v in rows:
        if not v:
            want[-1] += 1
        elif i in top.tolist():
            want[top.tolist().index(i)] += 1
        else:
            want[-2] += 1
    assert categorical_counts(ids, valid, top).tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=60), st.integers(1, 5))
def test_profile_buckets_match_a_loop(rows: list[tuple[int, bool]], k: int) -> None:
    freq = sorted(Counter(i for i, v in rows if v).values(), reverse=True)
    want = [*(freq[:k] + [0] * max(0, k - len(freq))), sum(freq[k:]), sum(1 for _, v in rows if not v)]
    ids = np.array([i for i, _ in rows])
    valid = np.array([v for _, v in rows])
    assert profile_counts(ids, valid, k).tolist() == want


def _requests(table: pa.Table, version: str, p: np.ndarray) -> pa.Table:
    return table.append_column("prediction", pa.array(p.astype(np.float32))).append_column(
        "version", pa.array([version] * table.num_rows)
    )


def test_stream_drift_is_found_on_the_shift_day_only_and_kpis_per_role(tmp_path: Path) -> None:
    cfg = StreamConfig(days=4, rows_per_day=20_000, num_sparse=3, num_dense=2, vocabulary=300, feature_shift_day=3)
    stream = Stream(cfg)
    days = [stream.day(d) for d in range(4)]
    config = MonitorConfig()
    alarm = DecisionConfig(psi_alarm=0.2)
    for d in (1, 2, 3):
        ref = Reference.of(days[d - 1].table, cfg.dense_names, cfg.sparse_names, config)
        rep = report(d, ref, days[d].table)
        fired = retrain_reason(rep.observation(), None, alarm)
        assert (fired is not None) == (d == 3), (d, rep.psi)
    assert fired is not None and "d0" in fired.reason and "c0" in fired.reason and "c2" not in fired.reason
    assert not fired.concept
    # KPIs per role: the oracle's probabilities as the stable, noise as the canary (rows carry their label)
    t = days[2].table
    half = t.num_rows // 2
    noise = np.random.default_rng(0).random(t.num_rows - half)
    labelled = pa.concat_tables(
        [_requests(t.slice(0, half), "s", days[2].probability[:half]), _requests(t.slice(half), "c", noise)]
    )
    ref = Reference.of(days[1].table, cfg.dense_names, cfg.sparse_names, config, days[1].probability)
    rep = report(2, ref, labelled, {"s": "stable", "c": "canary"}, labelled)
    assert rep.kpis["stable"].auc > 0.75 and abs(rep.kpis["canary"].auc - 0.5) < 0.05
    assert rep.kpis["stable"].count == half and rep.prediction["psi"] > 0.2  # uniform noise moves the predictions
    prom = write_prometheus(rep, tmp_path / "w.prom").read_text()
    assert 'hugerec_monitor_kpi{kpi="auc",role="stable"}' in prom and 'hugerec_monitor_psi{feature="d0"}' in prom
    png = write_png(rep, tmp_path / "w.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
