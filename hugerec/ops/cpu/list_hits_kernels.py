"""Numba CPU kernel of the ranking metrics' membership test (`hugerec.training.ranking_metrics.list_metrics`, whose
NumPy join-key `np.isin` is its reference and its tests' subject): which entries of each user's top list are among
that user's held-out items, by stamping each user's held-out items into one [I] array instead of sorting every
(user, item) key of the lists and of the held-out sets."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def list_hits(top: np.ndarray, offsets: np.ndarray, items: np.ndarray, num_items: int, hit: np.ndarray) -> None:
    """hit [U, L] (bool): top[u, r] >= 0 and top[u, r] is one of items[offsets[u]:offsets[u + 1]]. top [U, L] int64
    item positions (-1: an empty slot); offsets [U + 1], items [N] the held-out CSR; held-out items outside
    0..num_items-1 match nothing (a list holds positions below num_items)."""
    rows, width = top.shape
    stamp = np.full(num_items, -1, dtype=np.int64)  # stamp[i] == u: item i is held out for user u
    for u in range(rows):
        for p in range(offsets[u], offsets[u + 1]):
            item = items[p]
            if 0 <= item < num_items:
                stamp[item] = u
        for r in range(width):
            t = top[u, r]
            hit[u, r] = 0 <= t < num_items and stamp[t] == u
