"""copy_rows, the HBM cache's row copy, against plain indexing dst[dst_rows] = src[src_rows]: every storage dtype
(rows moved as 32-bit words), row widths across the block size, no rows, width 0, and words' view of a buffer.
On a CUDA device it is compiled and run there; without one under Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from hugerec.ops.gpu.row_cache_kernels import copy_rows, words
from tests.ops.gpu.conftest import DEVICE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [4, 136, 264])  # 264 fp32 words: more than one BLOCK_W of 128
def test_copy_rows_equals_indexing(dtype: torch.dtype, width: int) -> None:
    g = torch.Generator().manual_seed(width)
    src = torch.randn(12, width, generator=g).to(dtype).to(DEVICE)
    dst = torch.randn(9, width, generator=g).to(dtype).to(DEVICE)
    src_rows = torch.tensor([11, 0, 5, 5, 3], device=DEVICE)
    dst_rows = torch.tensor([0, 8, 2, 7, 1], device=DEVICE)
    want = dst.clone()
    want[dst_rows] = src[src_rows]
    copy_rows(src, src_rows, dst, dst_rows)
    assert torch.equal(dst, want)  # bit for bit, untouched rows included


def test_nothing_to_copy() -> None:
    src, dst = torch.ones(3, 4, device=DEVICE), torch.zeros(3, 4, device=DEVICE)
    copy_rows(
        src, torch.zeros(0, dtype=torch.int64, device=DEVICE), dst, torch.zeros(0, dtype=torch.int64, device=DEVICE)
    )
    assert not dst.any()
    empty_src, empty_dst = torch.ones(3, 0, device=DEVICE), torch.zeros(3, 0, device=DEVICE)
    copy_rows(empty_src, torch.tensor([0], device=DEVICE), empty_dst, torch.tensor([1], device=DEVICE))


def test_words_is_the_same_memory() -> None:
    half = torch.arange(8, dtype=torch.float16).reshape(2, 4)
    w = words(half)
    assert w.dtype == torch.int32 and w.shape == (2, 2) and w.data_ptr() == half.data_ptr()
    full = torch.zeros(2, 3)
    assert words(full).shape == (2, 3) and words(full).data_ptr() == full.data_ptr()
