"""The session-kNN kernel on a hand-computed case (its randomised reference test is the baselines' one:
tests/training/test_next_item_baselines.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hugerec.ops.cpu.session_knn_kernels import session_knn_scores

# training sequences s0 = [1, 2, 3] (older, rank 1) and s1 = [2, 4] (newest, rank 0); items 1..4
SEQ_OFFSETS, SEQ_ITEMS = np.array([0, 3, 5]), np.array([1, 2, 3, 2, 4])
ITEM_OFFSETS, ITEM_SEQS = np.array([0, 0, 1, 3, 4, 5]), np.array([0, 0, 1, 0, 1])  # item -> sequences holding it
RANK = np.array([1, 0])
S0, S1 = 1 / np.sqrt(3), 1 / np.sqrt(2)  # similarity to the query [2]: shared weight / sqrt(1 * length)


def scores(hist: list[list[int]], own: int = -1, k: int = 2, sample: int = 10, decay: bool = False) -> np.ndarray:
    out = np.zeros((len(hist), 4), dtype=np.float32)
    session_knn_scores(np.array(hist, dtype=np.int64), np.full(len(hist), own), SEQ_OFFSETS, SEQ_ITEMS, ITEM_OFFSETS, ITEM_SEQS, RANK, k, sample, decay, out)
    return out


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, [S0, S0 + S1, S0, S1]),  # both neighbours vote for their items
        ({"k": 1}, [0, S1, 0, S1]),  # the nearest only
        ({"sample": 1}, [0, S1, 0, S1]),  # the most recent sequence holding the item only
        ({"own": 1}, [S0, S0, S0, 0]),  # the query's own sequence left out
    ],
)
def test_neighbours_vote_with_their_similarity(kwargs: dict[str, int], want: list[float]) -> None:
    np.testing.assert_allclose(scores([[0, 2]], **kwargs)[0], want, rtol=1e-6)


def test_an_empty_history_scores_nothing_and_decay_weighs_the_newer_item() -> None:
    assert not scores([[0, 0]]).any()
    # query [4, 1]: weights 1/2 (item 4) and 2/2 (item 1); s0 shares item 1, s1 item 4
    got = scores([[4, 1]], decay=True)[0]
    s0, s1 = 1.0 / np.sqrt(2 * 3), 0.5 / np.sqrt(2 * 2)
    np.testing.assert_allclose(got, [s0, s0 + s1, s0, s1], rtol=1e-6)
