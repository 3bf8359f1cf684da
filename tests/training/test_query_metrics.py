"""NDCG@K, MAP@K, MRR@K per query against the per-query reference: ties, one-row queries, K beyond a query."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.training.query_metrics import query_metrics, query_metrics_reference


@st.composite
def queries(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    sizes = draw(st.lists(st.integers(1, 7), min_size=1, max_size=8))
    n = sum(sizes)
    scores = draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, 3.25]), min_size=n, max_size=n))  # many ties
    labels = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    k = draw(st.integers(1, 9))  # often beyond a query's size
    return np.asarray(scores), np.asarray(labels, np.float64), np.asarray(sizes), k


@settings(max_examples=150, deadline=None)
@given(queries())
def test_equals_the_reference(case: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
    scores, labels, sizes, k = case
    got, want = query_metrics(scores, labels, sizes, k), query_metrics_reference(scores, labels, sizes, k)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert (math.isnan(got[key]) and math.isnan(value)) or got[key] == pytest.approx(value, abs=1e-12), key


def test_known_values() -> None:
    # one query: grades 3, 0, 1 ranked by score as rows 1, 0, 2 (ties keep row order: 0 before 2)
    scores, labels, sizes = np.array([1.0, 2.0, 1.0]), np.array([3.0, 0.0, 1.0]), np.array([3])
    m = query_metrics(scores, labels, sizes, 2)
    assert m["ndcg@2"] == pytest.approx((7 / math.log2(3)) / (7 + 1 / math.log2(3)))
    assert m["map@2"] == pytest.approx((1 / 2) / 2) and m["mrr@2"] == pytest.approx(1 / 2)
    perfect = query_metrics(np.array([3.0, 2.0, 1.0, 5.0]), np.array([2.0, 1.0, 0.0, 0.0]), np.array([3, 1]), 10)
    assert perfect == {"ndcg@10": 1.0, "map@10": 1.0, "mrr@10": 1.0, "queries": 1.0, "queries_without_relevant": 1.0}


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="sum to the 3 rows"):
        query_metrics(np.zeros(3), np.zeros(3), np.array([2]), 5)
    with pytest.raises(ValueError, match="relevance grades"):
        query_metrics(np.zeros(2), np.array([0.5, 1.0]), np.array([2]), 5)
    with pytest.raises(ValueError, match="k must be"):
        query_metrics(np.zeros(2), np.zeros(2), np.array([2]), 0)
