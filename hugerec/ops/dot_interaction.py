"""DLRM's dot interaction with autograd: Numba kernels on the CPU in fp32, Triton kernels on CUDA (where
Triton is installed), the torch reference elsewhere.

    dot_interaction(first [B, D] or None, rest [B, F, D], self_interaction) -> [B, P]

See `hugerec.ops.cpu.dot_interaction_kernels` for the pair order and why the kernels beat torch's batched GEMM.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from hugerec.ops import reference, triton_applies
from hugerec.ops.cpu import dot_interaction_kernels as _cpu
from hugerec.ops.workspace import OutputPool

_GRADS = OutputPool(capacity=4)  # the [B, F, D] input gradients: 54 MiB at DLRM's MLPerf shape


def kernel_applies(first: torch.Tensor | None, rest: torch.Tensor) -> bool:
    """The Numba path: fp32 CPU tensors, eager (not compiled, exported or traced)."""
    return (
        rest.device.type == "cpu"
        and rest.dtype == torch.float32
        and (first is None or (first.dtype == torch.float32 and first.device.type == "cpu"))
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


def triton_path(first: torch.Tensor | None, rest: torch.Tensor) -> bool:
    """The Triton path: CUDA tensors (or CPU ones under `hugerec.ops.triton_on_cpu`) of one float dtype,
    Triton installed, eager."""
    return (
        triton_applies(rest)
        and rest.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and (first is None or (first.dtype == rest.dtype and first.device == rest.device))
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


def dot_interaction(first: torch.Tensor | None, rest: torch.Tensor, self_interaction: bool = False) -> torch.Tensor:
    """Pairwise dots of [first[b]] + rest[b] per example (see `hugerec.ops.reference.dot_interaction`)."""
    if triton_path(first, rest):
        return _TritonDotInteraction.apply(first, rest, self_interaction)
    if kernel_applies(first, rest):
        return _DotInteraction.apply(first, rest, self_interaction)
    return reference.dot_interaction(first, rest, self_interaction)


def num_pairs(n: int, self_interaction: bool) -> int:
    return n * (n + 1) // 2 if self_interaction else n * (n - 1) // 2


class _DotInteraction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, first: torch.Tensor | None, rest: torch.Tensor, self_interaction: bool) -> torch.Tensor:
        rest_c = rest.detach().contiguous()
        first_c = rest_c.new_empty(0, rest.shape[2]) if first is None else first.detach().contiguous()
        n = rest.shape[1] + (first is not None)
        out = torch.empty(rest.shape[0], num_pairs(n, self_interaction), dtype=torch.float32)
        _cpu.dot_forward(first_c.numpy(), rest_c.numpy(), self_interaction, out.numpy())
        ctx.save_for_backward(first_c, rest_c)
        ctx.has_first = first is not None
        ctx.self_interaction = self_interaction
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        first, rest = ctx.saved_tensors
        grad_rest = _GRADS.empty(tuple(rest.shape), rest.dtype, rest.device)
        grad_first = torch.empty_like(first)
        _cpu.dot_backward(
            grad.detach().contiguous().numpy(),
            first.numpy(),
            rest.numpy(),
            ctx.self_interaction,
            grad_first.numpy(),
            grad_rest.numpy(),
        )
        return (grad_first if ctx.has_first else None), grad_rest, None


class _TritonDotInteraction(torch.autograd.Function):
    """The same op on CUDA through `hugerec.ops.gpu.dot_interaction_kernels` (output in the inputs' dtype)."""

    @staticmethod
    def forward(ctx: Any, first: torch.Tensor | None, rest: torch.Tensor, self_interaction: bool) -> torch.Tensor:
        kernels = importlib.import_module("hugerec.ops.gpu.dot_interaction_kernels")
        rest_c = rest.detach().contiguous()
        first_c = rest_c.new_empty(0, rest.shape[2]) if first is None else first.detach().contiguous()
        n = rest.shape[1] + (first is not None)
        out = torch.empty(rest.shape[0], num_pairs(n, self_interaction), dtype=rest.dtype, device=rest.device)
        kernels.dot_forward(first_c, rest_c, self_interaction, out)
        ctx.save_for_backward(first_c, rest_c)
        ctx.has_first = first is not None
        ctx.self_interaction = self_interaction
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        kernels = importlib.import_module("hugerec.ops.gpu.dot_interaction_kernels")
        first, rest = ctx.saved_tensors
        grad_rest = torch.empty_like(rest)
        grad_first = torch.empty_like(first)
        kernels.dot_backward(grad.contiguous(), first, rest, ctx.self_interaction, grad_first, grad_rest)
        return (grad_first if ctx.has_first else None), grad_rest, None
