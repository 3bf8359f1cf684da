"""dot_interaction, the autograd op around the dot-interaction kernels: its values and gradients equal the
plain-torch reference (hugerec.ops.reference.dot_interaction) with and without a first vector and self pairs,
for B = 1, an empty batch and one feature; which path a tensor takes (Numba for eager fp32 CPU tensors, the
reference for other dtypes); num_pairs."""

from __future__ import annotations

import pytest
import torch

from hugerec.ops import reference
from hugerec.ops.dot_interaction import dot_interaction, kernel_applies, num_pairs


def _inputs(
    b: int, f: int, d: int, first: bool, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(b * 100 + f)
    rest = torch.randn(b, f, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    head = torch.randn(b, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_() if first else None
    return head, rest


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("self_interaction", [True, False])
@pytest.mark.parametrize(("b", "f"), [(5, 4), (1, 3), (0, 3), (3, 1)])
def test_values_and_gradients_equal_the_reference(first: bool, self_interaction: bool, b: int, f: int) -> None:
    head, rest = _inputs(b, f, 8, first)
    out = dot_interaction(head, rest, self_interaction)
    n = f + first
    assert out.shape == (b, num_pairs(n, self_interaction)) and out.dtype == torch.float32
    ref_head = None if head is None else head.detach().clone().requires_grad_()
    ref_rest = rest.detach().clone().requires_grad_()
    want = reference.dot_interaction(ref_head, ref_rest, self_interaction)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    if out.numel():
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
        (out * weights).sum().backward()
        (want * weights).sum().backward()
        torch.testing.assert_close(rest.grad, ref_rest.grad, rtol=1e-5, atol=1e-5)
        if head is not None:
            torch.testing.assert_close(head.grad, ref_head.grad, rtol=1e-5, atol=1e-5)  # type: ignore[union-attr]


def test_pairs_and_paths() -> None:
    assert [num_pairs(n, False) for n in (1, 2, 27)] == [0, 1, 351] and num_pairs(27, True) == 378
    head, rest = _inputs(2, 3, 4, True)
    assert kernel_applies(head, rest) and kernel_applies(None, rest)
    head64, rest64 = _inputs(2, 3, 4, True, torch.float64)
    assert not kernel_applies(head64, rest64)
    out = dot_interaction(head64, rest64)  # the reference path keeps float64
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference.dot_interaction(head64, rest64, False))
    assert not kernel_applies(head64.float(), rest64)  # mixed dtypes: the reference
