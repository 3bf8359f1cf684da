"""Numba dot-interaction kernels == the torch reference, values and gradients (B = 1, one vector, odd D)."""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from hypothesis import given, settings

from hugerec.ops import dot_interaction as interaction
from hugerec.ops import reference


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 6),
    num_rest=st.integers(1, 9),
    dim=st.integers(1, 19),
    with_first=st.booleans(),
    self_interaction=st.booleans(),
)
def test_kernels_match_reference(batch: int, num_rest: int, dim: int, with_first: bool, self_interaction: bool) -> None:
    if num_rest + with_first == 1 and not self_interaction:
        return  # a single vector has no pairs (DotInteraction refuses it)
    torch.manual_seed(batch * 1000 + num_rest * 10 + dim)
    rest = torch.randn(batch, num_rest, dim, requires_grad=True)
    first = torch.randn(batch, dim, requires_grad=True) if with_first else None
    rest_ref = rest.detach().clone().requires_grad_(True)
    first_ref = first.detach().clone().requires_grad_(True) if first is not None else None
    assert interaction.kernel_applies(first, rest)
    out = interaction.dot_interaction(first, rest, self_interaction)
    want = reference.dot_interaction(first_ref, rest_ref, self_interaction)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(want)
    (out * weights).sum().backward()
    (want * weights).sum().backward()
    torch.testing.assert_close(rest.grad, rest_ref.grad, rtol=1e-5, atol=1e-5)
    if first is not None:
        torch.testing.assert_close(first.grad, first_ref.grad, rtol=1e-5, atol=1e-5)


def test_reference_runs_for_other_dtypes_and_under_autocast() -> None:
    rest = torch.randn(2, 3, 4, dtype=torch.float64)
    assert not interaction.kernel_applies(None, rest)
    torch.testing.assert_close(
        interaction.dot_interaction(None, rest), reference.dot_interaction(None, rest, self_interaction=False)
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not interaction.kernel_applies(None, rest.float())


def test_gradients_of_a_held_output_stay_valid_across_calls() -> None:
    rest = torch.randn(4, 5, 8, requires_grad=True)
    out1 = interaction.dot_interaction(None, rest)
    out1.sum().backward()
    g1 = rest.grad.clone()
    rest.grad = None
    out2 = interaction.dot_interaction(None, rest * 2)
    out2.sum().backward()
    torch.testing.assert_close(rest.grad, 4 * g1)  # pairs scale by 4, d/drest by 2 * 2
