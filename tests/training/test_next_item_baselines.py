from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.training.next_item_baselines import (
    EASE,
    SKNN,
    SLIST,
    VSKNN,
    ItemKNN,
    MostPopular,
    TrainingSequences,
    fit_baseline,
    score_block,
    slist_grams,
    slist_solve,
)


def _train(seqs: list[list[int]], num_items: int, times: list[int] | None = None) -> TrainingSequences:
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    items = np.array([i for s in seqs for i in s], dtype=np.int64)
    last = np.array(times if times is not None else list(range(len(seqs))), dtype=np.int64)
    return TrainingSequences(offsets, items, num_items, last)


def _pad(hists: list[list[int]], width: int) -> np.ndarray:
    out = np.zeros((len(hists), width), dtype=np.int64)
    for r, h in enumerate(hists):
        tail = h[-width:]
        if tail:
            out[r, width - len(tail) :] = tail
    return out


def _history_vector(h: list[int], num_items: int, n_last: int, decay: float) -> np.ndarray:
    v = np.zeros(num_items)
    for a, item in enumerate(reversed(h[-n_last:])):
        v[item - 1] += decay**a
    return v


SEQS = [[1, 2, 3], [2, 3, 4, 2], [1, 3], [4, 1, 2, 3, 1]]


def test_popular_counts() -> None:
    model = fit_baseline(MostPopular(), _train(SEQS, 5))
    got = model.scores(_pad([[1], [2, 3]], 3))
    np.testing.assert_array_equal(got, [[4, 4, 4, 2, 0]] * 2)


def test_item_knn_matches_loops() -> None:
    num_items = 5
    model = fit_baseline(ItemKNN(n_last=2, decay=0.5), _train(SEQS, num_items))
    sets = [set(s) for s in SEQS]

    def cos(i: int, j: int) -> float:
        both = sum(i in s and j in s for s in sets)
        ni, nj = sum(i in s for s in sets), sum(j in s for s in sets)
        return 0.0 if i == j or not ni or not nj else both / math.sqrt(ni * nj)

    hists = [[3, 1, 2], [4]]
    want = np.array([[sum(w * cos(i, j) for i, w in zip(range(1, 6), _history_vector(h, num_items, 2, 0.5), strict=True)) for j in range(1, 6)] for h in hists])
    np.testing.assert_allclose(model.scores(_pad(hists, 4)), want, rtol=1e-5, atol=1e-6)


def test_ease_is_ridge_of_each_item_on_the_others() -> None:
    """EASE's zero-diagonal closed form = for every item j, ridge regression of column j on the other columns."""
    num_items, lam = 5, 2.0
    x = np.zeros((len(SEQS), num_items))
    for r, s in enumerate(SEQS):
        x[r, np.array(s) - 1] = 1.0
    b = np.zeros((num_items, num_items))
    for j in range(num_items):
        others = [i for i in range(num_items) if i != j]
        xo = x[:, others]
        b[others, j] = np.linalg.solve(xo.T @ xo + lam * np.eye(num_items - 1), xo.T @ x[:, j])
    model = fit_baseline(EASE(lam=lam, n_last=3, decay=0.7), _train(SEQS, num_items))
    hists = [[1, 2, 3, 4], [2]]
    want = np.stack([_history_vector(h, num_items, 3, 0.7) @ b for h in hists])
    np.testing.assert_allclose(model.scores(_pad(hists, 5)), want, rtol=1e-4, atol=1e-5)


def test_slit_with_one_lag_is_transition_counts_over_count_plus_lam() -> None:
    """alpha = 0, n_last = 1: S and T are one-hot previous / next items, so B[i, j] = n(i -> j) / (n(i ->) + lam)."""
    model = fit_baseline(SLIST(alpha=0.0, lam=2.0, n_last=1, decay=0.5), _train(SEQS, 5))
    got = model.scores(_pad([[2], [1]], 2))
    # transitions out of 2: 2->3 in sequences 0, 1 and 3
    np.testing.assert_allclose(got[0], [0, 0, 3 / (3 + 2), 0, 0], atol=1e-6)
    # out of 1: 1->2 in sequences 0 and 3, 1->3 in sequence 2
    np.testing.assert_allclose(got[1], [0, 2 / 5, 1 / 5, 0, 0], atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_slist_matches_normal_equations_built_by_loops(data: st.DataObject) -> None:
    num_items = data.draw(st.integers(1, 6))
    seqs = data.draw(st.lists(st.lists(st.integers(1, num_items), min_size=1, max_size=7), min_size=1, max_size=6))
    alpha = data.draw(st.sampled_from([0.0, 0.3, 1.0]))
    lam = data.draw(st.sampled_from([0.5, 10.0]))
    n_last = data.draw(st.integers(1, 4))
    decay = data.draw(st.sampled_from([0.5, 1.0]))
    xs, ss, ts = [], [], []
    for s in seqs:
        row = np.zeros(num_items)
        row[np.array(s) - 1] = 1.0
        xs.append(row / np.linalg.norm(row))
        for t in range(1, len(s)):
            src = np.zeros(num_items)
            for a in range(n_last):
                if t - 1 - a >= 0:
                    src[s[t - 1 - a] - 1] += decay**a
            ss.append(src / np.linalg.norm(src))
            tgt = np.zeros(num_items)
            tgt[s[t] - 1] = 1.0
            ts.append(tgt)
    x = np.array(xs)
    s_m = np.array(ss).reshape(-1, num_items)
    t_m = np.array(ts).reshape(-1, num_items)
    lhs = alpha * x.T @ x + (1 - alpha) * s_m.T @ s_m + lam * np.eye(num_items)
    b = np.linalg.solve(lhs, alpha * x.T @ x + (1 - alpha) * s_m.T @ t_m)
    train = _train(seqs, num_items)
    model = fit_baseline(SLIST(alpha=alpha, lam=lam, n_last=n_last, decay=decay), train)
    hists = [s[:-1] or s for s in seqs]
    want = np.stack([_history_vector(h, num_items, n_last, decay) @ b for h in hists])
    np.testing.assert_allclose(model.scores(_pad(hists, 8)), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(slist_solve(slist_grams(train, n_last, decay), alpha, lam), b, rtol=1e-4, atol=1e-5)


def _knn_reference(
    seqs: list[list[int]], times: list[int], num_items: int, hist: list[int], own: int, k: int, sample: int, n_last: int, decay: bool
) -> np.ndarray:
    window = [i for i in hist if i][-n_last:]
    weight: dict[int, float] = {}
    for p, item in enumerate(window, start=1):
        weight[item] = p / len(window) if decay else 1.0
    out = np.zeros(num_items)
    if not weight:
        return out
    recency = sorted(range(len(seqs)), key=lambda s: (-times[s], s))
    cands = [s for s in recency if s != own and set(seqs[s]) & weight.keys()][:sample]
    sims = [sum(weight[i] for i in set(seqs[s]) & weight.keys()) / math.sqrt(len(weight) * len(set(seqs[s]))) for s in cands]
    top = sorted(range(len(cands)), key=lambda c: -sims[c])[:k]  # stable: ties keep the more recent first
    for c in top:
        for item in set(seqs[cands[c]]):
            out[item - 1] += sims[c]
    return out


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_session_knn_matches_reference(data: st.DataObject) -> None:
    num_items = data.draw(st.integers(1, 8))
    seqs = data.draw(st.lists(st.lists(st.integers(1, num_items), min_size=1, max_size=6), min_size=1, max_size=10))
    times = data.draw(st.lists(st.integers(0, 5), min_size=len(seqs), max_size=len(seqs)))  # ties in recency
    hists = data.draw(st.lists(st.lists(st.integers(1, num_items), max_size=7), min_size=1, max_size=5))  # empty ones too
    own = np.array(data.draw(st.lists(st.integers(-1, len(seqs) - 1), min_size=len(hists), max_size=len(hists))))
    k, sample, n_last = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    train = _train(seqs, num_items, times)
    for spec, decay in ((SKNN(k=k, sample=sample, n_last=n_last), False), (VSKNN(k=k, sample=sample, n_last=n_last), True)):
        got = fit_baseline(spec, train).scores(_pad(hists, 7), own)
        want = np.stack([_knn_reference(seqs, times, num_items, h, int(o), k, sample, n_last, decay) for h, o in zip(hists, own, strict=True)])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_score_block_slices_queries_and_own() -> None:
    train = _train(SEQS, 5)
    model = fit_baseline(SKNN(k=2, sample=10, n_last=5), train)
    hists = _pad([[1, 2], [3], [4, 2]], 4)
    own = np.array([0, -1, 1])
    whole = model.scores(hists, own)
    np.testing.assert_array_equal(score_block(model, hists, own)(1, 3).numpy(), whole[1:3])


def test_bad_input_names_the_value() -> None:
    with pytest.raises(ValueError, match="decay"):
        SLIST(decay=0.0)
    with pytest.raises(ValueError, match="lam"):
        EASE(lam=-1.0)
    with pytest.raises(ValueError, match="sample"):
        VSKNN(sample=0)
    with pytest.raises(ValueError, match=r"1\.\.5"):
        _train([[1, 6]], 5)
    model = fit_baseline(MostPopular(), _train(SEQS, 5))
    with pytest.raises(ValueError, match=r"0\.\.5"):
        model.scores(np.array([[7]]))
    with pytest.raises(ValueError, match="shape"):
        fit_baseline(SKNN(), _train(SEQS, 5)).scores(np.array([[1]]), np.array([0, 1]))
