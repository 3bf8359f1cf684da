from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.ops import reference
from hugerec.ops.cpu import jagged_attention_kernels as kernels


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, pairs: torch.Tensor, scale: float, keep: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel: out [N, H, Dv] and (keep) the [H, P] values it keeps for the backward, NaN-filled first."""
    out = torch.full_like(v, float("nan"))
    shape = (q.shape[1], int(pairs[-1])) if keep else (0, 0)
    saved_a, saved_ds = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    kernels.attention_forward(
        q.numpy(), k.numpy(), v.numpy(), bias.numpy(), offsets.numpy(), pairs.numpy(), scale, out.numpy(), saved_a.numpy(), saved_ds.numpy()
    )
    return out, saved_a, saved_ds


def _backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, saved: tuple[torch.Tensor, torch.Tensor],
              offsets: torch.Tensor, pairs: torch.Tensor, bias: torch.Tensor) -> list[torch.Tensor]:
    got = [torch.full_like(t, float("nan")) for t in (q, k, v, bias)]  # every entry must be written
    kernels.attention_backward(
        grad.numpy(), q.numpy(), k.numpy(), v.numpy(), saved[0].numpy(), saved[1].numpy(), offsets.numpy(), pairs.numpy(), *(g.numpy() for g in got)
    )
    return got


def _case(data: st.DataObject, max_len: int = 9) -> tuple[torch.Tensor, ...]:
    lengths = data.draw(st.lists(st.integers(0, max_len), min_size=1, max_size=5), "lengths")  # empty sequences too, B = 1 too
    heads, dq, dv = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5))
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    n = int(offsets[-1])
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    q, k = torch.randn(n, heads, dq, generator=gen), torch.randn(n, heads, dq, generator=gen)
    v = torch.randn(n, heads, dv, generator=gen)
    pairs = reference.pair_offsets(offsets)
    bias = torch.randn(int(pairs[-1]), generator=gen)
    grad = torch.randn(n, heads, dv, generator=gen)
    return q, k, v, bias, offsets, pairs, grad


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_forward_and_backward_match_the_padded_reference(data: st.DataObject) -> None:
    q, k, v, bias, offsets, pairs, grad = _case(data)
    scale = 0.3
    out, *saved = _forward(q, k, v, bias, offsets, pairs, scale)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    want = reference.jagged_causal_attention(*leaves, offsets, scale)
    torch.testing.assert_close(out, want.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(_forward(q, k, v, bias, offsets, pairs, scale, keep=False)[0], out, rtol=0, atol=0)  # keeping changes nothing
    # the kept values: a = silu(s) * scale and scale * silu'(s) of every pair and head (NumPy, float64)
    query, key = np.empty(int(pairs[-1]), np.int64), np.empty(int(pairs[-1]), np.int64)
    kernels.pair_positions(offsets.numpy(), pairs.numpy(), query, key)
    s64 = (q.double().numpy()[query] * k.double().numpy()[key]).sum(-1).T + bias.double().numpy()  # [H, P]
    sig = 1 / (1 + np.exp(-s64))
    np.testing.assert_allclose(saved[0].numpy(), s64 * sig * scale, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(saved[1].numpy(), scale * sig * (1 + s64 * (1 - sig)), rtol=1e-4, atol=1e-6)
    want.backward(grad)
    got = _backward(grad, q, k, v, (saved[0], saved[1]), offsets, pairs, bias)
    for g, leaf in zip(got, leaves, strict=True):
        assert leaf.grad is not None
        torch.testing.assert_close(g, leaf.grad, rtol=1e-4, atol=1e-5)


def test_long_sequence_matches_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    offsets = torch.tensor([0, 1, 301, 301, 350], dtype=torch.int64)  # lengths 1, 300, 0, 49
    q, k, v = (torch.randn(350, 2, 8, generator=gen) * 0.5 for _ in range(3))
    pairs = reference.pair_offsets(offsets)
    bias = torch.randn(int(pairs[-1]), generator=gen)
    out = _forward(q, k, v, bias, offsets, pairs, 1 / 300, keep=False)[0]
    torch.testing.assert_close(out, reference.jagged_causal_attention(q, k, v, bias, offsets, 1 / 300), rtol=1e-4, atol=1e-5)


def test_pair_positions_enumerate_the_causal_pairs() -> None:
    offsets = np.array([0, 2, 2, 5], dtype=np.int64)
    pairs = reference.pair_offsets(torch.from_numpy(offsets)).numpy()
    query, key = np.empty(pairs[-1], np.int64), np.empty(pairs[-1], np.int64)
    kernels.pair_positions(offsets, pairs, query, key)
    assert list(zip(query.tolist(), key.tolist(), strict=True)) == [(0, 0), (1, 0), (1, 1), (2, 2), (3, 2), (3, 3), (4, 2), (4, 3), (4, 4)]


def test_sigmoid_row_matches_numpy_over_the_whole_float_range() -> None:
    # the kernels' own exp: across the clamp at -87 / 88, at 0, at the round-to-nearest boundaries of n,
    # and far outside; only the first m entries are written; a NaN stays NaN
    s = np.concatenate([
        np.linspace(-100, 100, 4001, dtype=np.float32),
        np.array([0.0, -0.0, 87.0, -87.0, 88.5, -88.5, 0.34657359, -0.34657359, 1e-8, 3e38, -3e38], dtype=np.float32),
        np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 4,
    ])
    sig = np.full(len(s) + 3, 7.0, dtype=np.float32)
    bits = np.empty(len(s) + 3, dtype=np.int32)
    kernels.sigmoid_row(np.concatenate([s, np.zeros(3, np.float32)]), sig, bits, len(s))
    with np.errstate(over="ignore"):  # exp(3e38) is inf in float64 too: sigmoid 0
        want = 1.0 / (1.0 + np.exp(-s.astype(np.float64)))
    np.testing.assert_allclose(sig[: len(s)], want, rtol=2e-6, atol=1e-37)
    assert (sig[len(s) :] == 7.0).all()
    out = np.empty(1, np.float32)
    kernels.sigmoid_row(np.array([np.nan], np.float32), out, np.empty(1, np.int32), 1)
    assert np.isnan(np.float32(np.nan) * out[0])  # silu = s * sigmoid(s) stays NaN


def test_ml1m_length_sequences_match_reference() -> None:
    # HSTU's ML-1M shape: sequences at max_len 200 beside a length-1 and an empty one, 2 heads of width 32
    lengths = [200, 1, 0, 200, 137]
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    n, pairs = int(offsets[-1]), reference.pair_offsets(offsets)
    gen = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(n, 2, 32, generator=gen) * 0.3 for _ in range(4))
    bias = torch.randn(int(pairs[-1]), generator=gen) * 0.1
    out, *saved = _forward(q, k, v, bias, offsets, pairs, 1 / 200)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    want = reference.jagged_causal_attention(*leaves, offsets, 1 / 200)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-6)
    want.backward(grad)
    got = _backward(grad, q, k, v, (saved[0], saved[1]), offsets, pairs, bias)
    for g, leaf in zip(got, leaves, strict=True):
        assert leaf.grad is not None
        torch.testing.assert_close(g, leaf.grad, rtol=1e-3, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=6), st.integers(1, 14), st.integers(1, 4), st.integers(0, 1000))
def test_relative_bias_kernels_match_the_reference(lengths: list[int], size: int, chunks: int, seed: int) -> None:
    offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    pairs = reference.pair_offsets(offsets)
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(size, generator=gen, requires_grad=True)
    want = reference.relative_bias(table, offsets)
    out = np.full(int(pairs[-1]), np.nan, np.float32)  # every entry must be written
    kernels.relative_bias_forward(table.detach().numpy(), offsets.numpy(), pairs.numpy(), out)
    np.testing.assert_array_equal(out, want.detach().numpy())
    grad = torch.randn(int(pairs[-1]), generator=gen)
    table64 = table.detach().double().requires_grad_()  # the sums in float64: float32 autograd loses digits to cancellation
    reference.relative_bias(table64, offsets).backward(grad.double())
    partial = np.full((chunks, size), np.nan)
    kernels.relative_bias_backward(grad.numpy(), offsets.numpy(), pairs.numpy(), partial)
    assert table64.grad is not None
    np.testing.assert_allclose(partial.sum(0), table64.grad.numpy(), rtol=1e-9, atol=1e-9)
