"""Exact top-K over a catalogue in blocks: never a [queries x items] matrix, ties broken by position.

    scores, positions = top_k(score_block, num_queries=U, num_items=I, k=10, exclude=(offsets, items))

`score_block(q0, q1, i0, i1)` returns the [q1 - q0, i1 - i0] float32 scores of queries q0..q1-1 against
items i0..i1-1 (a matmul slice, a baseline's scores, the oracle's logits). Each block's scores become
int64 keys `order(score) << 32 | (2^32 - 1 - position)`, so one integer top-k orders by score and, among
equal scores, by the smaller position: the result is exact and deterministic, and merging the running
top-K with the next block's is again one top-k. Excluded (query, item) pairs score -inf and come out
as position -1; so do the slots past the catalogue's end when k > I.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

ScoreBlock = Callable[[int, int, int, int], torch.Tensor]

_LOW = 0xFFFFFFFF
_NEG_INF_KEY32 = -0x7F800001  # order key of float32 -inf: bits 0xFF800000 flipped


def _order32(scores: torch.Tensor) -> torch.Tensor:
    """float32 -> int32 with the same order (-0.0 counted as +0.0); its own inverse on the bits."""
    bits = (scores + 0.0).view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def encode(scores: torch.Tensor, first_position: int) -> torch.Tensor:
    """[b, n] float32 scores of items first_position.. -> [b, n] int64 keys (higher = better)."""
    if scores.dtype != torch.float32:
        raise ValueError(f"top_k: scores must be float32, got {scores.dtype}")
    if torch.isnan(scores).any():
        raise ValueError("top_k: scores contain NaN")
    pos = torch.arange(first_position, first_position + scores.shape[1], dtype=torch.int64)
    return (_order32(scores).to(torch.int64) << 32) | (_LOW - pos)


def decode(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 keys -> (float32 scores, int64 positions; -1 where the score is -inf)."""
    k32 = (keys >> 32).to(torch.int32)
    scores = (k32 ^ ((k32 >> 31) & 0x7FFFFFFF)).view(torch.float32)
    pos = _LOW - (keys & _LOW)
    return scores, torch.where(k32 == _NEG_INF_KEY32, torch.full_like(pos, -1), pos)


def top_k(
    score_block: ScoreBlock,
    num_queries: int,
    num_items: int,
    k: int,
    exclude: tuple[np.ndarray, np.ndarray] | None = None,
    query_block: int = 1024,
    item_block: int = 65536,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best items per query: (scores [Q, min(k, I)] float32, positions [Q, min(k, I)] int64).

    exclude: CSR over queries (offsets [Q + 1], item positions [N]); those pairs are never returned.
    Rows are sorted best first; -1 positions (score -inf) fill rows with fewer than k candidates.
    """
    if k < 1:
        raise ValueError(f"top_k: k must be >= 1, got {k}")
    if num_items >= 1 << 32:
        raise ValueError(f"top_k: at most 2^32 - 1 items, got {num_items}")
    kk = min(k, num_items)
    out_scores = torch.empty(num_queries, kk, dtype=torch.float32)
    out_pos = torch.empty(num_queries, kk, dtype=torch.int64)
    for q0 in range(0, num_queries, query_block):
        q1 = min(q0 + query_block, num_queries)
        rows, cols = _excluded(exclude, q0, q1)
        best: torch.Tensor | None = None  # [b, <= kk] running keys
        for i0 in range(0, num_items, item_block):
            i1 = min(i0 + item_block, num_items)
            scores = score_block(q0, q1, i0, i1).to(torch.float32)  # [b, i1 - i0]
            if scores.shape != (q1 - q0, i1 - i0):
                raise ValueError(f"top_k: score_block returned shape {tuple(scores.shape)}, expected {(q1 - q0, i1 - i0)}")
            inside = (cols >= i0) & (cols < i1)
            if inside.any():
                scores = scores.clone()
                scores[rows[inside], cols[inside] - i0] = float("-inf")
            keys = _block_top_keys(scores, i0, min(kk, scores.shape[1]))  # [b, <= kk] this block's best keys
            if best is not None:
                keys = torch.topk(torch.cat([best, keys], dim=1), min(kk, best.shape[1] + keys.shape[1]), dim=1).values
            best = keys
        assert best is not None
        out_scores[q0:q1], out_pos[q0:q1] = decode(best)
    return out_scores, out_pos


def _block_top_keys(scores: torch.Tensor, first_position: int, m: int) -> torch.Tensor:
    """[b, n] float32 scores of items first_position.. -> [b, m] their m best keys, best first: the keys of
    `encode`, selected per row by the Numba kernel (ops/cpu/topk_kernels.py; `torch.topk(encode(...), m)` is its
    reference) in one pass, without the [b, n] int64 keys."""
    if scores.device.type != "cpu":
        return torch.topk(encode(scores, first_position), m, dim=1).values
    if scores.dtype != torch.float32:
        raise ValueError(f"top_k: scores must be float32, got {scores.dtype}")
    from hugerec.ops.cpu.topk_kernels import top_keys  # Numba: imported when first scored

    out = np.empty((scores.shape[0], m), dtype=np.int64)
    if top_keys(scores.detach().contiguous().numpy().view(np.int32), first_position, out):  # the count of NaN scores
        raise ValueError("top_k: scores contain NaN")
    return torch.from_numpy(out)


def _excluded(exclude: tuple[np.ndarray, np.ndarray] | None, q0: int, q1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The excluded pairs of queries q0..q1-1 as (row in the block, item position), [n] each."""
    if exclude is None:
        empty = torch.empty(0, dtype=torch.int64)
        return empty, empty
    offsets, items = exclude
    lo, hi = int(offsets[q0]), int(offsets[q1])
    rows = np.repeat(np.arange(q1 - q0), np.diff(offsets[q0 : q1 + 1]))
    return torch.from_numpy(rows.astype(np.int64)), torch.from_numpy(np.array(items[lo:hi], dtype=np.int64))


def matmul_block(queries: torch.Tensor, vectors: torch.Tensor) -> ScoreBlock:
    """The inner-product scorer: queries [Q, D] against item vectors [I, D]."""

    def score(q0: int, q1: int, i0: int, i1: int) -> torch.Tensor:
        return queries[q0:q1] @ vectors[i0:i1].T  # [b, D] @ [D, n] -> [b, n]

    return score
