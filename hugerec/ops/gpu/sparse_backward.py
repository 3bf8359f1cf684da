"""Triton kernels of the fused backward (spec: `hugerec.ops.reference.sparse_backward`).

No dense gradient, no [N, D] gradient either, and no host round trip:

1. `_occurrences_kernel`, one program per (OCCURRENCE_BAGS bags, plan line), the i-th id of each of
   its bags at once (a program per bag waits on its loads with little in flight): each id with a row
   becomes an occurrence
   (its row in the group buffer, where its output gradient starts, its scale: per-sample weight and
   1 / bag size for MEAN, its table); ids without a row and ids of features the plan does not serve
   get the row NO_ROW, which sorts last.
2. a stable sort of the occurrences by row (torch.sort, CUB's radix sort), so a row's occurrences
   are consecutive and in id order; segment starts come from comparing neighbours, and
   seg_first[s] = first occurrence of the s-th distinct row, all without reading a size back.
3. `_update_kernel`, one program per BLOCK_S possible segments (programs past the last one return):
   the segments' gradients summed in fp32 (segments of at most SHORT_SEGMENT occurrences side by
   side, one occurrence of each per step; longer ones, the hot rows, one segment at a time in tiles
   of BLOCK_K occurrences), weight decay added, then the rule applied to the rows and their
   optimizer state in place as one [BLOCK_S, BLOCK_D] tile. Each row is one segment of one program,
   so no two programs write one row and no atomics are needed; the sum order is fixed (deterministic).

fp16 / bf16 rows are rounded stochastically when written (`STOCHASTIC`, on by default): the fp32
result's bit pattern gets uniform random bits added below the storage precision, then is cut to it,
so the stored value is the fp32 one in expectation. Round-to-nearest would drop every update smaller
than half a unit in the last place (a bf16 row of 1.0 ignores steps below 0.004). No fp32 master copy
is kept: the rows, state dict and checkpoints stay those of the CPU kernels. The optimizer state is
fp32 either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hugerec.ops.gpu.lookup_kernels import DTYPE_CODE, LINES, row_pointer
from hugerec.ops.update_rule import UpdateRule
from hugerec.ops.workspace import Workspace

NO_ROW = torch.iinfo(torch.int64).max  # the row of an occurrence that updates nothing (sorts last)
FP32_TINY = float(torch.finfo(torch.float32).tiny)
OCCURRENCE_BAGS = 128  # bags per program of the occurrences kernel
SHORT_SEGMENT = 8  # segments of at most this many occurrences are summed side by side, longer ones one by one
STOCHASTIC = True  # stochastic rounding of fp16 / bf16 rows (module docstring); False: round to nearest


@triton.jit
def _occurrences_kernel(
    lines,
    values,
    offsets,
    per_sample_weights,
    rows,
    grad_at,
    scale,
    tables,
    batch,
    grad_stride,
    WEIGHTED: tl.constexpr,
    SEQUENCE: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    line = lines + tl.program_id(1) * 10
    feature = tl.load(line + 0)
    table = tl.load(line + 1)
    row_offset = tl.load(line + 2)
    num_rows = tl.load(line + 3)
    column = tl.load(line + 4)
    mean = tl.load(line + 5)
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = b < batch
    bag = feature * batch + b
    start = tl.load(offsets + bag, mask=in_batch, other=0)
    end = tl.load(offsets + bag + 1, mask=in_batch, other=0)
    longest = tl.max(end - start, axis=0)
    feature_start = tl.load(offsets + feature * batch)
    count = tl.zeros([BLOCK_B], dtype=tl.int32)
    if mean != 0 and not SEQUENCE:
        for i in range(0, longest):
            idx = start + i
            v = tl.load(values + idx, mask=idx < end, other=-1)
            count += ((idx < end) & (v >= 0) & (v < num_rows)).to(tl.int32)
    inverse = 1.0 / tl.maximum(count, 1).to(tl.float32)
    bag_at = b.to(tl.int64) * grad_stride + column  # int64: B x width can pass 2**31
    for i in range(0, longest):  # the i-th id of every bag at once
        idx = start + i
        live = idx < end
        v = tl.load(values + idx, mask=live, other=-1)
        ok = live & (v >= 0) & (v < num_rows)
        tl.store(rows + idx, tl.where(ok, v + row_offset, 0x7FFFFFFFFFFFFFFF), mask=live)
        if SEQUENCE:
            tl.store(grad_at + idx, (column + idx - feature_start) * grad_stride, mask=live)
            sc = tl.full([BLOCK_B], 1.0, dtype=tl.float32)
        else:
            tl.store(grad_at + idx, bag_at, mask=live)
            sc = inverse
            if WEIGHTED:
                sc = sc * tl.load(per_sample_weights + idx, mask=live, other=0.0)
        tl.store(scale + idx, sc, mask=live)
        tl.store(tables + idx, (table + idx * 0).to(tl.int32), mask=live)


@triton.jit
def _store_row(pointer, x, mask, seed, offsets, DTYPE: tl.constexpr, STOCHASTIC: tl.constexpr):
    """Store fp32 x into rows of storage DTYPE (0 fp32, 1 bf16, 2 fp16), rounded stochastically when asked."""
    if DTYPE == 0:
        tl.store(pointer, x, mask=mask)
    elif STOCHASTIC:
        noise = tl.randint(seed, offsets).to(tl.uint32)
        bits = x.to(tl.uint32, bitcast=True)
        if DTYPE == 1:  # bf16 keeps the top 16 bits of an fp32
            cut = (bits + (noise & 0xFFFF)) & 0xFFFF0000
            tl.store(pointer, cut.to(tl.float32, bitcast=True).to(tl.bfloat16), mask=mask)
        else:  # fp16 keeps 10 of fp32's 23 mantissa bits (normal range; subnormals round to nearest below)
            cut = (bits + (noise & 0x1FFF)) & 0xFFFFE000
            tl.store(pointer, cut.to(tl.float32, bitcast=True).to(tl.float16), mask=mask)
    else:
        tl.store(pointer, x.to(pointer.dtype.element_ty), mask=mask)


@triton.jit
def _update_kernel(
    sorted_rows,
    order,
    grad_at,
    scale,
    tables,
    seg_first,
    grad,
    weight_address,
    state,
    lrs,
    n,
    weight_stride,
    state_stride,
    dim,
    eps,
    beta1,
    beta2,
    decay,
    l1,
    l2,
    beta,
    power,
    seed,
    KIND: tl.constexpr,
    DTYPE: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    SHORT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    base = tl.program_id(0) * BLOCK_S
    lanes = tl.arange(0, BLOCK_S)
    seg = base + lanes
    first = tl.load(seg_first + seg, mask=seg < n, other=n)
    row = tl.load(sorted_rows + first, mask=first < n, other=0x7FFFFFFFFFFFFFFF)
    active = (first < n) & (row != 0x7FFFFFFFFFFFFFFF)
    row = tl.where(active, row, 0)  # idle lanes aim at row 0, masked
    if tl.max(active.to(tl.int32), axis=0) > 0:
        last = tl.load(seg_first + seg + 1, mask=active, other=0)
        length = tl.where(active, last - first, 0)
        cols = tl.arange(0, BLOCK_D)
        in_dim = cols < dim
        tile = active[:, None] & in_dim[None, :]
        # short segments: the j-th occurrence of each at once, [BLOCK_S, BLOCK_D] per step
        short = length <= SHORT
        g = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
        for j in range(0, tl.max(tl.where(short, length, 0), axis=0)):
            live = short & (j < length)
            o = tl.load(order + first + j, mask=live, other=0)
            at = tl.load(grad_at + o, mask=live, other=0)
            sc = tl.load(scale + o, mask=live, other=0.0)
            x = tl.load(grad + at[:, None] + cols[None, :], mask=live[:, None] & in_dim[None, :], other=0.0)
            g += x * sc[:, None]
        # long segments (hot rows): one at a time, BLOCK_K occurrences per step
        if tl.max((active & ~short).to(tl.int32), axis=0) > 0:
            for t in range(0, BLOCK_S):
                f = tl.load(seg_first + base + t, mask=base + t < n, other=n)
                e = tl.load(seg_first + base + t + 1, mask=base + t < n, other=n)
                r_t = tl.load(sorted_rows + f, mask=f < n, other=0x7FFFFFFFFFFFFFFF)
                if (e - f > SHORT) & (r_t != 0x7FFFFFFFFFFFFFFF):
                    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
                    for k0 in range(f, e, BLOCK_K):
                        k = k0 + tl.arange(0, BLOCK_K)
                        live_k = k < e
                        o = tl.load(order + k, mask=live_k, other=0)
                        at = tl.load(grad_at + o, mask=live_k, other=0)
                        sc = tl.load(scale + o, mask=live_k, other=0.0)
                        x = tl.load(
                            grad + at[:, None] + cols[None, :], mask=live_k[:, None] & in_dim[None, :], other=0.0
                        )
                        acc += tl.sum(x * sc[:, None], axis=0)
                    g = tl.where((lanes == t)[:, None], acc[None, :], g)
        lr = tl.load(lrs + tl.load(tables + tl.load(order + first, mask=active, other=0), mask=active, other=0))
        lr = tl.where(active, lr.to(tl.float32), 1.0)[:, None]
        weight = row_pointer(weight_address, DTYPE)
        w_ptr = weight + row[:, None] * weight_stride + cols[None, :]
        w = tl.load(w_ptr, mask=tile, other=0.0).to(tl.float32)
        if decay != 0.0:
            g += decay * w
        st = state + row * state_stride  # [BLOCK_S] row starts of the optimizer state
        st2 = st[:, None] + cols[None, :]
        if KIND == 0:  # SGD
            new = w - lr * g
        elif KIND == 1:  # Adagrad: s += g^2
            acc2 = tl.load(st2, mask=tile, other=0.0) + g * g
            tl.store(st2, acc2, mask=tile)
            new = w - lr * g / (tl.sqrt(acc2) + eps)
        elif KIND == 2:  # row-wise Adagrad: s += mean(g^2)
            acc1 = tl.load(st, mask=active, other=0.0) + tl.sum(tl.where(tile, g * g, 0.0), axis=1) / dim
            tl.store(st, acc1, mask=active)
            acc1 = tl.where(active, acc1, 1.0)  # idle lanes: no 0 / 0 when eps = 0
            new = w - (lr / (tl.sqrt(acc1) + eps)[:, None]) * g
        elif KIND == 3:  # Adam without bias correction (folded into lr by the caller)
            m = tl.load(st2, mask=tile, other=0.0)
            v = tl.load(st2 + dim, mask=tile, other=0.0)
            m = m + (g - m) * (1.0 - beta1)
            v = v + (g * g - v) * (1.0 - beta2)
            tl.store(st2, m, mask=tile)
            tl.store(st2 + dim, v, mask=tile)
            new = w - lr * (m / (tl.sqrt(v) + eps))
        else:  # FTRL-proximal, state z [0:D], n [D:2D]
            z = tl.load(st2, mask=tile, other=0.0)
            acc_n = tl.load(st2 + dim, mask=tile, other=0.0)
            n_new = acc_n + g * g
            p = -power
            if p == 0.5:
                n_pow = tl.sqrt(n_new)
                n_old_pow = tl.sqrt(acc_n)
            else:  # x^p = exp(p log x); 0^p = 0 for p > 0
                n_pow = tl.where(n_new > 0, tl.exp(p * tl.log(tl.maximum(n_new, 1e-30))), 0.0)
                n_old_pow = tl.where(acc_n > 0, tl.exp(p * tl.log(tl.maximum(acc_n, 1e-30))), 0.0)
                if p == 0.0:
                    n_pow = tl.full([BLOCK_S, BLOCK_D], 1.0, dtype=tl.float32)
                    n_old_pow = tl.full([BLOCK_S, BLOCK_D], 1.0, dtype=tl.float32)
            z = z + g - (n_pow - n_old_pow) / lr * w
            tl.store(st2, z, mask=tile)
            tl.store(st2 + dim, n_new, mask=tile)
            shrunk = (tl.where(z >= 0, l1, -l1) - z) / ((beta + n_pow) / lr + 2.0 * l2)
            new = tl.where(tl.abs(z) <= l1, 0.0, shrunk)
        noise_at = (row[:, None] * dim + cols[None, :]).to(tl.int32)
        _store_row(w_ptr, new, tile, seed, noise_at, DTYPE, STOCHASTIC)


def sparse_backward(
    weight: torch.Tensor,
    state: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    sequence: bool,
    grad: torch.Tensor,
    rule: UpdateRule,
    lrs: torch.Tensor,
    workspace: Workspace,
) -> None:
    n = values.shape[0]
    if n == 0 or plan.shape[0] == 0 or batch_size == 0:
        return
    device = weight.device
    lines = LINES.get([weight], [plan], [dim])
    grad = grad.detach().to(torch.float32).contiguous()
    rows = torch.full((n,), NO_ROW, dtype=torch.int64, device=device)
    grad_at = torch.empty(n, dtype=torch.int64, device=device)
    scale = torch.empty(n, dtype=torch.float32, device=device)
    tables = torch.empty(n, dtype=torch.int32, device=device)
    _occurrences_kernel[(triton.cdiv(batch_size, OCCURRENCE_BAGS), plan.shape[0])](
        lines,
        values,
        offsets,
        values if per_sample_weights is None else per_sample_weights,
        rows,
        grad_at,
        scale,
        tables,
        batch_size,
        grad.stride(0),
        WEIGHTED=per_sample_weights is not None and not sequence,
        SEQUENCE=sequence,
        BLOCK_B=OCCURRENCE_BAGS,
        num_warps=4,
    )
    sorted_rows, order = torch.sort(rows, stable=True)
    starts = torch.ones(n, dtype=torch.int64, device=device)
    starts[1:] = (sorted_rows[1:] != sorted_rows[:-1]).to(torch.int64)
    segment = torch.cumsum(starts, 0) - 1  # [n]: the distinct row (segment) of each sorted occurrence
    # seg_first[s] = first occurrence of segment s: each segment's start writes its own slot, every other
    # occurrence writes the spare slot n + 1 (a plain scatter, no atomic minimum; seg_first[n] stays n)
    seg_first = torch.full((n + 2,), n, dtype=torch.int64, device=device)
    seg_first.index_put_((torch.where(starts.bool(), segment, n + 1),), torch.arange(n, device=device))
    bd = max(16, triton.next_power_of_2(dim))
    block_s = max(1, min(32, 2048 // bd))
    # the kernel computes in fp32: hyper-parameters below fp32's smallest normal number are 0 there (the
    # interpreter would otherwise take such a Python float as an fp64 constant)
    hp = [0.0 if abs(v) < FP32_TINY else v for v in rule.hparams().tolist()]
    _update_kernel[(triton.cdiv(n, block_s),)](
        sorted_rows,
        order,
        grad_at,
        scale,
        tables,
        seg_first,
        grad,
        weight.data_ptr(),
        state if state.numel() else weight,
        lrs.to(device=device, dtype=torch.float32, non_blocking=True),
        n,
        weight.stride(0),
        state.stride(0) if state.numel() else 0,
        dim,
        *hp,
        workspace.next_seed(),
        KIND=int(rule.kind),
        DTYPE=DTYPE_CODE[weight.dtype],
        STOCHASTIC=STOCHASTIC,
        SHORT=SHORT_SEGMENT,
        BLOCK_S=block_s,
        BLOCK_K=max(1, min(16, 4096 // bd)),
        BLOCK_D=bd,
        num_warps=4,
    )
