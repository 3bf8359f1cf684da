"""Triton dot-interaction kernels == the torch reference, values and gradients (B = 1, one vector, odd D,
self-interaction), and they compile for an H100."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from hugerec.ops import dot_interaction as interaction
from hugerec.ops import reference

from .conftest import DEVICE

kernels = pytest.importorskip("hugerec.ops.gpu.dot_interaction_kernels")


@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 4),
    num_rest=st.integers(1, 9),
    dim=st.integers(1, 19),
    with_first=st.booleans(),
    self_interaction=st.booleans(),
)
def test_kernels_match_reference(batch: int, num_rest: int, dim: int, with_first: bool, self_interaction: bool) -> None:
    if num_rest + with_first == 1 and not self_interaction:
        return  # a single vector has no pairs
    torch.manual_seed(batch * 1000 + num_rest * 10 + dim)
    rest = torch.randn(batch, num_rest, dim)
    first = torch.randn(batch, dim) if with_first else torch.empty(0, dim)
    want = reference.dot_interaction(first if with_first else None, rest, self_interaction)
    out = torch.empty(want.shape, device=DEVICE)
    kernels.dot_forward(first.to(DEVICE), rest.to(DEVICE), self_interaction, out)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)

    rest_ref = rest.clone().requires_grad_(True)
    first_ref = first.clone().requires_grad_(True) if with_first else None
    grad = torch.randn(want.shape)
    (reference.dot_interaction(first_ref, rest_ref, self_interaction) * grad).sum().backward()
    grad_rest = torch.empty(rest.shape, device=DEVICE)
    grad_first = torch.empty(first.shape, device=DEVICE)
    kernels.dot_backward(grad.to(DEVICE), first.to(DEVICE), rest.to(DEVICE), self_interaction, grad_first, grad_rest)
    assert rest_ref.grad is not None
    torch.testing.assert_close(grad_rest.cpu(), rest_ref.grad, rtol=1e-5, atol=1e-5)
    if first_ref is not None:
        assert first_ref.grad is not None
        torch.testing.assert_close(grad_first.cpu(), first_ref.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_take_the_triton_op_with_autograd() -> None:
    rest = torch.randn(8, 26, 128, device="cuda", requires_grad=True)
    first = torch.randn(8, 128, device="cuda", requires_grad=True)
    assert interaction.triton_path(first, rest)
    out = interaction.dot_interaction(first, rest)
    rest_ref, first_ref = rest.detach().clone().requires_grad_(True), first.detach().clone().requires_grad_(True)
    want = reference.dot_interaction(first_ref, rest_ref, False)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(rest.grad, rest_ref.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(first.grad, first_ref.grad, rtol=1e-4, atol=1e-4)


def test_kernels_compile_for_hopper(hopper: Any) -> None:
    module = "hugerec.ops.gpu.dot_interaction_kernels"
    forward = {
        "first": "*fp32",
        "rest": "*fp32",
        "out": "*fp32",
        "num_rest": "i32",
        "dim": "i32",
        "pairs": "i32",
        "LEAD": "constexpr",
        "SELF": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_D": "constexpr",
    }
    backward = {
        "grad": "*fp32",
        "first": "*fp32",
        "rest": "*fp32",
        "grad_first": "*fp32",
        "grad_rest": "*fp32",
        "num_rest": "i32",
        "dim": "i32",
        "pairs": "i32",
        "LEAD": "constexpr",
        "SELF": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_D": "constexpr",
    }
    const = {"LEAD": 1, "SELF": False, "BLOCK_N": 32, "BLOCK_D": 128}
    hopper([(module, "_dot_forward_kernel", forward, const), (module, "_dot_backward_kernel", backward, const)])
