"""HSTU's jagged causal attention with autograd: Numba kernels on the CPU in fp32, the torch reference elsewhere.

    pairs = pair_offsets(offsets)                                   # [B + 1]
    out = jagged_causal_attention(q, k, v, bias, offsets, scale)    # q, k [N, H, Dq], v [N, H, Dv], bias [P] -> [N, H, Dv]

out_i = sum_{j <= i} silu(q_i . k_j + bias_ij) * scale * v_j inside each sequence (pointwise SiLU
attention: no softmax, so nothing is normalised over the keys). `pair_positions(offsets)` gives each
pair's absolute query and key rows, from which a caller builds `bias` (HSTU: relative position and time
buckets; see `hugerec.models.hstu`). The kernels are `hugerec.ops.cpu.jagged_attention_kernels`; a call
with less than SERIAL_WORK multiply-adds (one serving history) runs them on the calling thread only.
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


def pair_positions(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([P] query rows, [P] key rows) of every causal pair, in the layout of `bias`."""
    pairs = pair_offsets(offsets)
    num = int(pairs[-1])
    if offsets.device.type == "cpu":
        query = torch.empty(num, dtype=torch.int64)
        key = torch.empty(num, dtype=torch.int64)
        _cpu.pair_positions(offsets.numpy(), pairs.numpy(), query.numpy(), key.numpy())
        return query, key
    n = offsets.diff()
    seq = torch.repeat_interleave(torch.arange(len(n), device=offsets.device), pairs.diff())
    p = torch.arange(num, device=offsets.device) - pairs[:-1][seq]
    i = ((torch.sqrt(8.0 * p.double() + 1.0) - 1.0) / 2.0).floor().long()
    return offsets[:-1][seq] + i, offsets[:-1][seq] + p - i * (i + 1) // 2


class _JaggedCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, offsets: torch.Tensor, pairs: torch.Tensor, scale: float
    ) -> torch.Tensor:
        q_c, k_c, v_c, b_c = (t.detach().contiguous() for t in (q, k, v, bias))
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float32)
        before = numba.get_num_threads()
        numba.set_num_threads(_threads(pairs, q, v))  # the calling thread's setting only
        try:
            _cpu.attention_forward(q_c.numpy(), k_c.numpy(), v_c.numpy(), b_c.numpy(), offsets.numpy(), pairs.numpy(), float(scale), out.numpy())
        finally:
            numba.set_num_threads(before)
        ctx.save_for_backward(q_c, k_c, v_c, b_c, offsets, pairs)
        ctx.scale = float(scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, None, None, None]:
        q, k, v, bias, offsets, pairs = ctx.saved_tensors
        grad_q, grad_k, grad_v, grad_bias = (torch.empty_like(t) for t in (q, k, v, bias))
        before = numba.get_num_threads()
        numba.set_num_threads(_threads(pairs, q, v))
        try:
            _cpu.attention_backward(
                grad.detach().contiguous().numpy(), q.numpy(), k.numpy(), v.numpy(), bias.numpy(), offsets.numpy(), pairs.numpy(), ctx.scale,
                grad_q.numpy(), grad_k.numpy(), grad_v.numpy(), grad_bias.numpy(),
            )
        finally:
            numba.set_num_threads(before)
        return grad_q, grad_k, grad_v, grad_bias, None, None, None
