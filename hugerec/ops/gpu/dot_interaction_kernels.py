"""Triton kernels of DLRM's dot interaction (spec: `hugerec.ops.reference.dot_interaction`).

Same contract and pair order as `hugerec.ops.cpu.dot_interaction_kernels`: the N = F (+ 1) vectors of
example b are `first[b]` (optional) then `rest[b, 0..F-1]`; output column p is the dot of the p-th
pair (i, j), i < j (i <= j with self-interaction), row-major over the upper triangle.

One program per example: its [N, D] vectors are loaded once into a [BLOCK_N, BLOCK_D] tile (padding
zero), the Gram matrix X X^T comes from one tl.dot in fp32 (IEEE, not TF32: these products are tiny
and the reference is exact fp32), and only the triangle's pairs are stored. The backward builds the
symmetric [N, N] matrix S of the pairs' gradients (diagonal doubled by S + S^T for self-interaction)
and computes grad X = S X with one more tl.dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _pair_index(i, j, n, SELF: tl.constexpr):
    """Column of pair (i, j) in the output, and whether (i, j) is a pair at all."""
    if SELF:
        valid = (i <= j) & (j < n)
        p = i * n - (i * (i - 1)) // 2 + (j - i)
    else:
        valid = (i < j) & (j < n)
        p = i * n - (i * (i + 1)) // 2 + (j - i - 1)
    return p, valid


@triton.jit
def _load_vectors(first, rest, b, num_rest, dim, LEAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """[BLOCK_N, BLOCK_D] fp32: row i = first[b] for i < LEAD, else rest[b, i - LEAD]; zeros beyond."""
    i = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    in_dim = d < dim
    r = i - LEAD
    x = tl.load(
        rest + (b * num_rest + r)[:, None] * dim + d[None, :],
        mask=((r >= 0) & (r < num_rest))[:, None] & in_dim[None, :],
        other=0.0,
    ).to(tl.float32)
    if LEAD:
        head = tl.load(
            first + b * dim + i[:, None] * 0 + d[None, :], mask=(i < 1)[:, None] & in_dim[None, :], other=0.0
        )
        x += head.to(tl.float32)
    return x


@triton.jit
def _dot_forward_kernel(
    first,
    rest,
    out,
    num_rest,
    dim,
    pairs,
    LEAD: tl.constexpr,
    SELF: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    x = _load_vectors(first, rest, b, num_rest, dim, LEAD, BLOCK_N, BLOCK_D)
    gram = tl.dot(x, tl.trans(x), input_precision="ieee")  # [BLOCK_N, BLOCK_N]
    i = tl.arange(0, BLOCK_N)[:, None]
    j = tl.arange(0, BLOCK_N)[None, :]
    p, valid = _pair_index(i, j, num_rest + LEAD, SELF)
    tl.store(out + b * pairs + p, gram.to(out.dtype.element_ty), mask=valid)


@triton.jit
def _dot_backward_kernel(
    grad,
    first,
    rest,
    grad_first,
    grad_rest,
    num_rest,
    dim,
    pairs,
    LEAD: tl.constexpr,
    SELF: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    x = _load_vectors(first, rest, b, num_rest, dim, LEAD, BLOCK_N, BLOCK_D)
    i = tl.arange(0, BLOCK_N)[:, None]
    j = tl.arange(0, BLOCK_N)[None, :]
    p, valid = _pair_index(i, j, num_rest + LEAD, SELF)
    g = tl.load(grad + b * pairs + p, mask=valid, other=0.0).to(tl.float32)  # upper triangle
    s = g + tl.trans(g)  # d(x_i . x_j) reaches both vectors; the diagonal's 2 x_i comes out doubled
    gx = tl.dot(s, x, input_precision="ieee")  # [BLOCK_N, BLOCK_D]
    rows = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    in_dim = d < dim
    r = rows - LEAD
    tl.store(
        grad_rest + (b * num_rest + r)[:, None] * dim + d[None, :],
        gx.to(grad_rest.dtype.element_ty),
        mask=((r >= 0) & (r < num_rest))[:, None] & in_dim[None, :],
    )
    if LEAD:
        tl.store(
            grad_first + b * dim + rows[:, None] * 0 + d[None, :],
            gx.to(grad_first.dtype.element_ty),
            mask=(rows < 1)[:, None] & in_dim[None, :],
        )


def _blocks(n: int, dim: int) -> tuple[int, int]:
    return max(16, triton.next_power_of_2(n)), max(16, triton.next_power_of_2(dim))


def dot_forward(first: torch.Tensor, rest: torch.Tensor, self_interaction: bool, out: torch.Tensor) -> None:
    """out [B, P] = the pairs' dots; first [B, D] or [0, D] (absent), rest [B, F, D] (contiguous)."""
    batch, num_rest, dim = rest.shape
    lead = 1 if first.shape[0] > 0 else 0
    if batch == 0:
        return
    block_n, block_d = _blocks(num_rest + lead, dim)
    _dot_forward_kernel[(batch,)](
        first if lead else rest,
        rest,
        out,
        num_rest,
        dim,
        out.shape[1],
        LEAD=lead,
        SELF=self_interaction,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        num_warps=4,
    )


def dot_backward(
    grad: torch.Tensor,
    first: torch.Tensor,
    rest: torch.Tensor,
    self_interaction: bool,
    grad_first: torch.Tensor,
    grad_rest: torch.Tensor,
) -> None:
    """grad [B, P] of the output -> grad_first [B, D] (or [0, D]) and grad_rest [B, F, D] (written)."""
    batch, num_rest, dim = rest.shape
    lead = 1 if first.shape[0] > 0 else 0
    if batch == 0:
        return
    block_n, block_d = _blocks(num_rest + lead, dim)
    _dot_backward_kernel[(batch,)](
        grad,
        first if lead else rest,
        rest,
        grad_first if lead else grad_rest,
        grad_rest,
        num_rest,
        dim,
        grad.shape[1],
        LEAD=lead,
        SELF=self_interaction,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        num_warps=4,
    )
