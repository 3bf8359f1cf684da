"""Triton kernels of the fused backward (spec: `hugerec.ops.reference.sparse_backward`).

No dense gradient, no [N, D] gradient either, and no host round trip:

1. `_occurrences_kernel`, one program per (bag, plan line): each id with a row becomes an occurrence
   (its row in the group buffer, where its output gradient starts, its scale: per-sample weight and
   1 / bag size for MEAN, its table); ids without a row and ids of features the plan does not serve
   get the row NO_ROW, which sorts last.
2. a stable sort of the occurrences by row (torch.sort, CUB's radix sort), so a row's occurrences
   are consecutive and in id order; segment starts come from comparing neighbours, and
   seg_first[s] = first occurrence of the s-th distinct row, all without reading a size back.
3. the segments' gradients summed in fp32, weight decay added, then the rule applied to the rows and
   their optimizer state in place (`_apply_rule`), by two kernels over disjoint segments:
   `_update_kernel` takes segments of at most SHORT_SEGMENT occurrences, BLOCK_S of them per program
   side by side as one [BLOCK_S, BLOCK_D] tile, one occurrence of each per step (a program per
   segment waits on a chain of dependent loads with little in flight); `_hot_update_kernel` gives
   each longer segment (a hot row) a program of its own that sums it in tiles of BLOCK_K
   occurrences, so hot rows proceed in parallel. Each row is one segment of one program, so no two
   programs write one row and no atomics are needed; the sum order is fixed (deterministic).

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
SHORT_SEGMENT = 8  # segments of at most this many occurrences are summed side by side, longer ones by a program each
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
    BLOCK_L: tl.constexpr,
):
    b = tl.program_id(0)
    line = lines + tl.program_id(1) * 10
    feature = tl.load(line + 0)
    table = tl.load(line + 1)
    row_offset = tl.load(line + 2)
    num_rows = tl.load(line + 3)
    column = tl.load(line + 4)
    mean = tl.load(line + 5)
    bag = feature * batch + b
    start = tl.load(offsets + bag)
    end = tl.load(offsets + bag + 1)
    feature_start = tl.load(offsets + feature * batch)
    lanes = tl.arange(0, BLOCK_L)
    count = tl.zeros([BLOCK_L], dtype=tl.int32)
    if mean != 0 and not SEQUENCE:
        for i0 in range(start, end, BLOCK_L):
            idx = i0 + lanes
            v = tl.load(values + idx, mask=idx < end, other=-1)
            count += ((idx < end) & (v >= 0) & (v < num_rows)).to(tl.int32)
    inverse = 1.0 / tl.maximum(tl.sum(count, axis=0), 1).to(tl.float32)
    for i0 in range(start, end, BLOCK_L):
        idx = i0 + lanes
        live = idx < end
        v = tl.load(values + idx, mask=live, other=-1)
        ok = live & (v >= 0) & (v < num_rows)
        tl.store(rows + idx, tl.where(ok, v + row_offset, 0x7FFFFFFFFFFFFFFF), mask=live)
        if SEQUENCE:
            tl.store(grad_at + idx, (column + idx - feature_start) * grad_stride, mask=live)
            s = tl.full([BLOCK_L], 1.0, dtype=tl.float32)
        else:
            tl.store(grad_at + idx, b * grad_stride + column + idx * 0, mask=live)
            s = tl.full([BLOCK_L], 1.0, dtype=tl.float32) * inverse
            if WEIGHTED:
                s = s * tl.load(per_sample_weights + idx, mask=live, other=0.0)
        tl.store(scale + idx, s, mask=live)
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
def _apply_rule(
    w, g, lr, st, st2, tile, active, dim, eps, beta1, beta2, l1, l2, beta, power, KIND: tl.constexpr, ROWS: tl.constexpr
):
    """The rule on rows w with summed gradients g (decay already added), updating the optimizer state in
    place; returns the new rows (fp32). ROWS: w, g, st2 and tile are [S, D] tiles of S rows, lr, st and active
    [S]; else one row: [D] vectors and scalars."""
    if ROWS:
        lr2 = lr[:, None]
    else:
        lr2 = lr
    if KIND == 0:  # SGD
        new = w - lr2 * g
    elif KIND == 1:  # Adagrad: s += g^2
        acc2 = tl.load(st2, mask=tile, other=0.0) + g * g
        tl.store(st2, acc2, mask=tile)
        new = w - lr2 * g / (tl.sqrt(acc2) + eps)
    elif KIND == 2:  # row-wise Adagrad: s += mean(g^2)
        if ROWS:
            acc1 = tl.load(st, mask=active, other=0.0) + tl.sum(tl.where(tile, g * g, 0.0), axis=1) / dim
            tl.store(st, acc1, mask=active)
            acc1 = tl.where(active, acc1, 1.0)  # idle lanes: no 0 / 0 when eps = 0
            new = w - (lr / (tl.sqrt(acc1) + eps))[:, None] * g
        else:
            acc0 = tl.load(st) + tl.sum(tl.where(tile, g * g, 0.0), axis=0) / dim
            tl.store(st, acc0)
            new = w - (lr / (tl.sqrt(acc0) + eps)) * g
    elif KIND == 3:  # Adam without bias correction (folded into lr by the caller)
        m = tl.load(st2, mask=tile, other=0.0)
        v = tl.load(st2 + dim, mask=tile, other=0.0)
        m = m + (g - m) * (1.0 - beta1)
        v = v + (g * g - v) * (1.0 - beta2)
        tl.store(st2, m, mask=tile)
        tl.store(st2 + dim, v, mask=tile)
        new = w - lr2 * (m / (tl.sqrt(v) + eps))
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
                n_pow = g * 0.0 + 1.0
                n_old_pow = g * 0.0 + 1.0
        z = z + g - (n_pow - n_old_pow) / lr2 * w
        tl.store(st2, z, mask=tile)
        tl.store(st2 + dim, n_new, mask=tile)
        shrunk = (tl.where(z >= 0, l1, -l1) - z) / ((beta + n_pow) / lr2 + 2.0 * l2)
        new = tl.where(tl.abs(z) <= l1, 0.0, shrunk)
    return new


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
    BLOCK_D: tl.constexpr,
):
    """Segments of at most SHORT occurrences, BLOCK_S of them side by side (longer ones: `_hot_update_kernel`)."""
    seg = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    first = tl.load(seg_first + seg, mask=seg < n, other=n)
    last = tl.load(seg_first + seg + 1, mask=first < n, other=n)
    row = tl.load(sorted_rows + first, mask=first < n, other=0x7FFFFFFFFFFFFFFF)
    length = last - first
    active = (first < n) & (row != 0x7FFFFFFFFFFFFFFF) & (length <= SHORT)
    if tl.max(active.to(tl.int32), axis=0) > 0:
        length = tl.where(active, length, 0)
        cols = tl.arange(0, BLOCK_D)
        in_dim = cols < dim
        tile = active[:, None] & in_dim[None, :]
        g = tl.zeros([BLOCK_S, BLOCK_D], dtype=tl.float32)
        for j in range(0, tl.max(length, axis=0)):  # the j-th occurrence of each segment at once
            live = j < length
            o = tl.load(order + first + j, mask=live, other=0)
            at = tl.load(grad_at + o, mask=live, other=0)
            sc = tl.load(scale + o, mask=live, other=0.0)
            x = tl.load(grad + at[:, None] + cols[None, :], mask=live[:, None] & in_dim[None, :], other=0.0)
            g += x * sc[:, None]
        table = tl.load(tables + tl.load(order + first, mask=active, other=0), mask=active, other=0)
        lr = tl.load(lrs + table, mask=active, other=1.0).to(tl.float32)
        weight = row_pointer(weight_address, DTYPE)
        w_ptr = weight + row[:, None] * weight_stride + cols[None, :]
        w = tl.load(w_ptr, mask=tile, other=0.0).to(tl.float32)
        if decay != 0.0:
            g += decay * w
        st = state + row * state_stride  # [BLOCK_S] row starts of the optimizer state
        st2 = st[:, None] + cols[None, :]
        new = _apply_rule(w, g, lr, st, st2, tile, active, dim, eps, beta1, beta2, l1, l2, beta, power, KIND, True)
        noise_at = (row[:, None] * dim + cols[None, :]).to(tl.int32)
        _store_row(w_ptr, new, tile, seed, noise_at, DTYPE, STOCHASTIC)


@triton.jit
def _hot_update_kernel(
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
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One program per possible segment; those of more than SHORT occurrences (hot rows) sum theirs in tiles
    of BLOCK_K and update their row, the others return at once."""
    first = tl.load(seg_first + tl.program_id(0))
    if first < n:
        last = tl.load(seg_first + tl.program_id(0) + 1)
        row = tl.load(sorted_rows + first)
        if (last - first > SHORT) & (row != 0x7FFFFFFFFFFFFFFF):
            cols = tl.arange(0, BLOCK_D)
            in_dim = cols < dim
            g = tl.zeros([BLOCK_D], dtype=tl.float32)
            for k0 in range(first, last, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                live = k < last
                o = tl.load(order + k, mask=live, other=0)
                at = tl.load(grad_at + o, mask=live, other=0)
                sc = tl.load(scale + o, mask=live, other=0.0)
                x = tl.load(grad + at[:, None] + cols[None, :], mask=live[:, None] & in_dim[None, :], other=0.0)
                g += tl.sum(x * sc[:, None], axis=0)
            lr = tl.load(lrs + tl.load(tables + tl.load(order + first))).to(tl.float32)
            weight = row_pointer(weight_address, DTYPE)
            w_ptr = weight + row * weight_stride + cols
            w = tl.load(w_ptr, mask=in_dim, other=0.0).to(tl.float32)
            if decay != 0.0:
                g += decay * w
            st = state + row * state_stride
            new = _apply_rule(
                w, g, lr, st, st + cols, in_dim, True, dim, eps, beta1, beta2, l1, l2, beta, power, KIND, False
            )
            _store_row(w_ptr, new, in_dim, seed, (row * dim + cols).to(tl.int32), DTYPE, STOCHASTIC)


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
    _occurrences_kernel[(batch_size, plan.shape[0])](
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
        BLOCK_L=4,
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
    args = (
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
        workspace.next_seed(),  # one seed: the two kernels write disjoint rows
    )
    kinds = {"KIND": int(rule.kind), "DTYPE": DTYPE_CODE[weight.dtype], "STOCHASTIC": STOCHASTIC}
    _update_kernel[(triton.cdiv(n, block_s),)](
        *args, **kinds, SHORT=SHORT_SEGMENT, BLOCK_S=block_s, BLOCK_D=bd, num_warps=4
    )
    _hot_update_kernel[(n,)](
        *args,
        **kinds,
        SHORT=SHORT_SEGMENT,
        BLOCK_K=max(1, min(16, 4096 // bd)),
        BLOCK_D=bd,
        num_warps=1 if bd <= 64 else 2 if bd <= 256 else 4,
    )
