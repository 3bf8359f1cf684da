"""Learning-to-rank metrics per query, averaged: NDCG@K, MAP@K and MRR@K of scored rows grouped into queries.

    query_metrics(scores [N], labels [N] grades 0, 1, 2, ..., sizes [Q] (rows of a query contiguous), k=10)
        -> {"ndcg@10", "map@10", "mrr@10", "queries", "queries_without_relevant"}

Protocol (the same for every model, so numbers compare):
  - a query's rows are ranked by score, highest first; equal scores keep the rows' order (a stable sort,
    as LightGBM's own NDCG does);
  - with rel_r the grade of the row at rank r (0-based) and L the top min(K, size) rows:
      ndcg@K = sum_{r in L} (2^rel_r - 1) / log2(r + 2)  /  the same sum over the rows sorted by grade
      map@K  = sum_{r in L, rel_r > 0} precision@(r + 1)  /  min(K, number of rows with rel > 0)
      mrr@K  = 1 / (1 + the first r in L with rel_r > 0), 0 if none
    (a grade > 0 is relevant for MAP and MRR; NDCG uses the grades, LightGBM's default gains 2^rel - 1);
  - a query without a relevant row (every grade 0) has no ideal ranking: it is left out of the averages
    and counted in `queries_without_relevant` (LightGBM and XGBoost count it as NDCG 1 in their own logs).
Vectorised in NumPy over all queries at once; `query_metrics_reference` is the per-query loop the tests
compare it with.
"""

from __future__ import annotations

import math

import numpy as np


def _check(scores: np.ndarray, labels: np.ndarray, sizes: np.ndarray, k: int) -> None:
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError(f"query_metrics: scores {list(scores.shape)} and labels {list(labels.shape)} must be [N]")
    if sizes.ndim != 1 or int(sizes.sum()) != scores.shape[0] or (sizes.size and int(sizes.min()) < 1):
        raise ValueError(f"query_metrics: query sizes must be >= 1 and sum to the {scores.shape[0]} rows")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"query_metrics: k must be an integer >= 1, got {k!r}")
    if labels.size and (labels.min() < 0 or not np.all(labels == np.round(labels))):
        raise ValueError("query_metrics: labels must be relevance grades (integers >= 0)")


def query_metrics(scores: np.ndarray, labels: np.ndarray, sizes: np.ndarray, k: int) -> dict[str, float]:
    """NDCG@k, MAP@k, MRR@k averaged over the queries with a relevant row (the module docstring's protocol)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, np.float64)
    sizes = np.asarray(sizes, np.int64)
    _check(scores, labels, sizes, k)
    q, n = sizes.shape[0], scores.shape[0]
    query = np.repeat(np.arange(q), sizes)
    start = np.cumsum(sizes) - sizes
    row = np.arange(n)
    order = np.lexsort((row, -scores, query))  # by query, then score (high first), then row
    rel = labels[order]
    rank = row - start[query]  # query[order] == query: queries are contiguous
    top = rank < k
    discount = 1.0 / np.log2(rank + 2.0)
    dcg = np.bincount(query, np.where(top, (2.0**rel - 1.0) * discount, 0.0), minlength=q)
    ideal = labels[np.lexsort((-labels, query))]
    idcg = np.bincount(query, np.where(top, (2.0**ideal - 1.0) * discount, 0.0), minlength=q)
    relevant = rel > 0
    n_relevant = np.bincount(query, relevant, minlength=q)
    hits = np.cumsum(relevant)
    hits_before = np.r_[0, hits][start]  # relevant rows of the earlier queries
    seen = hits - hits_before[query]  # relevant rows at ranks <= r within the query
    ap = np.bincount(query, np.where(top & relevant, seen / (rank + 1.0), 0.0), minlength=q)
    first = top & relevant & (seen == 1)
    rr = np.bincount(query, np.where(first, 1.0 / (rank + 1.0), 0.0), minlength=q)
    kept = n_relevant > 0
    out = {
        f"ndcg@{k}": _mean(dcg[kept] / np.where(kept, idcg, 1.0)[kept]),
        f"map@{k}": _mean(ap[kept] / np.minimum(k, n_relevant[kept])),
        f"mrr@{k}": _mean(rr[kept]),
        "queries": float(kept.sum()),
        "queries_without_relevant": float(q - kept.sum()),
    }
    return out


def query_metrics_reference(scores: np.ndarray, labels: np.ndarray, sizes: np.ndarray, k: int) -> dict[str, float]:
    """The same metrics, one query at a time in plain Python (the spec `query_metrics` is tested against)."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, np.float64)
    _check(scores, labels, np.asarray(sizes, np.int64), k)
    ndcg, ap, rr, skipped, start = [], [], [], 0, 0
    for size in (int(s) for s in sizes):
        s, y = scores[start : start + size].tolist(), labels[start : start + size].tolist()
        start += size
        ranked = [y[i] for i in sorted(range(size), key=lambda i: (-s[i], i))][:k]
        if not any(v > 0 for v in y):
            skipped += 1
            continue
        ideal = sorted(y, reverse=True)[:k]
        dcg = sum((2.0**v - 1.0) / math.log2(r + 2) for r, v in enumerate(ranked))
        ndcg.append(dcg / sum((2.0**v - 1.0) / math.log2(r + 2) for r, v in enumerate(ideal)))
        hits, precision = 0, 0.0
        for r, v in enumerate(ranked):
            if v > 0:
                hits += 1
                precision += hits / (r + 1)
        ap.append(precision / min(k, sum(v > 0 for v in y)))
        rr.append(next((1.0 / (r + 1) for r, v in enumerate(ranked) if v > 0), 0.0))
    return {
        f"ndcg@{k}": _mean(np.asarray(ndcg)),
        f"map@{k}": _mean(np.asarray(ap)),
        f"mrr@{k}": _mean(np.asarray(rr)),
        "queries": float(len(ndcg)),
        "queries_without_relevant": float(skipped),
    }


def _mean(x: np.ndarray) -> float:
    """NaN when no query counts."""
    return float(x.mean()) if x.size else math.nan
