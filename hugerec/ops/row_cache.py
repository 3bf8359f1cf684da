"""The disk tier's hot-row cache as ops: map a batch's rows to cache slots, loading and evicting rows.

    file    [R, W + S] uint8   one record per row: the weight bytes (W) then the optimizer state bytes (S)
    wcache  [C, W] uint8       the cached rows' weight bytes (a byte view of the group's weight buffer)
    scache  [C, S] uint8       their state bytes (a byte view of the group's state buffer)

`prepare` is the contract: for each id in order, a cached row is a hit and becomes the most recently
used; a missing row takes the least recently used slot, whose row is written back to the file first
when dirty, and is read from the file. Slots touched by the last `pinned` prepares are never taken
(the training pipeline prepares batch i+1 while step i updates batch i's slots). The Numba kernels
live in `hugerec.ops.cpu.row_cache_kernels`; `ReferenceCache` below is their slow twin for the tests.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from hugerec.ops.cpu import row_cache_kernels as cpu
from hugerec.ops.cpu.row_cache_kernels import BAD_ID, CACHE_FULL, CLOCK, HEAD, HITS, MISSES, READS, TAIL, WRITES

__all__ = [
    "BAD_ID",
    "CACHE_FULL",
    "CLOCK",
    "HEAD",
    "HITS",
    "MISSES",
    "READS",
    "TAIL",
    "WRITES",
    "ReferenceCache",
    "flush",
    "gather",
    "prepare",
    "scatter",
]

prepare = cpu.prepare
flush = cpu.flush
gather = cpu.gather
scatter = cpu.scatter


class ReferenceCache:
    """Plain-Python LRU cache over a file array with the same slot choice as the kernels (tests only)."""

    def __init__(self, file: np.ndarray, slots: int, weight_bytes: int) -> None:
        self.file = file
        self.wb = weight_bytes
        self.records = np.zeros((slots, file.shape[1]), dtype=np.uint8)
        self.lru: OrderedDict[int, int] = OrderedDict((s, -1) for s in range(slots))  # slot -> row, LRU first
        self.stamp = [-(1 << 40)] * slots  # older than any prepare
        self.dirty = [False] * slots
        self.where: dict[int, int] = {}  # row -> slot
        self.clock = 0
        self.counts = [0, 0, 0, 0]

    def prepare(self, ids: np.ndarray, missing_ok: bool, mark_dirty: bool, pinned: int) -> np.ndarray | int:
        self.clock += 1
        out = np.empty(len(ids), dtype=np.int64)
        for i, r in enumerate(ids.tolist()):
            if not 0 <= r < len(self.file):
                if r == -1 and missing_ok:
                    out[i] = -1
                    continue
                return BAD_ID
            if r in self.where:
                s = self.where[r]
                if self.stamp[s] != self.clock:
                    self.counts[HITS] += 1
            else:
                self.counts[MISSES] += 1
                s = next(iter(self.lru))
                if self.stamp[s] > self.clock - pinned:
                    return CACHE_FULL
                old = self.lru[s]
                if old >= 0:
                    del self.where[old]
                    if self.dirty[s]:
                        self.file[old] = self.records[s]
                        self.counts[WRITES] += 1
                self.records[s] = self.file[r]
                self.counts[READS] += 1
                self.where[r] = s
                self.dirty[s] = False
            self.lru.pop(s)
            self.lru[s] = r
            self.stamp[s] = self.clock
            self.dirty[s] = self.dirty[s] or mark_dirty
            out[i] = s
        return out
