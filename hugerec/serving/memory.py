"""MemoryStore: tier 2 in process, every row of every table in numpy arrays.

One table, R rows held, capacity C >= R:

    keys   [R] int64    sorted, so a batch of N lookups is one vectorised searchsorted (N log R)
    slots  [R] int64    row of each key in `data`
    data   [C, D] f32   rows; new keys append, `free` rows (from deletes) are reused first

Readers take the table's current `_Index` (one attribute read) and never lock. Writers serialise on
a lock, overwrite rows of existing keys in place and publish a new `_Index` when keys are added or
removed. The parameter server only overwrites rows that no reader is reading (see
parameter_server.py), so an in-place overwrite is never observed half-written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from hugerec.serving.tiers import check_keys_rows


@dataclass(frozen=True)
class _Index:
    keys: np.ndarray  # [R] int64, sorted
    slots: np.ndarray  # [R] int64
    data: np.ndarray  # [C, D] float32
    free: np.ndarray  # [C - R - tail] int64 rows freed by deletes
    tail: int  # rows data[tail:] were never used


def _find(index: _Index, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """keys [N] -> (position in index.keys [N], found [N] bool)."""
    pos = np.searchsorted(index.keys, keys)
    pos[pos == index.keys.shape[0]] = 0
    found = index.keys[pos] == keys if index.keys.shape[0] else np.zeros(keys.shape[0], dtype=bool)
    return pos, found


class MemoryStore:
    """In-process `Store`: every row in RAM, lookups vectorised, lock-free reads."""

    name = "memory"

    def __init__(self, dims: Mapping[str, int]) -> None:
        for table, dim in dims.items():
            if dim <= 0:
                raise ValueError(f"MemoryStore: table {table!r} needs dim > 0, got {dim}")
        self.dims = dict(dims)
        self._lock = threading.Lock()
        self._tables = {
            t: _Index(
                np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, d), np.float32), np.zeros(0, np.int64), 0
            )
            for t, d in self.dims.items()
        }

    def get(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_keys_rows("MemoryStore.get", self.dims, table, keys, None)
        index = self._tables[table]
        pos, found = _find(index, keys)
        if found.all():
            return index.data[index.slots[pos]], found
        rows = np.zeros((keys.shape[0], self.dims[table]), np.float32)
        rows[found] = index.data[index.slots[pos[found]]]
        return rows, found

    def put(self, table: str, keys: np.ndarray, rows: np.ndarray) -> None:
        check_keys_rows("MemoryStore.put", self.dims, table, keys, rows)
        with self._lock:
            index = self._tables[table]
            pos, found = _find(index, keys)
            index.data[index.slots[pos[found]]] = rows[found]
            if found.all():
                return
            new_keys, new_rows = keys[~found], rows[~found]
            order = np.argsort(new_keys, kind="stable")
            new_keys, new_rows = new_keys[order], new_rows[order]
            if new_keys.shape[0] > 1 and (new_keys[1:] == new_keys[:-1]).any():
                raise ValueError(f"MemoryStore.put: keys of table {table!r} repeat; a put needs unique keys")
            n = new_keys.shape[0]
            reuse = index.free[:n]
            fresh = n - reuse.shape[0]
            data, tail = index.data, index.tail
            if tail + fresh > data.shape[0]:
                # grow geometrically so that a stream of small inserts stays amortised O(1) per row
                grown = np.zeros((max(tail + fresh, 2 * data.shape[0], 1024), data.shape[1]), np.float32)
                grown[:tail] = data[:tail]
                data = grown
            slots_new = np.concatenate([reuse, np.arange(tail, tail + fresh, dtype=np.int64)])
            data[slots_new] = new_rows
            at = np.searchsorted(index.keys, new_keys)
            self._tables[table] = _Index(
                np.insert(index.keys, at, new_keys),
                np.insert(index.slots, at, slots_new),
                data,
                index.free[n:],
                tail + fresh,
            )

    def delete(self, table: str, keys: np.ndarray) -> None:
        check_keys_rows("MemoryStore.delete", self.dims, table, keys, None)
        with self._lock:
            index = self._tables[table]
            pos, found = _find(index, keys)
            if not found.any():
                return
            gone = np.unique(pos[found])
            keep = np.ones(index.keys.shape[0], dtype=bool)
            keep[gone] = False
            self._tables[table] = _Index(
                index.keys[keep],
                index.slots[keep],
                index.data,
                np.concatenate([index.free, index.slots[gone]]),
                index.tail,
            )

    def count(self, table: str) -> int:
        return int(self._tables[table].keys.shape[0])

    def scan(self, table: str, chunk_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        index = self._tables[table]
        for start in range(0, index.keys.shape[0], chunk_rows):
            keys = index.keys[start : start + chunk_rows]
            yield keys.copy(), index.data[index.slots[start : start + chunk_rows]]

    def nbytes(self) -> int:
        return sum(i.keys.nbytes + i.slots.nbytes + i.data.nbytes for i in self._tables.values())

    def close(self) -> None:
        """Nothing to release: the rows go with the object."""
