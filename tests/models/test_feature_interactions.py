import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.models.feature_interactions import DotInteraction, FMInteraction


def naive_dots(x: torch.Tensor, self_interaction: bool) -> torch.Tensor:
    b, f, _ = x.shape
    cols = []
    for i in range(f):
        for j in range(i if self_interaction else i + 1, f):
            cols.append((x[:, i] * x[:, j]).sum(dim=1))
    return torch.stack(cols, dim=1) if cols else x.new_zeros(b, 0)


def naive_fm(x: torch.Tensor) -> torch.Tensor:
    return naive_dots(x, self_interaction=False).sum(dim=1)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 5), f=st.integers(2, 9), d=st.integers(1, 6), self_interaction=st.booleans())
def test_dot_interaction_matches_naive(b: int, f: int, d: int, self_interaction: bool) -> None:
    x = torch.randn(b, f, d, dtype=torch.float64)
    layer = DotInteraction(f, self_interaction)
    out = layer(x)
    assert out.shape == (b, layer.out_dim)
    assert layer.out_dim == (f * (f + 1) // 2 if self_interaction else f * (f - 1) // 2)
    torch.testing.assert_close(out, naive_dots(x, self_interaction))


def test_dot_interaction_mlperf_width_and_gradient() -> None:
    layer = DotInteraction(27)
    assert layer.out_dim == 351  # 26 tables + the bottom MLP's output
    x = torch.randn(3, 27, 4, requires_grad=True)
    layer(x).sum().backward()
    # d/dx_i of sum_{j != i} <x_i, x_j> = sum_{j != i} x_j
    expected = x.detach().sum(dim=1, keepdim=True) - x.detach()
    torch.testing.assert_close(x.grad, expected)


def test_dot_interaction_single_feature_self_only() -> None:
    x = torch.randn(2, 1, 3)
    torch.testing.assert_close(DotInteraction(1, self_interaction=True)(x), (x * x).sum(dim=2))
    with pytest.raises(ValueError, match="no pairs"):
        DotInteraction(1)
    with pytest.raises(ValueError, match="num_features"):
        DotInteraction(0)
    with pytest.raises(ValueError, match=r"F=4"):
        DotInteraction(4)(torch.randn(2, 3, 5))


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 5), f=st.integers(1, 9), d=st.integers(1, 6))
def test_fm_trick_matches_naive_pairs(b: int, f: int, d: int) -> None:
    x = torch.randn(b, f, d, dtype=torch.float64)
    out = FMInteraction()(x)
    assert out.shape == (b,)
    torch.testing.assert_close(out, naive_fm(x))


def test_fm_rejects_2d() -> None:
    with pytest.raises(ValueError, match=r"\[B, F, D\]"):
        FMInteraction()(torch.randn(2, 3))


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 5), f=st.integers(2, 9), d=st.integers(1, 6), self_interaction=st.booleans())
def test_forward_split_is_forward_of_the_concatenation(b: int, f: int, d: int, self_interaction: bool) -> None:
    layer = DotInteraction(f, self_interaction)
    first = torch.randn(b, d, requires_grad=True)
    rest = torch.randn(b, f - 1, d, requires_grad=True)
    out = layer.forward_split(first, rest)  # the Numba kernels (fp32 on the CPU)
    x = torch.cat([first.detach().unsqueeze(1), rest.detach()], dim=1).double().requires_grad_(True)
    want = layer(x)  # the torch path (fp64)
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    want.sum().backward()
    assert x.grad is not None and first.grad is not None and rest.grad is not None
    torch.testing.assert_close(first.grad.double(), x.grad[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rest.grad.double(), x.grad[:, 1:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected"):
        layer.forward_split(first, rest[:, :0] if f > 1 else rest)
