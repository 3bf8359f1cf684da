import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import log_loss, ndcg_score, roc_auc_score

from hugerec.training.metrics import BinaryMetrics, auc, calibration, logloss, ndcg_at_k, recall_at_k


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.booleans()), min_size=2, max_size=60),
)
def test_auc_matches_sklearn_with_ties(pairs: list[tuple[int, bool]]) -> None:
    scores = torch.tensor([float(s) for s, _ in pairs])  # few distinct values: many ties
    labels = torch.tensor([float(y) for _, y in pairs])
    if labels.min() == labels.max():
        assert math.isnan(auc(scores, labels))
    else:
        assert auc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)


def test_auc_large_random_matches_sklearn() -> None:
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(20_000, generator=g) < 0.3).float()
    scores = labels * 0.5 + torch.randn(20_000, generator=g)
    assert auc(scores, labels) == pytest.approx(roc_auc_score(labels.numpy(), scores.numpy()), abs=1e-12)


def test_logloss_and_calibration() -> None:
    logits = torch.tensor([-2.0, 0.0, 1.5, 3.0])
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    p = torch.sigmoid(logits.double()).numpy()
    assert logloss(logits, labels) == pytest.approx(log_loss(labels.numpy(), p), rel=1e-12)
    assert calibration(logits, labels) == pytest.approx(p.mean() / 0.5)
    assert math.isnan(calibration(logits, torch.zeros(4)))


def test_streaming_equals_one_shot() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1000, generator=g)
    labels = (torch.rand(1000, generator=g) < torch.sigmoid(logits)).float()
    m = BinaryMetrics()
    for lo, la in zip(logits.split(97), labels.split(97), strict=True):
        m.update(lo, la)
    out = m.compute()
    assert out["auc"] == pytest.approx(roc_auc_score(labels.numpy(), logits.numpy()), abs=1e-12)
    assert out["logloss"] == pytest.approx(logloss(logits, labels))
    assert out["ctr"] == pytest.approx(float(labels.mean()))
    assert out["count"] == 1000
    m.reset()
    assert m.count == 0


def test_binary_metrics_rejects_bad_input() -> None:
    m = BinaryMetrics()
    with pytest.raises(ValueError, match=r"labels must be 0 or 1, got 0\.5"):
        m.update(torch.zeros(2), torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match=r"same shape \[N\]"):
        m.update(torch.zeros(3), torch.zeros(2))


def test_recall_at_k_by_hand() -> None:
    scores = torch.tensor([[0.9, 0.8, 0.1, 0.5], [0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 0.0]])
    relevant = torch.tensor([[True, False, True, False], [True, False, False, False], [False, False, False, False]])
    # query 0: top-2 = items 0, 1 -> 1 of 2 relevant; query 1: top-2 = items 3, 2 -> 0 of 1; query 2 has none
    assert recall_at_k(scores, relevant, 2) == pytest.approx((0.5 + 0.0) / 2)
    assert recall_at_k(scores, relevant, 4) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        recall_at_k(scores, relevant, 0)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_ndcg_matches_sklearn(k: int) -> None:
    g = torch.Generator().manual_seed(2)
    scores = torch.rand(20, 10, generator=g)  # distinct scores: no tie handling differences
    relevance = torch.randint(0, 4, (20, 10), generator=g).float()
    expected = ndcg_score(relevance.numpy(), scores.numpy(), k=k)
    assert ndcg_at_k(scores, relevance, k) == pytest.approx(float(expected), abs=1e-12)
    assert ndcg_at_k(relevance, relevance, k) == pytest.approx(float(np.mean(relevance.sum(1).numpy() > 0)))
