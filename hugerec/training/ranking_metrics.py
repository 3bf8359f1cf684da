"""Top-K ranking metrics over the full catalogue: Recall, NDCG, MRR, HitRate and catalogue coverage.

    metrics = full_ranking_metrics(score_block, held_out=(offsets, items), exclude=(offsets, items),
                               num_items=I, ks=(10, 50))
    metrics["recall@10"], metrics["ndcg@10"], metrics["coverage@50"], ...

Protocol (the same for every model and baseline, so numbers compare):
  - every item of the catalogue is ranked for every evaluated user (no sampled negatives);
  - the user's training items (`exclude`) are removed from the ranking, except the user's own
    held-out items (a re-consumed item stays rankable);
  - users with no held-out item are skipped (their count is reported as `users_skipped`);
  - ties are broken by the smaller item position (deterministic, see `hugerec.index.topk`);
  - with H the held-out set and L_K the top-K list (shorter when fewer than K items remain):
      recall@K   = |L_K & H| / min(K, |H|)                 (normalised recall, = hit rate when |H| = 1)
      ndcg@K     = sum_{r: L_K[r] in H} 1/log2(r+2)  /  sum_{r < min(K,|H|)} 1/log2(r+2)
      mrr@K      = 1 / (1 + first r with L_K[r] in H), 0 if none
      hitrate@K  = 1 if L_K & H else 0
      coverage@K = |union of L_K over users| / I
    averaged over the evaluated users.
The top-K lists come from the blocked exact top-K (no [users x items] matrix).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import torch

from hugerec.index.topk import ScoreBlock, top_k

CSR = tuple[np.ndarray, np.ndarray]


def list_metrics(top: torch.Tensor, held_out: CSR, num_items: int, ks: Sequence[int]) -> dict[str, float]:
    """Metrics of given top lists: top [U, L] item positions (-1 = empty slot), held_out CSR over the same U rows."""
    ks = _check_ks(ks)
    n_held = np.diff(held_out[0])
    keep = n_held > 0
    out: dict[str, float] = {"users": float(keep.sum()), "users_skipped": float((~keep).sum())}
    if top.shape[0] != len(n_held):
        raise ValueError(f"list_metrics: {top.shape[0]} top lists but held_out has {len(n_held)} users")
    top_np = top.numpy()
    hit = _hits(top_np, held_out, num_items)[keep]  # [U', L]
    n_h = n_held[keep].astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, top.shape[1] + 2))
    for k in ks:
        h = hit[:, :k]
        n_hits = h.sum(axis=1)
        ideal = np.cumsum(1.0 / np.log2(np.arange(2, k + 2)))[np.minimum(n_h, k).astype(np.int64) - 1] if len(n_h) else n_h
        first = np.where(h.any(axis=1), h.argmax(axis=1), -1)
        out[f"recall@{k}"] = _recall(h, n_h, k)
        out[f"ndcg@{k}"] = _mean((h * discount[: h.shape[1]]).sum(axis=1) / ideal)
        out[f"mrr@{k}"] = _mean(np.where(first >= 0, 1.0 / (np.maximum(first, 0) + 1), 0.0))
        out[f"hitrate@{k}"] = _mean((n_hits > 0).astype(np.float64))
        listed = top_np[keep][:, :k]
        out[f"coverage@{k}"] = len(np.unique(listed[listed >= 0])) / num_items if num_items else 0.0
    return out


def list_recall(top: torch.Tensor, held_out: CSR, num_items: int, k: int) -> float:
    """`list_metrics(top, held_out, num_items, (k,))["recall@<k>"]` alone (the same arithmetic, the same value), for
    a caller that reads nothing else (the retrieval loop's gate)."""
    (k,) = _check_ks((k,))
    n_held = np.diff(held_out[0])
    if top.shape[0] != len(n_held):
        raise ValueError(f"list_recall: {top.shape[0]} top lists but held_out has {len(n_held)} users")
    keep = n_held > 0
    return _recall(_hits(top.numpy(), held_out, num_items)[keep][:, :k], n_held[keep].astype(np.float64), k)


def recall_at_k(
    score_block: ScoreBlock,
    held_out: CSR,
    exclude: CSR | None,
    num_items: int,
    k: int,
    user_block: int = 1024,
    item_block: int = 65536,
) -> float:
    """`full_ranking_metrics(score_block, held_out, exclude, num_items, (k,), user_block, item_block)["recall@<k>"]`
    (a user's excluded items are not ranked, except the user's own held-out items), the same value to the bit,
    without the top-K lists: a held-out item is in a user's top K exactly when fewer than K items have a larger top_k
    key (score, then the smaller position), which one pass over the user's scores counts (the Numba kernel
    ops/cpu/rank_hits_kernels.py), so neither the lists nor the exclusion minus the held-out items are built. The
    scores come from the same `score_block` calls as top_k's, so they are the same floats. A catalogue of more than
    `item_block` items (a user's scores in several blocks) goes through full_ranking_metrics."""
    (k,) = _check_ks((k,))
    offsets = held_out[0]
    num_users = len(offsets) - 1
    if exclude is not None and len(exclude[0]) != len(offsets):
        raise ValueError(f"recall_at_k: exclude has {len(exclude[0]) - 1} users, held_out {num_users}")
    if num_items > item_block or num_items < 1:
        return full_ranking_metrics(score_block, held_out, exclude, num_items, (k,), user_block, item_block)[f"recall@{k}"]
    if num_items >= 1 << 32:
        raise ValueError(f"recall_at_k: at most 2^32 - 1 items, got {num_items}")
    from hugerec.ops.cpu.rank_hits_kernels import rank_hits  # Numba: imported when first measured

    held_offsets, held_items = (np.ascontiguousarray(a, dtype=np.int64) for a in held_out)
    if exclude is None:
        ex_offsets, ex_items = np.zeros(num_users + 1, np.int64), np.zeros(0, np.int64)
    else:
        ex_offsets, ex_items = (np.ascontiguousarray(a, dtype=np.int64) for a in exclude)
    hits = np.zeros(num_users, dtype=np.int64)  # [U] distinct held-out items in each user's top k
    for u0 in range(0, num_users, user_block):
        u1 = min(u0 + user_block, num_users)
        scores = score_block(u0, u1, 0, num_items).to(torch.float32)  # [b, I]: top_k's one item block
        if scores.shape != (u1 - u0, num_items):
            raise ValueError(f"recall_at_k: score_block returned shape {tuple(scores.shape)}, expected {(u1 - u0, num_items)}")
        nans = rank_hits(
            scores.detach().contiguous().numpy().view(np.int32),
            held_offsets[u0 : u1 + 1] - held_offsets[u0],
            held_items[held_offsets[u0] : held_offsets[u1]],
            ex_offsets[u0 : u1 + 1] - ex_offsets[u0],
            ex_items[ex_offsets[u0] : ex_offsets[u1]],
            k,
            hits[u0:u1],
        )
        if nans:
            raise ValueError("top_k: scores contain NaN")
    n_held = np.diff(offsets)
    keep = n_held > 0
    return _mean(hits[keep] / np.minimum(n_held[keep].astype(np.float64), k))


def _hits(top: np.ndarray, held_out: CSR, num_items: int) -> np.ndarray:
    """hit [U, L] bool: is the r-th entry of user u's list one of u's held-out items (empty slots -1 never are), by
    the Numba kernel ops/cpu/list_hits_kernels.py (its tests hold it to the NumPy join-key `np.isin`)."""
    from hugerec.ops.cpu.list_hits_kernels import list_hits  # Numba: imported when first measured

    offsets, items = held_out
    hit = np.empty(top.shape, dtype=np.bool_)
    list_hits(
        np.ascontiguousarray(top, dtype=np.int64),
        np.ascontiguousarray(offsets, dtype=np.int64),
        np.ascontiguousarray(items, dtype=np.int64),
        num_items,
        hit,
    )
    return hit


def _recall(hit: np.ndarray, n_held: np.ndarray, k: int) -> float:
    """Mean over users of |hits in the top k| / min(k, |held out|): hit [U', <= k], n_held [U'] float64 (> 0)."""
    return _mean(hit.sum(axis=1) / np.minimum(n_held, k))


def full_ranking_metrics(
    score_block: ScoreBlock,
    held_out: CSR,
    exclude: CSR | None,
    num_items: int,
    ks: Sequence[int] = (10, 50),
    user_block: int = 1024,
    item_block: int = 65536,
) -> dict[str, float]:
    """Exact full-ranking metrics: `score_block(u0, u1, i0, i1)` scores users u0..u1-1 (rows of the CSRs)."""
    ks = _check_ks(ks)
    offsets, _ = held_out
    if exclude is not None:
        if len(exclude[0]) != len(offsets):
            raise ValueError(f"full_ranking_metrics: exclude has {len(exclude[0]) - 1} users, held_out {len(offsets) - 1}")
        exclude = csr_minus(exclude, held_out)
    _, top = top_k(score_block, len(offsets) - 1, num_items, max(ks), exclude, user_block, item_block)
    return list_metrics(top, held_out, num_items, ks)


def subset_csr(csr: CSR, rows: np.ndarray) -> CSR:
    """The CSR restricted to `rows` (in that order)."""
    offsets, items = csr
    lengths = np.diff(offsets)[rows]
    starts = offsets[rows]
    new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    pos = np.repeat(starts - new_offsets[:-1], lengths) + np.arange(int(new_offsets[-1]))
    return new_offsets, items[pos]


def csr_minus(a: CSR, b: CSR) -> CSR:
    """Per row, the items of a that are not in b (vectorised anti-join)."""
    def frame(csr: CSR) -> pl.DataFrame:
        return pl.DataFrame({"row": np.repeat(np.arange(len(csr[0]) - 1), np.diff(csr[0])), "item": csr[1]})

    left = frame(a).with_row_index("_order").join(frame(b), on=["row", "item"], how="anti").sort("_order")
    counts = np.bincount(left["row"].to_numpy(), minlength=len(a[0]) - 1)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), left["item"].to_numpy()


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if len(x) else 0.0


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ranking metrics: ks must be a non-empty list of integers >= 1, got {list(ks)}")
    return ks
