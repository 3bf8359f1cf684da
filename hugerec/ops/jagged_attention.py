"""HSTU's jagged causal attention with autograd: Numba kernels on the CPU in fp32, the torch reference elsewhere.

    pairs = pair_offsets(offsets)                                   # [B + 1]
    out = jagged_causal_attention(q, k, v, bias, offsets, scale)    # q, k [N, H, Dq], v [N, H, Dv], bias [P] -> [N, H, Dv]

out_i = sum_{j <= i} silu(q_i . k_j + bias_ij) * scale * v_j inside each sequence (pointwise SiLU
attention: no softmax, so nothing is normalised over the keys). `relative_bias(table, offsets)` builds a
bias from a table by relative position i - j (HSTU's positional bias) without forming any [P] index;
`pair_positions(offsets)` gives each pair's absolute query and key rows, from which a caller builds
other biases (HSTU's time buckets; see `hugerec.models.hstu`). The kernels are
`hugerec.ops.cpu.jagged_attention_kernels`; a call with less than SERIAL_WORK multiply-adds (one
serving history) runs them on the calling thread only.
"""

from __future__ import annotations

from typing import Any

import numba
import torch

from hugerec.ops import reference
from hugerec.ops.cpu import jagged_attention_kernels as _cpu

pair_offsets = reference.pair_offsets
SERIAL_WORK = 1 << 22  # multiply-adds below which the kernels run on the calling thread (a parallel region costs more)


def _threads(pairs: torch.Tensor, q: torch.Tensor, v: torch.Tensor) -> int:
    work = int(pairs[-1]) * q.shape[1] * (q.shape[2] + v.shape[2])
    return 1 if work < SERIAL_WORK else numba.get_num_threads()


def kernel_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> bool:
    """The Numba path: fp32 CPU tensors, eager (not compiled, exported or traced)."""
    return (
        all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v, bias))
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Raise a ValueError naming the bad shape; return pair_offsets(offsets)."""
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"jagged_causal_attention: q, k must be [N, H, Dq] and v [N, H, Dv], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if offsets.dim() != 1 or len(offsets) < 1 or offsets.dtype != torch.int64:
        raise ValueError(f"jagged_causal_attention: offsets must be [B + 1] int64, got {tuple(offsets.shape)} {offsets.dtype}")
    if int(offsets[0]) != 0 or int(offsets[-1]) != q.shape[0] or bool((offsets.diff() < 0).any()):
        raise ValueError(f"jagged_causal_attention: offsets must run from 0 to N = {q.shape[0]} without decreasing, got {offsets[0]}..{offsets[-1]}")
    pairs = pair_offsets(offsets)
    if bias.dim() != 1 or bias.numel() != int(pairs[-1]):
        raise ValueError(f"jagged_causal_attention: bias must be [P] = [{int(pairs[-1])}] (the causal pairs), got {tuple(bias.shape)}")
    return pairs


def jagged_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, scale: float
) -> torch.Tensor:
    """See the module docstring; the spec is `hugerec.ops.reference.jagged_causal_attention`."""
    pairs = check_shapes(q, k, v, bias, offsets)
    if not kernel_applies(q, k, v, bias):
        return reference.jagged_causal_attention(q, k, v, bias, offsets, scale)
    out: torch.Tensor = _JaggedCausalAttention.apply(q, k, v, bias, offsets, pairs, scale)
    return out


def relative_bias(table: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """table [T] (T >= 1) at every causal pair's distance i - j, capped at T - 1 -> [P], the layout of `bias`;
    differentiable in table. The spec is `hugerec.ops.reference.relative_bias`; on the CPU in fp32 Numba
    kernels write it row by row (no [P] index arrays) and sum its gradient by distance."""
    if table.dim() != 1 or table.shape[0] < 1:
        raise ValueError(f"relative_bias: table must be [T] with T >= 1, got {tuple(table.shape)}")
    if offsets.dim() != 1 or len(offsets) < 1 or offsets.dtype != torch.int64:
        raise ValueError(f"relative_bias: offsets must be [B + 1] int64, got {tuple(offsets.shape)} {offsets.dtype}")
    if table.device.type != "cpu" or table.dtype != torch.float32 or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return reference.relative_bias(table, offsets)
    out: torch.Tensor = _RelativeBias.apply(table, offsets, pair_offsets(offsets))
    return out


class _RelativeBias(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, table: torch.Tensor, offsets: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        out = torch.empty(int(pairs[-1]), dtype=torch.float32)
        _cpu.relative_bias_forward(table.detach().contiguous().numpy(), offsets.numpy(), pairs.numpy(), out.numpy())
        ctx.save_for_backward(offsets, pairs)
        ctx.size = table.shape[0]
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        offsets, pairs = ctx.saved_tensors
        partial = torch.empty(max(1, min(numba.get_num_threads(), len(offsets) - 1)), ctx.size, dtype=torch.float64)
        _cpu.relative_bias_backward(grad.detach().contiguous().numpy(), offsets.numpy(), pairs.numpy(), partial.numpy())
        return partial.sum(0).to(torch.float32), None, None


def log_time_buckets(times: torch.Tensor, offsets: torch.Tensor, width: float, cap: int) -> torch.Tensor:
    """times [N] int64 (the jagged rows' seconds) -> [P] int64, the layout of `bias`: every causal pair's
    min(floor(ln(max(|t_i - t_j|, 1)) / width), cap) (HSTU's time buckets). The spec is
    `hugerec.ops.reference.log_time_buckets`; on the CPU one Numba pass over the pairs (no [P] row indices)."""
    if times.dim() != 1 or offsets.dim() != 1 or times.dtype != torch.int64 or offsets.dtype != torch.int64:
        raise ValueError(f"log_time_buckets: times [N] and offsets [B + 1] must be int64, got {times.dtype} {tuple(times.shape)}, {offsets.dtype} {tuple(offsets.shape)}")
    if len(offsets) < 1 or int(offsets[-1]) != len(times):
        raise ValueError(f"log_time_buckets: offsets end at {int(offsets[-1]) if len(offsets) else None}, times has {len(times)} rows")
    if times.device.type != "cpu" or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return reference.log_time_buckets(times, offsets, width, cap)
    pairs = pair_offsets(offsets)
    out = torch.empty(int(pairs[-1]), dtype=torch.int64)
    _cpu.log_time_buckets(times.contiguous().numpy(), offsets.numpy(), pairs.numpy(), float(width), int(cap), out.numpy())
    return out


def pair_positions(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([P] query rows, [P] key rows) of every causal pair, in the layout of `bias`."""
    pairs = pair_offsets(offsets)
    num = int(pairs[-1])
    if offsets.device.type == "cpu":
        query = torch.empty(num, dtype=torch.int64)
        key = torch.empty(num, dtype=torch.int64)
        _cpu.pair_positions(offsets.numpy(), pairs.numpy(), query.numpy(), key.numpy())
        return query, key
    seq, i, j = reference.pair_coordinates(offsets)
    return offsets[:-1][seq] + i, offsets[:-1][seq] + j


class _JaggedCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, pairs: torch.Tensor, scale: float
    ) -> torch.Tensor:
        q_c, k_c, v_c, b_c = (t.detach().contiguous() for t in (q, k, v, bias))
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float32)
        # the scaled SiLU and its derivative of every pair and head, [H, P] each, kept only for a backward
        kept = (q.shape[1], int(pairs[-1])) if any(ctx.needs_input_grad[:4]) else (0, 0)
        saved_a, saved_ds = torch.empty(kept), torch.empty(kept)
        before = numba.get_num_threads()
        numba.set_num_threads(_threads(pairs, q, v))  # the calling thread's setting only
        try:
            _cpu.attention_forward(
                q_c.numpy(), k_c.numpy(), v_c.numpy(), b_c.numpy(), offsets.numpy(), pairs.numpy(), float(scale), out.numpy(),
                saved_a.numpy(), saved_ds.numpy(),
            )
        finally:
            numba.set_num_threads(before)
        ctx.save_for_backward(q_c, k_c, v_c, saved_a, saved_ds, offsets, pairs)
        ctx.bias_shape = bias.shape
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        q, k, v, saved_a, saved_ds, offsets, pairs = ctx.saved_tensors
        grad_q, grad_k, grad_v = (torch.empty_like(t) for t in (q, k, v))
        grad_bias = torch.empty(ctx.bias_shape, dtype=torch.float32)
        before = numba.get_num_threads()
        numba.set_num_threads(_threads(pairs, q, v))
        try:
            _cpu.attention_backward(
                grad.detach().contiguous().numpy(), q.numpy(), k.numpy(), v.numpy(), saved_a.numpy(), saved_ds.numpy(), offsets.numpy(),
                pairs.numpy(), grad_q.numpy(), grad_k.numpy(), grad_v.numpy(), grad_bias.numpy(),
            )
        finally:
            numba.set_num_threads(before)
        return grad_q, grad_k, grad_v, grad_bias, None, None, None
