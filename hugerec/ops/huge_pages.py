"""Large CPU buffers backed by transparent huge pages (Linux), for memory that is read at random.

Embedding tables are gigabytes read and written at random rows. With 4 KiB pages nearly every row
access also misses the TLB (its reach is a few MiB) and pays a page walk; 2 MiB pages make the
whole table fit the TLB's reach. `empty` maps such buffers anonymously and asks the kernel for
huge pages (`madvise(MADV_HUGEPAGE)`), which works where THP is set to `madvise` or `always` (most
distributions) and costs nothing elsewhere: the kernel then hands out ordinary pages.

Buffers under 2 MiB, other devices and platforms without `MADV_HUGEPAGE` get a plain `torch.empty`.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
from collections.abc import Sequence

import numpy as np
import torch

HUGE_PAGE = 2 * 1024 * 1024
MIN_BYTES = HUGE_PAGE  # smaller buffers cannot hold a huge page
_ADVICE = getattr(mmap, "MADV_HUGEPAGE", None)


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str | None = None) -> torch.Tensor:
    """torch.empty(shape, dtype, device), on huge pages when it is a large CPU buffer (contents undefined).

    device None is torch's default device. The tensor owns its mapping: it is unmapped when the last
    tensor viewing it is freed.
    """
    device = torch.empty(0).device if device is None else torch.device(device)
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if device.type != "cpu" or _ADVICE is None or nbytes < MIN_BYTES:
        return torch.empty(tuple(shape), dtype=dtype, device=device)
    # one huge page more than needed, so that the buffer can start on a huge-page boundary: only the
    # aligned 2 MiB blocks of a mapping can be huge pages
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # THP disabled in this kernel: ordinary pages
        mapping.madvise(_ADVICE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
    raw = torch.from_numpy(np.frombuffer(mapping, dtype=np.uint8, count=nbytes, offset=-address % HUGE_PAGE))
    return raw.view(dtype).view(tuple(shape))


def empty_numpy(shape: Sequence[int], dtype: type[np.generic]) -> np.ndarray:
    """`empty` for a numpy array (on huge pages when large)."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return empty(shape, torch_dtype).numpy()
