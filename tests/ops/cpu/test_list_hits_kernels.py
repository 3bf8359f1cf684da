"""The membership kernel of the ranking metrics == its NumPy reference (the (user, item) join key through `np.isin`
that list_metrics used): empty slots, empty held-out sets, duplicate items, a list longer than the catalogue, one
user, held-out items outside the catalogue."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.ops.cpu.list_hits_kernels import list_hits


def _reference(top: np.ndarray, offsets: np.ndarray, items: np.ndarray, num_items: int) -> np.ndarray:
    n_held = np.diff(offsets)
    inside = (items >= 0) & (items < num_items)
    rows = np.repeat(np.arange(len(n_held)), n_held)[inside]
    held_keys = rows.astype(np.int64) * (num_items + 1) + items[inside]
    rec_keys = np.arange(len(n_held), dtype=np.int64)[:, None] * (num_items + 1) + top  # [U, L]
    return np.isin(rec_keys, held_keys) & (top >= 0)


def _kernel(top: np.ndarray, offsets: np.ndarray, items: np.ndarray, num_items: int) -> np.ndarray:
    hit = np.empty(top.shape, dtype=np.bool_)
    list_hits(top, offsets, items, num_items, hit)
    return hit


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 30), st.integers(0, 12), st.integers(0, 2**31 - 1))
def test_list_hits_equal_the_numpy_reference(users: int, num_items: int, width: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    top = rng.integers(-1, num_items, (users, width)).astype(np.int64)  # -1: empty slots, repeats allowed
    n_held = rng.integers(0, 6, users)
    offsets = np.concatenate([[0], np.cumsum(n_held)]).astype(np.int64)
    items = rng.integers(-2, num_items + 3, int(offsets[-1])).astype(np.int64)  # duplicates and outsiders
    assert np.array_equal(_kernel(top, offsets, items, num_items), _reference(top, offsets, items, num_items))


def test_list_hits_of_a_large_evaluation() -> None:
    rng = np.random.default_rng(0)
    users, num_items = 3000, 1500
    top = np.stack([rng.permutation(num_items)[:50] for _ in range(users)]).astype(np.int64)
    n_held = rng.integers(0, 16, users)
    offsets = np.concatenate([[0], np.cumsum(n_held)]).astype(np.int64)
    items = rng.integers(0, num_items, int(offsets[-1])).astype(np.int64)
    expected = _reference(top, offsets, items, num_items)
    assert expected.any() and np.array_equal(_kernel(top, offsets, items, num_items), expected)
