"""Scratch memory one fused table group keeps across steps, so the CPU kernels allocate nothing per step.

Large per-step temporaries would otherwise be mmapped and page-faulted at every step under glibc's
malloc (they are above its mmap threshold); keeping them makes speed independent of the allocator.
"""

from __future__ import annotations

import numpy as np


class Workspace:
    """Grow-only named numpy arrays plus the row -> unique-slot map of the backward's deduplication."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._row_map: np.ndarray | None = None

    def array(self, name: str, size: int, dtype: type[np.generic]) -> np.ndarray:
        """A [size] array (contents undefined) reused across calls; grows by 1.5x when too small."""
        a = self._arrays.get(name)
        if a is None or a.shape[0] < size or a.dtype != dtype:
            a = np.empty(max(size, int(1.5 * (0 if a is None else a.shape[0]))), dtype=dtype)
            self._arrays[name] = a
        return a[:size]

    def row_map(self, num_rows: int) -> np.ndarray:
        """[num_rows] int32, -1 everywhere; kernels that write into it restore -1 before returning."""
        if self._row_map is None or self._row_map.shape[0] != num_rows:
            self._row_map = np.full(num_rows, -1, dtype=np.int32)
        return self._row_map
