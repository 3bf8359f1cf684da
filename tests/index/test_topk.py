"""Blocked exact top-K: == a full sort by (-score, position) for any blocking, ties, -inf, k > items."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.index.topk import decode, encode, top_k


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 20),
    st.integers(1, 25),
    st.integers(1, 7),
    st.integers(1, 9),
    st.data(),
)
def test_top_k_matches_sort(nq: int, ni: int, k: int, qb: int, ib: int, data: st.DataObject) -> None:
    values = st.sampled_from([float("-inf"), -2.5, -0.0, 0.0, 1e-30, 3.0, 1e30])
    scores = torch.tensor(data.draw(st.lists(values, min_size=nq * ni, max_size=nq * ni)), dtype=torch.float32).view(nq, ni)
    got_s, got_p = top_k(lambda q0, q1, i0, i1: scores[q0:q1, i0:i1], nq, ni, k, query_block=qb, item_block=ib)
    for q in range(nq):
        order = sorted(range(ni), key=lambda i: (-float(scores[q, i]) + 0.0, i))[:k]
        want_p = [i if scores[q, i] != float("-inf") else -1 for i in order]
        assert got_p[q].tolist() == want_p
        assert got_s[q].tolist() == [float(scores[q, i]) for i in order]


def test_encode_decode_round_trip() -> None:
    s = torch.tensor([[float("-inf"), -1e38, -1.0, 0.0, 1.0, 3.4e38, float("inf")]])
    scores, pos = decode(encode(s, 5))
    assert torch.equal(scores, s)
    assert pos.tolist() == [[-1, 6, 7, 8, 9, 10, 11]]
    keys = encode(s, 0)
    assert torch.equal(torch.sort(keys, dim=1).values, keys)


def test_exclusion_and_errors() -> None:
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    excl = (np.array([0, 2]), np.array([0, 2]))
    s, p = top_k(lambda q0, q1, i0, i1: scores[q0:q1, i0:i1], 1, 3, 3, excl, item_block=2)
    assert p.tolist() == [[1, -1, -1]] and s[0, 0] == 2.0
    with pytest.raises(ValueError, match="NaN"):
        top_k(lambda *a: torch.tensor([[float("nan")]]), 1, 1, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        top_k(lambda *a: scores, 1, 3, 0)
