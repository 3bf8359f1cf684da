from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.ops import reference
from hugerec.ops.jagged_attention import (
    SERIAL_WORK,
    jagged_causal_attention,
    log_time_buckets,
    pair_offsets,
    pair_positions,
    relative_bias,
)


def _inputs(lengths: list[int], heads: int = 2, dq: int = 4, dv: int = 3, seed: int = 0, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    p = int(pair_offsets(offsets)[-1])
    return [*(torch.randn(n, heads, d, generator=gen, dtype=dtype) for d in (dq, dq, dv)), torch.randn(p, generator=gen, dtype=dtype), offsets]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=4), st.integers(0, 1000))
def test_autograd_op_matches_reference_gradients(lengths: list[int], seed: int) -> None:
    *tensors, offsets = _inputs(lengths, seed=seed)
    ours = [t.clone().requires_grad_() for t in tensors]
    ref = [t.clone().requires_grad_() for t in tensors]
    out = jagged_causal_attention(*ours, offsets, 0.25)
    want = reference.jagged_causal_attention(*ref, offsets, 0.25)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    want.backward(grad)
    for a, b in zip(ours, ref, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_gradcheck_of_the_reference_in_float64() -> None:
    *tensors, offsets = _inputs([3, 1, 0, 4], dtype=torch.float64)
    leaves = [t.requires_grad_() for t in tensors]
    assert torch.autograd.gradcheck(lambda *x: jagged_causal_attention(*x, offsets, 0.5), leaves)  # float64 takes the reference


def test_a_sequence_never_sees_another_or_a_later_item() -> None:
    *tensors, offsets = _inputs([4, 5])
    q, k, v, bias = tensors
    base = jagged_causal_attention(q, k, v, bias, offsets, 1.0)
    v2 = v.clone()
    v2[6] += 10.0  # row 6 = position 2 of the second sequence
    moved = jagged_causal_attention(q, k, v2, bias, offsets, 1.0)
    torch.testing.assert_close(moved[:6], base[:6])  # the first sequence and earlier positions unchanged
    assert not torch.allclose(moved[6:], base[6:])


def test_empty_batch_and_empty_sequences() -> None:
    *tensors, offsets = _inputs([0, 0])
    out = jagged_causal_attention(*(t.requires_grad_() for t in tensors), offsets, 1.0)
    assert out.shape == (0, 2, 3)
    out.sum().backward()


def test_pair_positions_agree_on_both_paths() -> None:
    offsets = torch.tensor([0, 3, 3, 7], dtype=torch.int64)
    q, k = pair_positions(offsets)
    n = offsets.diff()
    seq = torch.repeat_interleave(torch.arange(3), n)
    assert q.tolist() == [i for b in range(3) for i in range(int(offsets[b]), int(offsets[b + 1])) for _ in range(i - int(offsets[b]) + 1)]
    assert bool((seq[q] == seq[k]).all()) and bool((k <= q).all())


def test_bad_shapes_are_named() -> None:
    q, k, v, bias, offsets = _inputs([2, 3])
    with pytest.raises(ValueError, match=r"bias must be \[P\] = \[9\]"):
        jagged_causal_attention(q, k, v, bias[:-1], offsets, 1.0)
    with pytest.raises(ValueError, match="offsets must run from 0 to N = 5"):
        jagged_causal_attention(q, k, v, bias, torch.tensor([0, 2, 4]), 1.0)
    with pytest.raises(ValueError, match="q, k must be"):
        jagged_causal_attention(q, k[:, :1], v, bias, offsets, 1.0)


def test_a_problem_above_the_serial_size_runs_parallel_and_agrees() -> None:
    *tensors, offsets = _inputs([400, 3, 390], heads=2, dq=8, dv=8)
    assert int(pair_offsets(offsets)[-1]) * 2 * 16 > SERIAL_WORK
    ours = [t.clone().requires_grad_() for t in tensors]
    ref = [t.clone().requires_grad_() for t in tensors]
    out = jagged_causal_attention(*ours, offsets, 1 / 400)
    want = reference.jagged_causal_attention(*ref, offsets, 1 / 400)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    out.sum().backward()
    want.sum().backward()
    for a, b in zip(ours, ref, strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-3, atol=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=5), st.integers(1, 14), st.integers(0, 1000))
def test_relative_bias_matches_the_reference_and_its_gradient(lengths: list[int], size: int, seed: int) -> None:
    # empty sequences, B = 1, tables shorter than a sequence (the cap) and longer
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(size, generator=gen)
    ours, ref = table.clone().requires_grad_(), table.double().requires_grad_()  # gradients summed in float64 on both
    out = relative_bias(ours, offsets)
    want = reference.relative_bias(ref, offsets)
    torch.testing.assert_close(out, want.float(), rtol=0, atol=0)
    grad = torch.randn(out.shape, generator=gen)
    out.backward(grad)
    want.backward(grad.double())
    assert ours.grad is not None and ref.grad is not None
    assert ours.grad.dtype == torch.float32
    torch.testing.assert_close(ours.grad, ref.grad.float(), rtol=1e-6, atol=1e-6)


def test_relative_bias_of_many_sequences_sums_every_chunk() -> None:
    # more sequences than threads: each task's partial row covers every C-th sequence
    offsets = torch.tensor([0, *torch.arange(1, 40).cumsum(0).tolist()], dtype=torch.int64)
    table = torch.zeros(50, requires_grad=True)
    relative_bias(table, offsets).sum().backward()
    n = offsets.diff()
    want = torch.tensor([float((n - d).clamp(min=0).sum()) for d in range(50)])  # pairs at distance d
    assert table.grad is not None
    torch.testing.assert_close(table.grad, want)


def test_relative_bias_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match=r"table must be \[T\] with T >= 1, got \(0,\)"):
        relative_bias(torch.zeros(0), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="offsets must be"):
        relative_bias(torch.zeros(3), torch.tensor([0.0, 1.0]))


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=5),
    st.sampled_from([10, 10**6, 10**9, 2**62]),
    st.integers(1, 70),
    st.integers(0, 1000),
)
def test_log_time_buckets_match_the_reference(lengths: list[int], spread: int, cap: int, seed: int) -> None:
    """Any times (unsorted, equal, negative differences, near int64's range), empty sequences and B = 1:
    the kernel's buckets are the reference's, and HSTU's per-difference formula's."""
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    times = torch.randint(0, spread, (sum(lengths),), generator=gen, dtype=torch.int64)
    got = log_time_buckets(times, offsets, 0.301, cap)
    want = reference.log_time_buckets(times, offsets, 0.301, cap)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    query, key = pair_positions(offsets)
    delta = times[query] - times[key]
    assert torch.equal(got, (torch.log(delta.abs().clamp(min=1).double()) / 0.301).long().clamp(max=cap))


def test_log_time_buckets_exact_at_every_bucket_edge() -> None:
    """Differences at and around each bucket's first second, where a floor could slip."""
    edges = torch.tensor([int(torch.tensor(0.301 * k, dtype=torch.float64).exp()) + d for k in range(70) for d in (-1, 0, 1, 2)])
    times = torch.cat([torch.zeros(1, dtype=torch.int64), edges.clamp(min=0)])
    offsets = torch.tensor([0, len(times)], dtype=torch.int64)
    assert torch.equal(log_time_buckets(times, offsets, 0.301, 64), reference.log_time_buckets(times, offsets, 0.301, 64))
    with pytest.raises(ValueError, match="times has 3 rows"):
        log_time_buckets(torch.zeros(3, dtype=torch.int64), torch.tensor([0, 2]), 0.301, 64)
    with pytest.raises(ValueError, match="must be int64"):
        log_time_buckets(torch.zeros(2), torch.tensor([0, 2]), 0.301, 64)
