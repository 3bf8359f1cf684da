"""Next-item metrics over the full catalogue: Recall@K, MRR@K, NDCG@K from the rank of each query's one target.

    ranks = target_ranks(score_block, targets, num_items=I, exclude=(offsets, items))
    metrics = rank_metrics(ranks, ks=(10, 20))     # {"recall@10": ..., "mrr@10": ..., "ndcg@10": ...}

Each query (a user's history, or a session prefix) has exactly one held-out next item t. Its rank is the
number of catalogue items scored above it, ties broken by the smaller item id (the same order as the
retrieval metrics' blocked top-K): rank = #{j : s_j > s_t} + #{j < t : s_j = s_t}, over items 1..I
except the query's excluded ones (the target itself is never excluded). No top-K list and no sampled
negatives are needed; memory is one [block, I] score block. With r the 0-based rank:

    recall@K = 1[r < K]   (= HitRate@K with one target)
    mrr@K    = 1 / (r + 1) if r < K else 0
    ndcg@K   = 1 / log2(r + 2) if r < K else 0

averaged over the queries. Protocols (benchmarks/sequential.py):
  - leave-last-out (MovieLens): one query per user, the history without its last item predicts it;
    the user's history items are excluded from the ranking;
  - every prefix (YOOCHOOSE/Diginetica, as GRU4Rec's evaluation): each prefix s_1..s_k of a test session
    predicts s_{k+1}, for k = 1..n-1; test items unseen in training are removed from the sessions first;
    nothing is excluded (repeated items are rankable).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

CSR = tuple[np.ndarray, np.ndarray]
ScoreBlock = Callable[[int, int], torch.Tensor]  # (q0, q1) -> [q1 - q0, I] scores of items 1..I


def target_ranks(
    score_block: ScoreBlock, targets: np.ndarray, num_items: int, exclude: CSR | None = None, block: int = 1024
) -> np.ndarray:
    """[Q] 0-based rank of each target (dense ids 1..I) among items 1..I under score_block's scores."""
    targets = np.asarray(targets, dtype=np.int64)
    if len(targets) and (int(targets.min()) < 1 or int(targets.max()) > num_items):
        raise ValueError(f"target_ranks: targets must be item ids in 1..{num_items}, got range {int(targets.min())}..{int(targets.max())}")
    if exclude is not None and len(exclude[0]) != len(targets) + 1:
        raise ValueError(f"target_ranks: exclude has {len(exclude[0]) - 1} rows for {len(targets)} queries")
    ranks = np.empty(len(targets), dtype=np.int64)
    cols = torch.arange(1, num_items + 1)
    for q0 in range(0, len(targets), block):
        q1 = min(q0 + block, len(targets))
        scores = score_block(q0, q1).to(torch.float32).clone()  # [q, I]
        if scores.shape != (q1 - q0, num_items):
            raise ValueError(f"target_ranks: score_block({q0}, {q1}) gave shape {tuple(scores.shape)}, expected {(q1 - q0, num_items)}")
        t = torch.from_numpy(targets[q0:q1])
        if exclude is not None:
            offsets, items = exclude
            lens = np.diff(offsets[q0 : q1 + 1])
            rows = np.repeat(np.arange(q1 - q0), lens)
            excl = items[offsets[q0] : offsets[q1]]
            drop = excl != targets[q0:q1][rows]
            scores[torch.from_numpy(rows[drop]), torch.from_numpy(excl[drop] - 1)] = float("nan")  # NaN never counts
        st = scores.gather(1, (t - 1)[:, None])  # [q, 1]
        above = (scores > st) | ((scores == st) & (cols[None, :] < t[:, None]))
        ranks[q0:q1] = above.sum(dim=1).numpy()
    return ranks


def rank_metrics(ranks: np.ndarray, ks: Sequence[int] = (10, 20)) -> dict[str, float]:
    """Recall@K, MRR@K and NDCG@K (means over the queries) from 0-based target ranks."""
    ks = tuple(ks)
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"rank_metrics: ks must be integers >= 1, got {list(ks)}")
    r = np.asarray(ranks, dtype=np.float64)
    out: dict[str, float] = {"queries": float(len(r))}
    for k in ks:
        hit = r < k
        out[f"recall@{k}"] = float(hit.mean()) if len(r) else 0.0
        out[f"mrr@{k}"] = float(np.where(hit, 1.0 / (r + 1), 0.0).mean()) if len(r) else 0.0
        out[f"ndcg@{k}"] = float(np.where(hit, 1.0 / np.log2(r + 2), 0.0).mean()) if len(r) else 0.0
    return out
