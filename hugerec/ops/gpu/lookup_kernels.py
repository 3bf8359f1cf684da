"""Triton kernels of the fused lookups (specs: `hugerec.ops.reference.pooled_lookup` / `sequence_lookup`).

One launch serves every plan line it is given, and the lines may come from several table groups of
one storage dtype: each line carries its group's row buffer as an address, its row stride and its
dim (the *line table* below), so tables of mixed dims share a launch. The pooled kernel runs one
program per (bag, line): it walks the bag's ids in tiles of BLOCK_L ids x BLOCK_D columns, gathers
the rows (masked loads: invalid ids, -1 and padding lanes read nothing), scales them by the per-id
weights and sums in fp32; MEAN divides by the ids that had a row. The sequence kernel copies one row
per id, BLOCK_N ids per program. Invalid ids are counted into a device counter and skipped.

Line table, int64 [L, LINE_WIDTH]: the plan's seven columns (`hugerec.ops.lookup_plan`), then
    WEIGHT  address of the group's weight buffer [R, D_pad] (fp32 / bf16 / fp16 rows)
    STRIDE  its row stride in elements (D_pad)
    DIM     the group's dim D (columns [:D] are read)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from hugerec.ops.lookup_plan import WIDTH

WEIGHT, STRIDE, DIM = WIDTH, WIDTH + 1, WIDTH + 2
LINE_WIDTH = WIDTH + 3  # the kernels step through lines by this literal: 10
assert LINE_WIDTH == 10
DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
MAX_BLOCK_D = 256  # wider rows are read in chunks of this many columns


@triton.jit
def row_pointer(address, DTYPE: tl.constexpr):
    """The int64 address of a row buffer as a typed pointer (DTYPE: 0 fp32, 1 bf16, 2 fp16)."""
    if DTYPE == 0:
        p = address.to(tl.pointer_type(tl.float32))
    elif DTYPE == 1:
        p = address.to(tl.pointer_type(tl.bfloat16))
    else:
        p = address.to(tl.pointer_type(tl.float16))
    return p


@triton.jit
def _pooled_kernel(
    lines,
    values,
    offsets,
    per_sample_weights,
    out,
    invalid,
    batch,
    out_stride,
    DTYPE: tl.constexpr,
    WEIGHTED: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    line = lines + tl.program_id(1) * 10
    feature = tl.load(line + 0)
    row_offset = tl.load(line + 2)
    num_rows = tl.load(line + 3)
    column = tl.load(line + 4)
    mean = tl.load(line + 5)
    lowest = -tl.load(line + 6)  # -1 when id -1 means "no row", else 0
    weight = row_pointer(tl.load(line + 7), DTYPE)
    stride = tl.load(line + 8)
    dim = tl.load(line + 9)
    bag = feature * batch + b
    start = tl.load(offsets + bag)
    end = tl.load(offsets + bag + 1)
    lanes = tl.arange(0, BLOCK_L)
    for d0 in range(0, dim, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        in_dim = cols < dim
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        count = tl.zeros([BLOCK_L], dtype=tl.int32)
        bad = tl.zeros([BLOCK_L], dtype=tl.int32)
        for i0 in range(start, end, BLOCK_L):
            idx = i0 + lanes
            live = idx < end
            v = tl.load(values + idx, mask=live, other=0)
            ok = live & (v >= 0) & (v < num_rows)
            bad += (live & ((v < lowest) | (v >= num_rows))).to(tl.int32)
            count += ok.to(tl.int32)
            rows = (v + row_offset) * stride
            x = tl.load(weight + rows[:, None] + cols[None, :], mask=ok[:, None] & in_dim[None, :], other=0.0)
            x = x.to(tl.float32)
            if WEIGHTED:
                s = tl.load(per_sample_weights + idx, mask=ok, other=0.0)
                x = x * s[:, None]
            acc += tl.sum(x, axis=0)
        n = tl.sum(count, axis=0)
        if mean != 0:
            acc = acc / tl.maximum(n, 1).to(tl.float32)
        tl.store(out + b * out_stride + column + cols, acc, mask=in_dim)
        wrong = tl.sum(bad, axis=0)
        if d0 == 0 and wrong > 0:
            tl.atomic_add(invalid, wrong.to(tl.int64))


@triton.jit
def _sequence_kernel(
    lines,
    values,
    offsets,
    out,
    invalid,
    batch,
    out_stride,
    DTYPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    line = lines + tl.program_id(1) * 10
    feature = tl.load(line + 0)
    row_offset = tl.load(line + 2)
    num_rows = tl.load(line + 3)
    column = tl.load(line + 4)
    lowest = -tl.load(line + 6)
    weight = row_pointer(tl.load(line + 7), DTYPE)
    stride = tl.load(line + 8)
    dim = tl.load(line + 9)
    start = tl.load(offsets + feature * batch)
    end = tl.load(offsets + (feature + 1) * batch)
    idx = start + tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = idx < end
    if tl.program_id(0) * BLOCK_N < end - start:
        v = tl.load(values + idx, mask=live, other=0)
        ok = live & (v >= 0) & (v < num_rows)
        rows = (v + row_offset) * stride
        dest = (column + idx - start) * out_stride
        for d0 in range(0, dim, BLOCK_D):
            cols = d0 + tl.arange(0, BLOCK_D)
            in_dim = cols < dim
            x = tl.load(weight + rows[:, None] + cols[None, :], mask=ok[:, None] & in_dim[None, :], other=0.0)
            tl.store(out + dest[:, None] + cols[None, :], x.to(tl.float32), mask=live[:, None] & in_dim[None, :])
        wrong = tl.sum((live & ((v < lowest) | (v >= num_rows))).to(tl.int32), axis=0)
        if wrong > 0:
            tl.atomic_add(invalid, wrong.to(tl.int64))


class LineTables:
    """Device copies of line tables, kept per content (plans are small and reused batch after batch; a
    copy per call would be one more host-to-device transfer per lookup)."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._tables: OrderedDict[tuple[bytes, torch.device], torch.Tensor] = OrderedDict()

    def get(self, weights: Sequence[torch.Tensor], plans: Sequence[torch.Tensor], dims: Sequence[int]) -> torch.Tensor:
        """[L, LINE_WIDTH] int64 on the weights' device: each group's plan lines with its buffer's address."""
        host = torch.empty(sum(p.shape[0] for p in plans), LINE_WIDTH, dtype=torch.int64)
        at = 0
        for weight, plan, dim in zip(weights, plans, dims, strict=True):
            n = plan.shape[0]
            host[at : at + n, :WIDTH] = plan
            host[at : at + n, WEIGHT] = weight.data_ptr()
            host[at : at + n, STRIDE] = weight.stride(0)
            host[at : at + n, DIM] = dim
            at += n
        key = (host.numpy().tobytes(), weights[0].device)
        found = self._tables.get(key)
        if found is None:
            found = host.to(weights[0].device)
            self._tables[key] = found
            if len(self._tables) > self.capacity:
                self._tables.popitem(last=False)
        else:
            self._tables.move_to_end(key)
        return found


LINES = LineTables()


def block_d(dims: Sequence[int]) -> int:
    return min(MAX_BLOCK_D, max(16, triton.next_power_of_2(max(dims))))


def _warps(block: int) -> int:
    return 1 if block <= 512 else 2 if block <= 2048 else 4


def bag_offsets(lengths: torch.Tensor, out: torch.Tensor) -> None:
    """out = [0, cumulative sums of lengths]: torch.cumsum, which is CUB's device-wide scan on CUDA (a Triton
    scan in one program would walk the F * B lengths serially; several programs would need a second pass)."""
    out[0] = 0
    torch.cumsum(lengths, dim=0, dtype=torch.int64, out=out[1:])


def pooled_lookup_groups(
    weights: Sequence[torch.Tensor],
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plans: Sequence[torch.Tensor],
    dims: Sequence[int],
    out: torch.Tensor,
) -> torch.Tensor:
    """`pooled_lookup` of several groups of one storage dtype in one launch; -> invalid-id count [1] int64
    on the device (read it only when needed: reading waits for the kernel)."""
    batch = out.shape[0]
    invalid = torch.zeros(1, dtype=torch.int64, device=out.device)
    lines = LINES.get(weights, plans, dims)
    if batch == 0 or lines.shape[0] == 0:
        return invalid
    bd = block_d(dims)
    block_l = 4 if bd <= 64 else 2
    _pooled_kernel[(batch, lines.shape[0])](
        lines,
        values,
        offsets,
        values if per_sample_weights is None else per_sample_weights,
        out,
        invalid,
        batch,
        out.stride(0),
        DTYPE=DTYPE_CODE[weights[0].dtype],
        WEIGHTED=per_sample_weights is not None,
        BLOCK_L=block_l,
        BLOCK_D=bd,
        num_warps=_warps(block_l * bd),
    )
    return invalid


def pooled_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    out: torch.Tensor,
) -> int:
    return int(pooled_lookup_groups([weight], values, offsets, per_sample_weights, [plan], [dim], out).item())


def sequence_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    out: torch.Tensor,
) -> int:
    invalid = torch.zeros(1, dtype=torch.int64, device=out.device)
    n = out.shape[0]
    if n == 0 or plan.shape[0] == 0:
        return 0
    lines = LINES.get([weight], [plan], [dim])
    bd = block_d([dim])
    block_n = max(1, min(64, 2048 // bd))
    # the longest feature bounds the grid (programs past a feature's end return at once)
    _sequence_kernel[(triton.cdiv(n, block_n), plan.shape[0])](
        lines,
        values,
        offsets,
        out,
        invalid,
        batch_size,
        out.stride(0),
        DTYPE=DTYPE_CODE[weight.dtype],
        BLOCK_N=block_n,
        BLOCK_D=bd,
        num_warps=_warps(block_n * bd),
    )
    return int(invalid.item())
