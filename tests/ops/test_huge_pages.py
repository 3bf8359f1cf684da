"""Huge-page-backed buffers: same tensors as torch.empty, on huge pages where the kernel allows."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from hugerec.ops import huge_pages


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64])
@pytest.mark.parametrize("rows", [3, huge_pages.MIN_BYTES // 64 + 5])
def test_buffers_behave_like_torch_empty(dtype: torch.dtype, rows: int) -> None:
    t = huge_pages.empty((rows, 16), dtype)
    assert t.shape == (rows, 16) and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
    t.fill_(3)
    t[-1, -1] = 7
    assert int(t[0, 0]) == 3 and int(t[-1, -1]) == 7 and int(t.double().sum()) == 3 * (rows * 16 - 1) + 7
    clone = t.clone()
    del t
    assert int(clone[-1, -1]) == 7  # a clone owns its memory


def test_views_keep_the_mapping_alive() -> None:
    view = huge_pages.empty((huge_pages.MIN_BYTES // 4 + 1,), torch.float32)[10:20]
    view.fill_(1.5)
    assert view.sum().item() == 15.0


def test_numpy_buffers() -> None:
    a = huge_pages.empty_numpy((huge_pages.MIN_BYTES // 4,), np.int32)
    assert a.dtype == np.int32 and a.shape == (huge_pages.MIN_BYTES // 4,) and a.flags.writeable
    a.fill(-1)
    assert a.min() == a.max() == -1


def _anon_huge_kb() -> int:
    for line in pathlib.Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def _thp_mode() -> str | None:
    path = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists() or not pathlib.Path("/proc/self/smaps_rollup").exists():
        return None
    text = path.read_text()
    return text[text.index("[") + 1 : text.index("]")]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="transparent huge pages are off or absent")
def test_large_buffers_get_huge_pages() -> None:
    before = _anon_huge_kb()
    t = huge_pages.empty((64 * 1024 * 1024 // 4,), torch.float32)
    t.fill_(0.0)  # the first touch faults the pages in
    assert _anon_huge_kb() - before >= 16 * 1024  # at least a quarter of the 64 MiB on 2 MiB pages
    del t
