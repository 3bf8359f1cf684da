"""Numba CPU kernel of the session-kNN baselines (SKNN, V-SKNN of `hugerec.training.next_item_baselines`,
which is its spec and its tests' subject): one query per thread, each query's neighbours found through the
item -> sequences index, so only the sequences sharing an item with it are touched."""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def session_knn_scores(
    hist: np.ndarray, own: np.ndarray, seq_offsets: np.ndarray, seq_items: np.ndarray, item_offsets: np.ndarray,
    item_seqs: np.ndarray, rank: np.ndarray, k: int, sample: int, position_decay: bool, out: np.ndarray,
) -> None:
    """out [Q, I] += each query's k nearest training sequences' votes.

    hist [Q, W] the queries' last items (0: padding, oldest first); own [Q] a training sequence each query
    leaves out (-1: none); seq_offsets / seq_items: the training sequences as CSR (items 1..I);
    item_offsets / item_seqs: for each item the sequences holding it; rank [S]: 0 for the most recent
    sequence. A query's items weigh 1 (position_decay: p / n for the p-th of its n items); of the
    training sequences sharing an item, the `sample` most recent are candidates, each scored by the
    summed weights of the shared items over sqrt(distinct query items * sequence length); the k best
    vote for their items with that similarity."""
    num_queries, width = hist.shape
    num_seqs = len(rank)
    num_items = out.shape[1]
    for q in prange(num_queries):
        weight = np.zeros(num_items + 1)
        distinct = np.empty(width, dtype=np.int64)
        n_distinct = 0
        n_read = 0
        for c in range(width):
            if hist[q, c] != 0:
                n_read += 1
        p = 0
        for c in range(width):  # oldest to newest: a repeat's later position overwrites its weight
            item = hist[q, c]
            if item == 0:
                continue
            p += 1
            if weight[item] == 0.0:
                distinct[n_distinct] = item
                n_distinct += 1
            weight[item] = p / n_read if position_decay else 1.0
        if n_distinct == 0:
            continue
        acc = np.zeros(num_seqs)
        touched = np.empty(num_seqs, dtype=np.int64)
        n_touched = 0
        for d in range(n_distinct):
            item = distinct[d]
            for e in range(item_offsets[item], item_offsets[item + 1]):
                s = item_seqs[e]
                if s == own[q]:
                    continue
                if acc[s] == 0.0:
                    touched[n_touched] = s
                    n_touched += 1
                acc[s] += weight[item]
        cand = touched[:n_touched]
        if n_touched > sample:  # the `sample` most recent sequences holding a query item
            cand = cand[np.argsort(rank[cand], kind="mergesort")[:sample]]
        else:
            cand = cand[np.argsort(rank[cand], kind="mergesort")]
        sim = np.empty(len(cand))
        for c in range(len(cand)):
            s = cand[c]
            sim[c] = acc[s] / np.sqrt(n_distinct * (seq_offsets[s + 1] - seq_offsets[s]))
        order = np.argsort(-sim, kind="mergesort")[:k]  # ties: the more recent sequence first
        for o in order:
            s = cand[o]
            for e in range(seq_offsets[s], seq_offsets[s + 1]):
                out[q, seq_items[e] - 1] += sim[o]
