"""The top-K kernel == its torch reference (`torch.topk(index.topk.encode(scores), m)`): ties broken by position,
-0.0 as +0.0, -inf, m = n, one row, positions past 2^31."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.index.topk import encode
from hugerec.ops.cpu.topk_kernels import top_keys


def _kernel(scores: torch.Tensor, first: int, m: int) -> torch.Tensor:
    out = np.empty((scores.shape[0], m), dtype=np.int64)
    top_keys(scores.contiguous().numpy().view(np.int32), first, out)
    return torch.from_numpy(out)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 40),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0, 7, 2**31 + 5]),
    st.booleans(),
)
def test_top_keys_equal_the_torch_reference(rows: int, n: int, seed: int, first: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, (rows, n)).astype(np.float32) if ties else rng.standard_normal((rows, n)).astype(np.float32)
    special = rng.random((rows, n))
    values[special < 0.1] = -0.0
    values[(special >= 0.1) & (special < 0.15)] = -np.inf
    values[(special >= 0.15) & (special < 0.18)] = np.inf
    scores = torch.from_numpy(values)
    for m in sorted({1, min(3, n), n}):
        expected = torch.topk(encode(scores, first), m, dim=1).values
        assert torch.equal(_kernel(scores, first, m), expected), (m, values)


def test_top_keys_on_a_large_block() -> None:
    torch.manual_seed(0)
    scores = torch.randn(300, 2000) @ torch.randn(2000, 8)[:, :1].expand(2000, 8)  # [300, 8]: many equal columns
    scores = torch.cat([scores, torch.randn(300, 1500)], dim=1)
    expected = torch.topk(encode(scores, 100), 50, dim=1).values
    assert torch.equal(_kernel(scores, 100, 50), expected)


def test_top_keys_counts_the_nan_scores() -> None:
    scores = torch.randn(4, 30)
    scores[1, 3] = scores[3, 0] = float("nan")
    scores[2, 5] = -float("nan")  # the sign bit set: still NaN
    out = np.empty((4, 5), dtype=np.int64)
    assert top_keys(scores.numpy().view(np.int32), 0, out) == 3
    assert top_keys(torch.randn(4, 30).numpy().view(np.int32), 0, out) == 0
