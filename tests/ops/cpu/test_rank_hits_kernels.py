"""The rank-counting kernel of the exact Recall@K == its reference, the held-out items found in `top_k`'s lists
(`list_hits` of `torch.topk` over `encode`d keys): ties (equal scores: the smaller position first), -0.0 and +0.0,
infinite scores, excluded pairs (held-out ones too), duplicated and out-of-catalogue held-out items, k above the
catalogue, empty rows, one row; and NaN scores counted unless excluded. A held-out item among the excluded stays
rankable (the reference masks the exclusion minus the row's held-out items)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.index.topk import decode, encode
from hugerec.ops.cpu.list_hits_kernels import list_hits
from hugerec.ops.cpu.rank_hits_kernels import rank_hits


def _csr(rng: np.random.Generator, rows: int, most: int, low: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(0, most + 1, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return offsets, rng.integers(low, high, int(offsets[-1])).astype(np.int64)


def _reference(scores: np.ndarray, held: tuple[np.ndarray, np.ndarray], exclude: tuple[np.ndarray, np.ndarray], k: int) -> np.ndarray:
    rows, n = scores.shape
    masked = torch.from_numpy(scores.copy())
    for r in range(rows):
        mine = set(held[1][held[0][r] : held[0][r + 1]].tolist())
        for x in exclude[1][exclude[0][r] : exclude[0][r + 1]]:
            if 0 <= x < n and x not in mine:  # a held-out item stays rankable
                masked[r, x] = float("-inf")
    keys = torch.topk(encode(masked, 0), min(k, n), dim=1).values
    _, top = decode(keys)
    hit = np.empty(top.shape, dtype=np.bool_)
    list_hits(top.numpy(), held[0], held[1], n, hit)
    return hit.sum(axis=1)


def _kernel(scores: np.ndarray, held: tuple[np.ndarray, np.ndarray], exclude: tuple[np.ndarray, np.ndarray], k: int) -> tuple[np.ndarray, int]:
    hits = np.full(scores.shape[0], -7, dtype=np.int64)
    nans = rank_hits(np.ascontiguousarray(scores).view(np.int32), held[0], held[1], exclude[0], exclude[1], k, hits)
    return hits, nans


_VALUES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, 2.0], dtype=np.float32)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 45), st.booleans(), st.integers(0, 2**31 - 1))
def test_rank_hits_equal_the_top_k_lists(rows: int, n: int, k: int, ties: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.choice(_VALUES, (rows, n)) if ties else rng.standard_normal((rows, n)).astype(np.float32)
    held = _csr(rng, rows, 6, -2, n + 2)  # duplicates and items outside the catalogue
    exclude = _csr(rng, rows, 8, -1, n + 1)  # held-out items among them too (they stay rankable)
    hits, nans = _kernel(scores, held, exclude, k)
    assert nans == 0
    assert np.array_equal(hits, _reference(scores, held, exclude, k))


def test_rank_hits_of_a_gate_sized_evaluation() -> None:
    rng = np.random.default_rng(0)
    rows, n, k = 1500, 1500, 50
    scores = rng.standard_normal((rows, n)).astype(np.float32)
    scores[:, ::7] = scores[:, :1]  # many ties inside each row
    held = _csr(rng, rows, 15, 0, n)
    exclude = _csr(rng, rows, 60, 0, n)
    hits, nans = _kernel(scores, held, exclude, k)
    expected = _reference(scores, held, exclude, k)
    assert nans == 0 and expected.sum() > 0 and np.array_equal(hits, expected)


def test_rank_hits_count_nan_scores_unless_excluded() -> None:
    scores = np.zeros((2, 5), dtype=np.float32)
    scores[0, 1] = np.nan
    scores[1, 3] = np.nan
    empty = (np.zeros(3, np.int64), np.zeros(0, np.int64))
    assert _kernel(scores, empty, empty, 2)[1] == 2
    exclude = (np.array([0, 2, 2], np.int64), np.array([1, 1], np.int64))  # row 0's NaN masked to -inf (listed twice)
    assert _kernel(scores, empty, exclude, 2)[1] == 1


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(30, 120), st.integers(1, 60), st.booleans(), st.integers(0, 2**31 - 1))
def test_rank_hits_of_rows_with_many_held_out_items(rows: int, n: int, k: int, ties: bool, seed: int) -> None:
    # more than the kernel's few held-out items per row: its sorted-row path
    rng = np.random.default_rng(seed)
    scores = rng.choice(_VALUES, (rows, n)) if ties else rng.standard_normal((rows, n)).astype(np.float32)
    held = _csr(rng, rows, 80, -2, n + 2)
    exclude = _csr(rng, rows, 20, -1, n + 1)
    hits, nans = _kernel(scores, held, exclude, k)
    assert nans == 0
    assert np.array_equal(hits, _reference(scores, held, exclude, k))
