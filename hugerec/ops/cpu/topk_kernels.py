"""Numba CPU kernel of the exact blocked top-K (`hugerec.index.topk`, whose torch path is its spec and its tests'
subject): each row's m largest integer keys `order(score) << 32 | (2^32 - 1 - position)` in one pass over the
row, with a min-heap of m keys, instead of encoding the whole block and running an integer top-k over it."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_LOW = 0xFFFFFFFF


@njit(cache=True, inline="always")
def _sift_down(heap: np.ndarray, size: int, i: int) -> None:
    """Restore the min-heap property of heap[:size] below position i."""
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        small = left
        if left + 1 < size and heap[left + 1] < heap[left]:
            small = left + 1
        if heap[i] <= heap[small]:
            return
        heap[i], heap[small] = heap[small], heap[i]
        i = small


@njit(parallel=True, cache=True)
def top_keys(bits: np.ndarray, first_position: int, out: np.ndarray) -> int:
    """out [b, m]: each row's m largest keys, descending. bits [b, n]: the float32 scores' bit patterns (int32); the
    key of the score at column j is order32(score) << 32 | (2^32 - 1 - (first_position + j)), where order32 maps the
    float order onto int32 (-0.0 as +0.0): equal scores rank the smaller position first. Returns the number of NaN
    scores seen (the caller refuses them; `out` is then meaningless), so the scores are read once, not twice."""
    rows, n = bits.shape
    m = out.shape[1]
    nans = 0
    for r in prange(rows):
        heap = np.empty(m, dtype=np.int64)
        size = 0
        floor = np.int64(-(1 << 62))  # once the heap is full: the order32 of its smallest key (below it: no entry)
        for j in range(n):
            b = np.int64(bits[r, j])
            if (b & 0x7FFFFFFF) > 0x7F800000:  # NaN
                nans += 1
                continue
            if b == -2147483648:  # -0.0 counts as +0.0
                b = np.int64(0)
            order = b ^ ((b >> 31) & 0x7FFFFFFF)
            if order < floor:
                continue
            key = (order << 32) | (_LOW - (first_position + j))
            if size < m:
                heap[size] = key
                size += 1
                i = size - 1
                while i > 0:  # sift up
                    parent = (i - 1) // 2
                    if heap[parent] <= heap[i]:
                        break
                    heap[parent], heap[i] = heap[i], heap[parent]
                    i = parent
                if size == m:
                    floor = heap[0] >> 32
            elif key > heap[0]:
                heap[0] = key
                _sift_down(heap, size, 0)
                floor = heap[0] >> 32
        ordered = np.sort(heap[:size])
        for c in range(size):
            out[r, c] = ordered[size - 1 - c]
    return nans
