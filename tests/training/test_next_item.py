from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.training.next_item import rank_metrics, target_ranks


def _slow(scores: np.ndarray, targets: np.ndarray, exclude: list[list[int]], ks: tuple[int, ...]) -> dict[str, float]:
    out: dict[str, list[float]] = {}
    for q, t in enumerate(targets):
        items = [j for j in range(1, scores.shape[1] + 1) if j == t or j not in exclude[q]]
        order = sorted(items, key=lambda j: (-scores[q, j - 1], j))
        r = order.index(t)
        for k in ks:
            out.setdefault(f"recall@{k}", []).append(float(r < k))
            out.setdefault(f"mrr@{k}", []).append(1 / (r + 1) if r < k else 0.0)
            out.setdefault(f"ndcg@{k}", []).append(1 / math.log2(r + 2) if r < k else 0.0)
    return {k: float(np.mean(v)) for k, v in out.items()}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_metrics_match_slow_reference(data: st.DataObject) -> None:
    q = data.draw(st.integers(1, 12))
    n = data.draw(st.integers(1, 9))
    scores = np.array(data.draw(st.lists(st.integers(-2, 2), min_size=q * n, max_size=q * n)), dtype=np.float32).reshape(q, n)
    targets = np.array(data.draw(st.lists(st.integers(1, n), min_size=q, max_size=q)))
    exclude = [sorted(set(data.draw(st.lists(st.integers(1, n), max_size=4)))) for _ in range(q)]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in exclude])]).astype(np.int64)
    items = np.array([j for e in exclude for j in e], dtype=np.int64)
    block = data.draw(st.integers(1, 5))
    ks = (1, 3, 10)
    ranks = target_ranks(lambda a, b: torch.from_numpy(scores[a:b]), targets, n, (offsets, items), block)
    got = rank_metrics(ranks, ks)
    want = _slow(scores, targets, exclude, ks)
    for key, value in want.items():
        assert got[key] == pytest.approx(value)
    assert got["queries"] == q
    # monotone in K: the bug class of Recall@1 > Recall@5
    assert got["recall@1"] <= got["recall@3"] <= got["recall@10"]


def test_protocols_agree_without_exclusions() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(20, 30)).astype(np.float32)
    targets = rng.integers(1, 31, 20)
    empty = (np.zeros(21, dtype=np.int64), np.empty(0, dtype=np.int64))
    a = target_ranks(lambda x, y: torch.from_numpy(scores[x:y]), targets, 30, None)
    b = target_ranks(lambda x, y: torch.from_numpy(scores[x:y]), targets, 30, empty, block=3)
    assert (a == b).all()
    # and they agree with the top-K view: the target is in torch.topk's first K iff rank < K
    top = torch.topk(torch.from_numpy(scores), 5).indices.numpy() + 1
    assert ((top == targets[:, None]).any(1) == (a < 5)).all()


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"targets must be item ids in 1..3, got range 0..2"):
        target_ranks(lambda a, b: torch.zeros(b - a, 3), np.array([0, 2]), 3)
    with pytest.raises(ValueError, match="expected"):
        target_ranks(lambda a, b: torch.zeros(b - a, 2), np.array([1]), 3)
    with pytest.raises(ValueError, match="ks"):
        rank_metrics(np.array([0]), ks=(0,))
