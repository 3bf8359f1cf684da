"""MemoryStore: tier 2 in process, every row of every table in numpy arrays.

Two layouts, chosen per table:

  static tables (ids 0..R-1, `num_rows` given): rows at their id, all tables of one width D in one
  fused array, so a lookup over many tables is one gather:

    data     [sum R, D] f32   table t's row k at base[t] + k
    present  [sum R] bool     which rows the store holds

  dynamic tables (raw int64 keys): a sorted index, so N lookups are one searchsorted (N log R):

    keys   [R] int64    sorted
    slots  [R] int64    row of each key in `data`
    data   [C, D] f32   rows; new keys append, rows freed by deletes are reused first

Readers never lock: they take the current arrays (one attribute read). Writers serialise on a lock,
overwrite rows in place and publish new index arrays when dynamic keys are added or removed. The
parameter server only overwrites rows that no reader is reading (see parameter_server.py), so an
in-place write is never observed half-done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hugerec.serving.store.tiers import check_keys_rows, get_by_table


@dataclass(frozen=True)
class _Index:
    keys: np.ndarray  # [R] int64, sorted
    slots: np.ndarray  # [R] int64
    data: np.ndarray  # [C, D] float32
    free: np.ndarray  # [C - R - tail] int64 rows freed by deletes
    tail: int  # rows data[tail:] were never used


@dataclass(frozen=True)
class _Fused:
    """The static tables of one width: data [sum R, D], present [sum R]."""

    data: np.ndarray
    present: np.ndarray
    base: dict[str, int]
    rows: dict[str, int]


def _find(index: _Index, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """keys [N] -> (position in index.keys [N], found [N] bool)."""
    pos = np.searchsorted(index.keys, keys)
    pos[pos == index.keys.shape[0]] = 0
    found = index.keys[pos] == keys if index.keys.shape[0] else np.zeros(keys.shape[0], dtype=bool)
    return pos, found


class MemoryStore:
    """In-process `Store`: every row in RAM, lookups vectorised, lock-free reads.

    num_rows: table -> R for static tables (keys must be 0..R-1); tables not listed are dynamic.
    """

    name = "memory"

    def __init__(self, dims: Mapping[str, int], num_rows: Mapping[str, int | None] | None = None) -> None:
        for table, dim in dims.items():
            if dim <= 0:
                raise ValueError(f"MemoryStore: table {table!r} needs dim > 0, got {dim}")
        self.dims = dict(dims)
        static = {t: r for t, r in (num_rows or {}).items() if r is not None}
        unknown = set(static) - set(self.dims)
        if unknown:
            raise ValueError(f"MemoryStore: num_rows for unknown tables {sorted(unknown)}")
        self._fused: dict[str, _Fused] = {}
        for dim in sorted({self.dims[t] for t in static}):
            members = [t for t in self.dims if t in static and self.dims[t] == dim]
            starts = np.cumsum([0] + [static[t] for t in members])
            fused = _Fused(
                np.zeros((int(starts[-1]), dim), np.float32),
                np.zeros(int(starts[-1]), bool),
                {t: int(s) for t, s in zip(members, starts[:-1], strict=True)},
                {t: static[t] for t in members},
            )
            self._fused.update(dict.fromkeys(members, fused))
        self._lock = threading.Lock()
        self._tables = {
            t: _Index(
                np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, d), np.float32), np.zeros(0, np.int64), 0
            )
            for t, d in self.dims.items()
            if t not in self._fused
        }
        self._groups: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray] | None] = {}

    # -- static tables ---------------------------------------------------------------------------
    def _static(self, table: str, keys: np.ndarray) -> tuple[_Fused, np.ndarray, np.ndarray]:
        """-> (fused arrays, global row [N] (0 where out of range), in range [N])."""
        fused = self._fused[table]
        valid = (keys >= 0) & (keys < fused.rows[table])
        return fused, np.where(valid, keys + fused.base[table], 0), valid

    def _static_put(self, table: str, keys: np.ndarray) -> tuple[_Fused, np.ndarray]:
        fused, rows, valid = self._static(table, keys)
        if not valid.all():
            bad = keys[~valid][:5].tolist()
            raise ValueError(f"MemoryStore: table {table!r} is static (ids 0..{fused.rows[table] - 1}); got keys {bad}")
        return fused, rows

    # -- reading ---------------------------------------------------------------------------------
    def get(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_keys_rows("MemoryStore.get", self.dims, table, keys, None)
        if table in self._fused:
            fused, rows, valid = self._static(table, keys)
            return _gathered(fused.data, rows, valid & fused.present[rows])
        index = self._tables[table]
        pos, found = _find(index, keys)
        return _gathered(index.data, index.slots[pos] if index.keys.shape[0] else pos, found)

    def get_group(
        self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Keys of several tables of one width at once: key i of table tables[table_index[i]].

        -> (rows [N, D], found [N]). Static tables of one width are one gather, however many.
        """
        group = self._group(tuple(tables))
        if group is None:
            return get_by_table(self, tables, table_index, keys)
        base, rows_per_table = group
        fused = self._fused[tables[0]]
        limit = rows_per_table[table_index]
        valid = (keys >= 0) & (keys < limit)
        rows = np.where(valid, keys + base[table_index], 0)
        return _gathered(fused.data, rows, valid & fused.present[rows])

    def _group(self, tables: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """(base [T], rows [T]) when every table is static in one fused array, else None (cached)."""
        if tables not in self._groups:
            fused = {id(self._fused.get(t)) for t in tables}
            if all(t in self._fused for t in tables) and len(fused) == 1:
                f = self._fused[tables[0]]
                self._groups[tables] = (
                    np.array([f.base[t] for t in tables], np.int64),
                    np.array([f.rows[t] for t in tables], np.int64),
                )
            else:
                self._groups[tables] = None
        return self._groups[tables]

    # -- writing ---------------------------------------------------------------------------------
    def put(self, table: str, keys: np.ndarray, rows: np.ndarray) -> None:
        check_keys_rows("MemoryStore.put", self.dims, table, keys, rows)
        with self._lock:
            if table in self._fused:
                fused, at = self._static_put(table, keys)
                fused.data[at] = rows
                fused.present[at] = True
                return
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
            if table in self._fused:
                fused, rows, valid = self._static(table, keys)
                fused.present[rows[valid]] = False
                return
            index = self._tables[table]
            pos, found = _find(index, keys)
            if not found.any():
                return
            gone = np.unique(pos[found])
            keep = np.ones(index.keys.shape[0], dtype=bool)
            keep[gone] = False
            free = np.concatenate([index.free, index.slots[gone]])
            self._tables[table] = _Index(index.keys[keep], index.slots[keep], index.data, free, index.tail)

    def count(self, table: str) -> int:
        if table in self._fused:
            fused = self._fused[table]
            start = fused.base[table]
            return int(fused.present[start : start + fused.rows[table]].sum())
        return int(self._tables[table].keys.shape[0])

    def scan(self, table: str, chunk_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if table in self._fused:
            fused = self._fused[table]
            start = fused.base[table]
            keys = np.flatnonzero(fused.present[start : start + fused.rows[table]]).astype(np.int64)
            for i in range(0, keys.shape[0], chunk_rows):
                yield keys[i : i + chunk_rows], fused.data[start + keys[i : i + chunk_rows]]
            return
        index = self._tables[table]
        for start in range(0, index.keys.shape[0], chunk_rows):
            yield index.keys[start : start + chunk_rows].copy(), index.data[index.slots[start : start + chunk_rows]]

    def close(self) -> None:
        """Nothing to release: the rows go with the object."""


def _gathered(data: np.ndarray, rows: np.ndarray, found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """data[rows] with zeros where not found."""
    if not found.any():
        return np.zeros((rows.shape[0], data.shape[1]), np.float32), found
    out = data[rows]
    if not found.all():
        out[~found] = 0.0
    return out, found
