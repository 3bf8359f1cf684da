"""Triton kernel of the HBM cache over host memory (`hugerec.embedding.hbm_cache`): copy rows by index
between two row buffers given as addresses, one of which may be page-locked host memory.

Pinned host memory is addressable from the GPU (unified virtual addressing), so the cache's misses are
read, and its dirty evicted rows written back, by the GPU itself straight over PCIe: no staging copy and
no host thread in the loop. Rows are moved as 32-bit words (every row buffer of a table group is padded
to 16 bytes, so weight rows of any storage dtype and fp32 state rows are whole words).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _copy_rows_kernel(
    src_address,
    src_stride,
    src_rows,
    dst_address,
    dst_stride,
    dst_rows,
    n,
    words,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    src = src_address.to(tl.pointer_type(tl.int32))
    dst = dst_address.to(tl.pointer_type(tl.int32))
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = i < n
    s = tl.load(src_rows + i, mask=live, other=0)
    d = tl.load(dst_rows + i, mask=live, other=0)
    for w0 in range(0, words, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        m = live[:, None] & (w < words)[None, :]
        x = tl.load(src + s[:, None] * src_stride + w[None, :], mask=m, other=0)
        tl.store(dst + d[:, None] * dst_stride + w[None, :], x, mask=m)


def words(t: torch.Tensor) -> torch.Tensor:
    """A row buffer [R, W] as 32-bit words [R, W * itemsize / 4] (the same memory)."""
    return t.view(torch.int32) if t.element_size() == 4 else t.view(torch.int16).view(torch.int32)


def copy_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor) -> None:
    """dst[dst_rows[i]] = src[src_rows[i]] for row buffers of equal row width (any dtype; host or device;
    index tensors int64 on the GPU). Rows with nothing to copy (width 0) are skipped."""
    n = src_rows.shape[0]
    if n == 0 or src.shape[1] == 0:
        return
    s, d = words(src), words(dst)
    width = s.shape[1]
    block_w = min(128, triton.next_power_of_2(width))
    block_r = max(1, 1024 // block_w)
    _copy_rows_kernel[(triton.cdiv(n, block_r),)](
        s.data_ptr(),
        s.stride(0),
        src_rows,
        d.data_ptr(),
        d.stride(0),
        dst_rows,
        n,
        width,
        BLOCK_R=block_r,
        BLOCK_W=block_w,
        num_warps=4,
    )
