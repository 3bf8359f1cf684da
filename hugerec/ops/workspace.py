"""Memory kept across steps so that a training step allocates no large buffer.

Large per-step buffers (the kernels' scratch, the pooled output) would otherwise be mmapped and
page-faulted at every step under glibc's malloc (they are above its mmap threshold), which costs as
much as the lookup itself; keeping them makes speed independent of the allocator.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import torch

from hugerec.ops import huge_pages


class Workspace:
    """Grow-only named numpy arrays plus the row -> unique-slot map of the backward's deduplication."""

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._row_map: np.ndarray | None = None
        self._calls = 0

    def next_seed(self) -> int:
        """A new seed per call (0, 1, 2, ...): the GPU backward's stochastic rounding draws from it, so a
        run is reproducible and two updates of one row never reuse their random bits."""
        self._calls += 1
        return self._calls

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
            self._row_map = huge_pages.empty_numpy((num_rows,), np.int32)  # read at random: huge pages
            self._row_map.fill(-1)
        return self._row_map


def _storage_users(t: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))


# Tensors (views included) sharing a storage are counted by torch's private _storage_Use_Count; without
# it the pool cannot tell when a buffer is free and allocates every time.
_CAN_COUNT = hasattr(torch._C, "_storage_Use_Count")
_ALONE = _storage_users(torch.empty(1)) if _CAN_COUNT else 0


class OutputPool:
    """Output tensors recycled once nothing outside the pool refers to their storage.

    A lookup's output is handed out as a fresh tensor over a pooled storage; while the caller (or an
    autograd graph, or any view) holds it the storage is busy, afterwards the next lookup reuses it.
    At most `capacity` storages are kept; when none is free and fits, a free one is replaced, and when
    all are busy the output is allocated normally. Each thread has its own storages: two threads
    running the same model (a server's workers, a test's clients) would otherwise both find one
    storage free and write their outputs into it. Copies and pickles start empty.
    """

    def __init__(self, capacity: int = 6) -> None:
        self.capacity = capacity
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["capacity"])  # type: ignore[misc]

    @property
    def _storages(self) -> list[torch.Tensor]:
        storages: list[torch.Tensor] | None = getattr(self._local, "storages", None)
        if storages is None:
            storages = self._local.storages = []
        return storages

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        numel = math.prod(shape)
        if not _CAN_COUNT or device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device=device)
        storages = self._storages
        free = [i for i, b in enumerate(storages) if _storage_users(b) == _ALONE]
        fits = [i for i in free if storages[i].dtype == dtype and storages[i].numel() >= numel]
        if fits:  # the smallest free storage that fits
            return self._alias(storages[min(fits, key=lambda i: storages[i].numel())], shape)
        buf = torch.empty(numel, dtype=dtype)
        if len(storages) < self.capacity:
            storages.append(buf)
        elif free:  # replace a free storage of the wrong size or dtype
            storages[free[0]] = buf
        return self._alias(buf, shape)

    @staticmethod
    def _alias(buf: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """A new tensor (not a view) of `shape` over the start of buf's storage."""
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return torch.empty(0, dtype=buf.dtype).set_(buf.untyped_storage(), 0, shape, strides)
