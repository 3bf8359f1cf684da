"""Ranking metrics: blocked exact top-K metrics == a slow per-user reference (ties, K > items, empty users)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.index.topk import matmul_block, top_k
from hugerec.training.ranking_metrics import (
    csr_minus,
    full_ranking_metrics,
    list_metrics,
    list_recall,
    recall_at_k,
    subset_csr,
)


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    items = np.array([i for x in lists for i in x], dtype=np.int64)
    return offsets, items


def _reference(scores: np.ndarray, held: list[list[int]], train: list[list[int]], ks: list[int]) -> dict[str, float]:
    """Sort each user's rankable items by (-score, item) in plain Python and count."""
    num_users, num_items = scores.shape
    sums: dict[str, float] = {}
    seen: dict[int, set[int]] = {k: set() for k in ks}
    users = 0
    for u in range(num_users):
        h = set(held[u])
        if not h:
            continue
        users += 1
        banned = set(train[u]) - h
        ranked = sorted((i for i in range(num_items) if i not in banned), key=lambda i: (-scores[u, i], i))
        for k in ks:
            top = ranked[:k]
            seen[k].update(top)
            hits = [r for r, i in enumerate(top) if i in h]
            ideal = sum(1 / math.log2(r + 2) for r in range(min(k, len(h))))
            for name, v in (
                ("recall", len(hits) / min(k, len(h))),
                ("ndcg", sum(1 / math.log2(r + 2) for r in hits) / ideal),
                ("mrr", 1 / (hits[0] + 1) if hits else 0.0),
                ("hitrate", 1.0 if hits else 0.0),
            ):
                sums[f"{name}@{k}"] = sums.get(f"{name}@{k}", 0.0) + v
    out = {key: v / users for key, v in sums.items()} if users else {}
    for k in ks:
        out[f"coverage@{k}"] = len(seen[k]) / num_items
    return out


@st.composite
def _cases(draw: st.DrawFn) -> tuple[np.ndarray, list[list[int]], list[list[int]], list[int], int]:
    num_users = draw(st.integers(1, 6))
    num_items = draw(st.integers(1, 12))
    # few distinct values -> many ties
    scores = np.array(
        draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=num_users * num_items, max_size=num_users * num_items)),
        dtype=np.float32,
    ).reshape(num_users, num_items)
    items = st.lists(st.integers(0, num_items - 1), max_size=num_items, unique=True)
    held = [draw(items) for _ in range(num_users)]
    train = [draw(items) for _ in range(num_users)]
    ks = draw(st.lists(st.integers(1, num_items + 3), min_size=1, max_size=3, unique=True))
    block = draw(st.integers(1, 5))
    return scores, held, train, ks, block


@settings(max_examples=150, deadline=None)
@given(_cases())
def test_matches_reference(case: tuple[np.ndarray, list[list[int]], list[list[int]], list[int], int]) -> None:
    scores, held, train, ks, block = case
    t = torch.from_numpy(scores)
    got = full_ranking_metrics(
        lambda u0, u1, i0, i1: t[u0:u1, i0:i1], _csr(held), _csr(train), scores.shape[1], ks, user_block=block, item_block=block
    )
    want = _reference(scores, held, train, ks)
    for key, v in want.items():
        assert got[key] == pytest.approx(v, abs=1e-9), key
    assert got["users_skipped"] == sum(1 for h in held if not h)


def test_hand_computed() -> None:
    # user 0: items ranked 2, 0, 1 (3 excluded); held {0} -> rank 1
    scores = torch.tensor([[0.5, 0.1, 0.9, 5.0], [0.0, 0.0, 0.0, 0.0]])
    got = full_ranking_metrics(lambda u0, u1, i0, i1: scores[u0:u1, i0:i1], _csr([[0], []]), _csr([[3], [1]]), 4, [1, 2])
    assert got["recall@1"] == 0.0 and got["recall@2"] == 1.0
    assert got["ndcg@2"] == pytest.approx(1 / math.log2(3))
    assert got["mrr@2"] == 0.5
    assert got["coverage@2"] == 0.5  # only user 0 is evaluated: items {2, 0}
    assert got["users"] == 1 and got["users_skipped"] == 1


def test_held_out_item_seen_in_training_stays_rankable() -> None:
    scores = torch.tensor([[1.0, 0.0]])
    got = full_ranking_metrics(lambda u0, u1, i0, i1: scores[u0:u1, i0:i1], _csr([[0]]), _csr([[0, 1]]), 2, [1])
    assert got["recall@1"] == 1.0


def test_matmul_blocks_agree_with_one_block() -> None:
    g = torch.Generator().manual_seed(0)
    q, v = torch.randn(37, 8, generator=g), torch.randn(101, 8, generator=g)
    held = _csr([[int(i)] for i in torch.randint(0, 101, (37,), generator=g)])
    a = full_ranking_metrics(matmul_block(q, v), held, None, 101, [5, 20], user_block=7, item_block=13)
    b = full_ranking_metrics(matmul_block(q, v), held, None, 101, [5, 20], user_block=1000, item_block=1000)
    assert a == b


def test_bad_ks_and_shapes() -> None:
    with pytest.raises(ValueError, match="ks must be"):
        list_metrics(torch.zeros(1, 1, dtype=torch.int64), _csr([[0]]), 1, [0])
    with pytest.raises(ValueError, match="2 top lists"):
        list_metrics(torch.zeros(2, 1, dtype=torch.int64), _csr([[0]]), 1, [1])


def test_subset_csr() -> None:
    offsets, items = subset_csr(_csr([[1, 2], [], [3]]), np.array([2, 0]))
    assert offsets.tolist() == [0, 1, 3] and items.tolist() == [3, 1, 2]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.integers(1, 15), st.integers(0, 2**31 - 1))
def test_list_recall_is_list_metrics_recall(users: int, num_items: int, width: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    top = torch.from_numpy(rng.integers(-1, num_items, (users, width)).astype(np.int64))
    n_held = rng.integers(0, 5, users)
    held = (np.concatenate([[0], np.cumsum(n_held)]).astype(np.int64), rng.integers(0, num_items, int(n_held.sum())).astype(np.int64))
    for k in sorted({1, width, width + 3}):
        assert list_recall(top, held, num_items, k) == list_metrics(top, held, num_items, (k,))[f"recall@{k}"]
    with pytest.raises(ValueError, match="list_recall"):
        list_recall(top[:0], held, num_items, 1)


def _random_csr(rng: np.random.Generator, rows: int, most: int, high: int) -> tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(0, most + 1, rows)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), rng.integers(0, high, int(lengths.sum())).astype(np.int64)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 60), st.integers(1, 70), st.integers(1, 16), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_recall_at_k_is_full_ranking_recall(users: int, num_items: int, k: int, user_block: int, ties: bool, excluded: bool, seed: int) -> None:
    # the same value to the bit: over several user blocks, with ties (coarse vectors), with and without an exclusion
    # (held-out items among the excluded stay rankable), users without held-out items skipped, k above the catalogue
    rng = np.random.default_rng(seed)
    q = torch.from_numpy(rng.integers(-2, 3, (users, 4)) if ties else rng.standard_normal((users, 4))).float()
    v = torch.from_numpy(rng.integers(-2, 3, (num_items, 4)) if ties else rng.standard_normal((num_items, 4))).float()
    held = _random_csr(rng, users, 6, num_items)
    exclude = _random_csr(rng, users, 6, num_items) if excluded else None
    if not np.diff(held[0]).any():
        return  # no user to measure: list_recall's mean of nothing
    expected = full_ranking_metrics(matmul_block(q, v), held, exclude, num_items, (k,), user_block)[f"recall@{k}"]
    assert recall_at_k(matmul_block(q, v), held, exclude, num_items, k, user_block) == expected
    _, top = top_k(matmul_block(q, v), users, num_items, k, None if exclude is None else csr_minus(exclude, held), user_block)
    assert expected == list_recall(top, held, num_items, k)  # what the retrieval loop's gate computed before


def test_recall_at_k_of_a_catalogue_in_several_blocks_goes_through_the_lists() -> None:
    rng = np.random.default_rng(3)
    q, v = torch.randn(30, 8), torch.randn(200, 8)
    held, exclude = _random_csr(rng, 30, 5, 200), _random_csr(rng, 30, 5, 200)
    expected = full_ranking_metrics(matmul_block(q, v), held, exclude, 200, (10,), item_block=64)["recall@10"]
    assert recall_at_k(matmul_block(q, v), held, exclude, 200, 10, item_block=64) == expected
    assert recall_at_k(matmul_block(q, v), held, exclude, 200, 10) == expected  # one block: the kernel


def test_recall_at_k_refuses_nan_scores_and_a_mismatched_exclusion() -> None:
    q, v = torch.randn(3, 4), torch.randn(5, 4)
    v[2, 0] = float("nan")
    held = (np.array([0, 1, 1, 2]), np.array([0, 1]))
    with pytest.raises(ValueError, match="NaN"):
        recall_at_k(matmul_block(q, v), held, None, 5, 2)
    with pytest.raises(ValueError, match="exclude has 1 users, held_out 3"):
        recall_at_k(matmul_block(q, v), held, (np.array([0, 0]), np.zeros(0, np.int64)), 5, 2)
