"""Evaluation metrics: exact streaming AUC, logloss and calibration for CTR; recall@k and NDCG@k for retrieval.

AUC is exact over the whole evaluation set (not an average of per-batch AUCs): `BinaryMetrics`
keeps every logit and label (5 bytes per example) and ranks them once in `compute()`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact ROC AUC of `scores` [N] against binary `labels` [N] (ties count one half).

    Mann-Whitney form: (sum of the positives' ranks - P (P + 1) / 2) / (P * Q), with tied scores
    sharing their average rank; equal to sklearn's roc_auc_score. NaN when only one class is present.
    """
    scores, labels = _check_pair("auc", scores, labels)
    n = scores.numel()
    positives = float(labels.sum())
    negatives = n - positives
    if positives == 0 or negatives == 0:
        return math.nan
    sorted_scores, order = torch.sort(scores.to(torch.float64))
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    # 1-based rank of each group's last element minus half the group's spread = the group's average rank
    group_rank = torch.cumsum(counts, 0).to(torch.float64) - (counts.to(torch.float64) - 1.0) / 2.0
    ranks = group_rank[inverse]  # [N] in sorted order
    positive_rank_sum = float(ranks[labels[order] > 0.5].sum())
    return (positive_rank_sum - positives * (positives + 1.0) / 2.0) / (positives * negatives)


def logloss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean binary cross-entropy of sigmoid(`logits`) [N] against `labels` [N], in float64."""
    logits, labels = _check_pair("logloss", logits, labels)
    if logits.numel() == 0:
        return math.nan
    return float(F.binary_cross_entropy_with_logits(logits.to(torch.float64), labels.to(torch.float64)))


def calibration(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean predicted CTR / observed CTR (1.0 = calibrated; NaN without positives)."""
    logits, labels = _check_pair("calibration", logits, labels)
    observed = float(labels.to(torch.float64).sum())
    if observed == 0:
        return math.nan
    return float(torch.sigmoid(logits.to(torch.float64)).sum()) / observed


class BinaryMetrics:
    """Streaming CTR metrics: `update` per batch, `compute` once over everything seen.

    m = BinaryMetrics()
    for batch in data:
        m.update(model(batch), batch.labels)     # logits [B], labels [B] in {0, 1}
    m.compute()  # {"auc", "logloss", "calibration", "ctr", "count"}
    """

    def __init__(self) -> None:
        self._logits: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        logits, labels = _check_pair("BinaryMetrics.update", logits.detach(), labels.detach())
        if labels.numel() and not bool(((labels == 0) | (labels == 1)).all()):
            bad = labels[(labels != 0) & (labels != 1)][0]
            raise ValueError(f"BinaryMetrics.update: labels must be 0 or 1, got {float(bad)}")
        self._logits.append(logits.to("cpu", torch.float32))
        self._labels.append(labels.to("cpu", torch.uint8))

    def reset(self) -> None:
        self._logits.clear()
        self._labels.clear()

    @property
    def count(self) -> int:
        return sum(t.numel() for t in self._labels)

    def compute(self) -> dict[str, float]:
        logits = torch.cat(self._logits) if self._logits else torch.zeros(0)
        labels = torch.cat(self._labels).to(torch.float32) if self._labels else torch.zeros(0)
        count = labels.numel()
        return {
            "auc": auc(logits, labels),
            "logloss": logloss(logits, labels),
            "calibration": calibration(logits, labels),
            "ctr": float(labels.mean()) if count else math.nan,
            "count": float(count),
        }


def recall_at_k(scores: torch.Tensor, relevant: torch.Tensor, k: int) -> float:
    """Mean over queries of |relevant items in the top k| / |relevant items|.

    scores [Q, I] model scores of I candidate items per query; relevant [Q, I] bool.
    Queries without any relevant item are left out of the mean (NaN if none has one).
    """
    topk = _top_k("recall_at_k", scores, relevant, k)  # [Q, k]
    rel = relevant.to(torch.float64)
    hits = torch.gather(rel, 1, topk).sum(dim=1)  # [Q]
    total = rel.sum(dim=1)  # [Q]
    has = total > 0
    if not bool(has.any()):
        return math.nan
    return float((hits[has] / total[has]).mean())


def ndcg_at_k(scores: torch.Tensor, relevance: torch.Tensor, k: int) -> float:
    """Mean NDCG@k over queries with linear gains: sum rel_i / log2(i + 2) over the top k, normalised
    by the same sum over the ideal order (as sklearn's ndcg_score).

    scores [Q, I]; relevance [Q, I] >= 0 graded relevance. Queries whose ideal DCG is 0 score 0.
    """
    topk = _top_k("ndcg_at_k", scores, relevance, k)  # [Q, k]
    rel = relevance.to(torch.float64)
    kk = topk.shape[1]
    discount = 1.0 / torch.log2(torch.arange(kk, dtype=torch.float64) + 2.0)  # [k]
    dcg = (torch.gather(rel, 1, topk) * discount).sum(dim=1)  # [Q]
    ideal = (torch.topk(rel, kk, dim=1).values * discount).sum(dim=1)  # [Q]
    ndcg = torch.where(ideal > 0, dcg / ideal.clamp_min(1e-300), torch.zeros_like(dcg))
    return float(ndcg.mean()) if ndcg.numel() else math.nan


def _top_k(where: str, scores: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
    if scores.dim() != 2 or scores.shape != target.shape:
        raise ValueError(
            f"{where}: scores and targets must both be [Q, I], got {tuple(scores.shape)} and {tuple(target.shape)}"
        )
    if k < 1:
        raise ValueError(f"{where}: k must be >= 1, got {k}")
    return torch.topk(scores, min(k, scores.shape[1]), dim=1).indices


def _check_pair(where: str, scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if scores.dim() != 1 or scores.shape != labels.shape:
        raise ValueError(
            f"{where}: expected scores and labels of the same shape [N], got {tuple(scores.shape)} "
            f"and {tuple(labels.shape)}"
        )
    return scores, labels
