"""Numba CPU kernel of an exact Recall@K without top-K lists (`hugerec.training.ranking_metrics.recall_at_k`, whose
reference is `list_recall` of `hugerec.index.topk.top_k`'s lists, its tests' subject): a user's held-out item is in
the top K exactly when fewer than K items of the row have a larger key `order(score) << 32 | (2^32 - 1 - position)`
(the keys top_k ranks by, so ties go to the smaller position). Each row's keys are computed once and, per held-out
item, the keys above it counted in a branch-free pass (a sort and binary searches when a row has many held-out
items), instead of keeping the K best in a heap, whose swaps depend on the data.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_LOW = 0xFFFFFFFF
_NEG_INF_ORDER = -0x7F800001  # order32 of float32 -inf (its bits 0xFF800000 flipped), the score of an excluded pair
_FEW = 32  # up to this many held-out items a row counts the keys above each directly, beyond it sorts the row


@njit(parallel=True, cache=True)
def rank_hits(
    bits: np.ndarray,
    held_offsets: np.ndarray,
    held_items: np.ndarray,
    exclude_offsets: np.ndarray,
    exclude_items: np.ndarray,
    k: int,
    hits: np.ndarray,
) -> int:
    """hits [b]: per row, how many distinct held-out items rank among the row's k best keys. bits [b, n]: the float32
    scores of items 0..n-1 as int32 bit patterns; held_offsets / exclude_offsets [b + 1] with held_items /
    exclude_items: CSRs over the rows (positions; those outside 0..n-1 match nothing). An excluded pair scores -inf
    (as top_k masks it) unless the item is one of the row's held-out items (which stay rankable, the protocol of
    `full_ranking_metrics`), and a held-out item scoring -inf is no hit (top_k lists such a slot as position -1).
    Returns the number of NaN scores among the pairs not excluded (the caller refuses them; `hits` is then
    meaningless)."""
    nans = 0
    for r in prange(bits.shape[0]):
        found, bad = _row(
            bits[r],
            held_items[held_offsets[r] : held_offsets[r + 1]],
            exclude_items[exclude_offsets[r] : exclude_offsets[r + 1]],
            k,
        )
        hits[r] = found
        nans += bad
    return nans


@njit(cache=True)
def _row(bits: np.ndarray, held_items: np.ndarray, exclude_items: np.ndarray, k: int) -> tuple[int, int]:
    """(distinct held-out items among the k best keys, NaN scores not excluded) of one row, as `rank_hits`."""
    n = bits.shape[0]
    keys = np.empty(n, dtype=np.int64)  # [n] the row's top_k keys
    bad = np.int64(0)
    for j in range(n):
        b = np.int64(bits[j])
        bad += (b & 0x7FFFFFFF) > 0x7F800000  # NaN
        b = np.int64(0) if b == -2147483648 else b  # -0.0 counts as +0.0
        keys[j] = ((b ^ ((b >> 31) & 0x7FFFFFFF)) << 32) | (_LOW - j)
    held = np.empty(held_items.size, dtype=np.int64)  # the row's held-out positions inside the catalogue
    m = 0
    for item in held_items:
        if 0 <= item < n:
            held[m] = item
            m += 1
    held = np.unique(held[:m])  # sorted; a duplicated held-out item counted once
    for x in exclude_items:
        if 0 <= x < n:
            i = np.searchsorted(held, x)
            if i < held.size and held[i] == x:
                continue  # a held-out item stays rankable
            order = keys[x] >> 32
            bad -= (order > 0x7F800000) | (order < _NEG_INF_ORDER)  # a NaN masked (once: then it is -inf's)
            keys[x] = (np.int64(_NEG_INF_ORDER) << 32) | (_LOW - x)
    m = 0
    for item in held:
        if keys[item] >> 32 > _NEG_INF_ORDER:  # scoring -inf: listed as -1 at best
            held[m] = keys[item]
            m += 1
    held = held[:m]  # their keys
    found = 0
    if held.size <= _FEW:
        for i in range(held.size):
            key = held[i]
            above = 0
            for j in range(n):
                above += keys[j] > key
            found += above < k
    else:  # many held-out items: the row's keys sorted once, each item's rank by a binary search
        ordered = np.sort(keys)
        for i in range(held.size):
            found += n - np.searchsorted(ordered, held[i], side="right") < k
    return found, int(bad)
