"""ParameterServer: one lookup API over three tiers, with atomic live updates.

    lookup(table, keys [N] int64) -> rows [N, D]

    keys -> overlays (updates not yet folded, newest first)
         -> tier 1 RowCache (hot rows, bounded, on the GPU when present)        misses fall through,
         -> tier 2 MemoryStore | RedisStore (every row)                         rows found below are
         -> tier 3 PersistentStore (RocksDB, every row, survives restarts)      promoted upward
         -> the table's default row (zeros, or the trained "unknown" row)

Updates are atomic per table version (a request never sees half of one), without blocking readers:

    1. the update's rows become an overlay: sorted keys [K] + rows [K, D], built off the read path
    2. a new view (tables -> overlays) replaces the old one: one attribute assignment; from here on
       new snapshots see every row of the update, old snapshots still see none of it
    3. grace period: wait until no snapshot of an older view is still reading
    4. fold: write the rows into RocksDB (one WriteBatch), tier 2 and the cache; readers of the new
       view read these keys from the overlay, so they never see a row half-written below
    5. a view without the overlay replaces the new one

A snapshot (`with ps.snapshot() as snap:`) pins one view for a whole request: every table it
reads is at one version.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from hugerec.serving.store.cache import CacheConfig, RowCache
from hugerec.serving.store.persistent import PersistentStore
from hugerec.serving.store.tiers import Store

TIERS = ("overlay", "cache", "memory", "persistent", "default")


@dataclass(frozen=True)
class TableSpec:
    """A table as the parameter server sees it: rows of width `dim`; `default` for keys without a row;
    `num_rows` R for a static table (keys are the row ids 0..R-1), None for a dynamic one (any int64 key)."""

    name: str
    dim: int
    default: tuple[float, ...] | None = None  # None: zeros
    num_rows: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("TableSpec: name must be non-empty")
        if self.dim <= 0:
            raise ValueError(f"TableSpec {self.name!r}: dim must be > 0, got {self.dim}")
        if self.num_rows is not None and self.num_rows <= 0:
            raise ValueError(f"TableSpec {self.name!r}: num_rows must be > 0 or None, got {self.num_rows}")
        if self.default is not None and len(self.default) != self.dim:
            raise ValueError(f"TableSpec {self.name!r}: default has {len(self.default)} values, dim is {self.dim}")

    def default_row(self) -> np.ndarray:
        if self.default is None:
            return np.zeros(self.dim, np.float32)
        return np.asarray(self.default, dtype=np.float32)


@dataclass(frozen=True, eq=False)
class TableUpdate:
    """New rows of one table: keys [K] int64 (unique) with rows [K, D] float32; `deleted` [E] keys lose
    their row; `default` [D], when given, becomes the row of keys without one (Missing.UNKNOWN_ROW)."""

    table: str
    keys: np.ndarray
    rows: np.ndarray
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    default: np.ndarray | None = None

    def __post_init__(self) -> None:
        keys = np.ascontiguousarray(self.keys, dtype=np.int64)
        rows = np.ascontiguousarray(self.rows, dtype=np.float32)
        deleted = np.ascontiguousarray(self.deleted, dtype=np.int64)
        if keys.ndim != 1 or rows.ndim != 2 or rows.shape[0] != keys.shape[0] or deleted.ndim != 1:
            raise ValueError(
                f"TableUpdate {self.table!r}: need keys [K], rows [K, D], deleted [E]; got keys {keys.shape}, "
                f"rows {rows.shape}, deleted {deleted.shape}"
            )
        both = np.concatenate([keys, deleted])
        uniq, counts = np.unique(both, return_counts=True)
        if uniq.shape[0] != both.shape[0]:
            raise ValueError(
                f"TableUpdate {self.table!r}: keys repeat (or are both put and deleted): {uniq[counts > 1][:5].tolist()}"
            )
        if not np.isfinite(rows).all():
            raise ValueError(f"TableUpdate {self.table!r}: rows contain NaN or inf")
        if self.default is not None:
            default = np.ascontiguousarray(self.default, dtype=np.float32)
            if default.shape != (rows.shape[1],) or not np.isfinite(default).all():
                raise ValueError(
                    f"TableUpdate {self.table!r}: default must be [{rows.shape[1]}] finite floats, got {default.shape}"
                )
            object.__setattr__(self, "default", default)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "deleted", deleted)


@dataclass(frozen=True, eq=False)
class _Overlay:
    keys: np.ndarray  # [K] int64, sorted
    rows: np.ndarray  # [K, D] float32; deleted keys carry the default row


class _View:
    """One version of everything readers see (per-table versions, overlays, default rows, payload),
    plus the count of snapshots reading it (guarded by the server's lock)."""

    def __init__(
        self,
        versions: dict[str, int],
        overlays: dict[str, tuple[_Overlay, ...]],
        defaults: dict[str, np.ndarray],
        payload: object,
    ) -> None:
        self.versions = versions
        self.overlays = overlays
        self.defaults = defaults
        self.payload = payload
        self.readers = 0
        self.overlaid = any(overlays.values())  # readers skip the overlays' step when none has one


@dataclass(frozen=True)
class TierStats:
    """Counters since start: keys asked of and found in each tier, per table; calls and seconds per tier.

    keys, hits  [len(TIERS), len(tables)] int64     calls, seconds  [len(TIERS)]
    """

    tables: tuple[str, ...]
    keys: np.ndarray
    hits: np.ndarray
    calls: np.ndarray
    seconds: np.ndarray

    def at(self, table: str, tier: str) -> tuple[int, int]:
        """(keys asked, keys found) of `table` in `tier`."""
        i, t = TIERS.index(tier), self.tables.index(table)
        return int(self.keys[i, t]), int(self.hits[i, t])


class Snapshot:
    """A consistent read of every table: the view pinned when the snapshot was taken."""

    def __init__(self, server: ParameterServer, view: _View) -> None:
        self._server = server
        self._view = view

    @property
    def versions(self) -> dict[str, int]:
        return dict(self._view.versions)

    @property
    def payload(self) -> object:
        """The object published with this version (the model's dense program), see `apply`."""
        return self._view.payload

    def lookup(self, table: str, keys: torch.Tensor | np.ndarray) -> torch.Tensor:
        """keys [N] int64 -> rows [N, D] float32 on the server's device."""
        keys = _as_keys(keys, table)
        return self._server._lookup_group(self._view, (table,), np.zeros(keys.shape[0], np.int64), keys)

    def lookup_group(self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray) -> torch.Tensor:
        """Tables of one width at once: key i of table tables[table_index[i]] -> rows [N, D]."""
        return self._server._lookup_group(self._view, tuple(tables), table_index, _as_keys(keys, tables))


def _as_keys(keys: torch.Tensor | np.ndarray, where: str | Sequence[str]) -> np.ndarray:
    out = keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
    if out.ndim != 1 or out.dtype != np.int64:
        raise ValueError(f"ParameterServer.lookup({where}): keys must be [N] int64, got {out.shape} {out.dtype}")
    return out


class ParameterServer:
    """Hierarchical parameter server over `tables`.

    memory      tier 2 store (MemoryStore or RedisStore)
    persistent  tier 3 store (PersistentStore), or None for a purely volatile server (tests, benchmarks)
    cache       tier 1 config (per table); None or rows=0: no cache tier (on the CPU in front of an
                in-process tier 2 it only costs time; see loader.ServeOptions for when it is on)
    device      where the cache lives and rows are returned; default CUDA when available
    """

    def __init__(
        self,
        tables: Sequence[TableSpec],
        memory: Store,
        persistent: PersistentStore | None = None,
        cache: CacheConfig | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"ParameterServer: duplicate table names {names}")
        self.tables = {t.name: t for t in tables}
        self.memory = memory
        self.persistent = persistent
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.caches = {}
        if cache is not None and cache.rows > 0:
            self.caches = {t.name: RowCache(t.dim, cache, self.device) for t in tables}
        defaults = {t.name: t.default_row() for t in tables}
        if persistent is not None:  # defaults replaced by earlier updates
            for t in tables:
                saved = persistent.get_meta(f"default:{t.name}")
                if saved is not None:
                    defaults[t.name] = np.asarray(json.loads(saved), dtype=np.float32)
        self._view = _View({t: 0 for t in self.tables}, {t: () for t in self.tables}, defaults, None)
        self._retired: list[_View] = []
        self._lock = threading.Lock()
        self._readers_done = threading.Condition(self._lock)
        self._apply_lock = threading.Lock()
        self._table_id = {t: i for i, t in enumerate(self.tables)}
        self._group_ids: dict[tuple[str, ...], tuple[int, np.ndarray]] = {}  # see _group
        self._keys = np.zeros((len(TIERS), len(self.tables)), np.int64)
        self._hits = np.zeros((len(TIERS), len(self.tables)), np.int64)
        self._calls = np.zeros(len(TIERS), np.int64)
        self._seconds = np.zeros(len(TIERS), np.float64)
        self._stats_lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------------
    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        with self._lock:
            view = self._view
            view.readers += 1
        try:
            yield Snapshot(self, view)
        finally:
            with self._lock:
                view.readers -= 1
                if view.readers == 0 and view is not self._view:
                    self._readers_done.notify_all()

    def lookup(self, table: str, keys: torch.Tensor | np.ndarray) -> torch.Tensor:
        """keys [N] int64 -> rows [N, D] float32 (one snapshot for this call)."""
        with self.snapshot() as snap:
            return snap.lookup(table, keys)

    def lookup_group(self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray) -> torch.Tensor:
        """Tables of one width at once: key i of tables[table_index[i]] -> rows [N, D] (one snapshot)."""
        with self.snapshot() as snap:
            return snap.lookup_group(tables, table_index, keys)

    def versions(self) -> dict[str, int]:
        return dict(self._view.versions)

    def _lookup_group(
        self, view: _View, tables: tuple[str, ...], table_index: np.ndarray, keys: np.ndarray
    ) -> torch.Tensor:
        group = self._group_ids.get(tables)
        if group is None:
            group = self._group_ids[tables] = self._group(tables)
        dim, table_ids = group
        ids = table_ids[table_index]  # [N] global table ids
        memory_first: tuple[np.ndarray, np.ndarray] | None = None  # tier 2's answer for every key, when asked first
        if not view.overlaid and not self.caches:  # the common case on the CPU: tier 2 holds every row
            t0 = time.perf_counter()
            memory_first = self.memory.get_group(tables, table_index, keys)
            if memory_first[1].all():
                self._count("memory", ids, memory_first[1], t0)
                found_all = torch.from_numpy(memory_first[0])
                return found_all if self.device.type == "cpu" else found_all.to(self.device)
        out = np.empty((keys.shape[0], dim), np.float32)
        todo = np.arange(keys.shape[0])  # positions of `out` still to fill
        for t, table in enumerate(tables if view.overlaid else ()):
            for overlay in reversed(view.overlays[table]):
                t0 = time.perf_counter()
                mine = todo[table_index[todo] == t]
                pos = np.searchsorted(overlay.keys, keys[mine])
                pos[pos == overlay.keys.shape[0]] = 0
                hit = overlay.keys[pos] == keys[mine]
                out[mine[hit]] = overlay.rows[pos[hit]]
                self._count("overlay", ids[mine], hit, t0)
                todo = np.setdiff1d(todo, mine[hit], assume_unique=True)
        if self.caches and todo.shape[0]:
            t0 = time.perf_counter()
            found = np.zeros(todo.shape[0], bool)
            for t, table in enumerate(tables):
                mine = np.flatnonzero(table_index[todo] == t)
                if mine.shape[0]:
                    rows_t, found_t = self.caches[table].get(torch.from_numpy(keys[todo[mine]]))
                    f = found_t.cpu().numpy()
                    out[todo[mine[f]]] = rows_t[found_t].cpu().numpy()
                    found[mine] = f
            self._count("cache", ids[todo], found, t0)
            todo = todo[~found]
        promoted: list[np.ndarray] = []  # positions found below the cache
        for store in (self.memory, self.persistent):
            if store is None or not todo.shape[0]:
                continue
            t0 = time.perf_counter()
            if todo.shape[0] == keys.shape[0]:  # the common case: nothing resolved above
                rows, found = (
                    memory_first
                    if store is self.memory and memory_first is not None
                    else store.get_group(tables, table_index, keys)
                )
                if found.all():
                    out = rows
                else:
                    out[found] = rows[found]
            else:
                rows, found = store.get_group(tables, table_index[todo], keys[todo])
                out[todo[found]] = rows[found]
            self._count("persistent" if store is self.persistent else "memory", ids[todo], found, t0)
            if store is self.persistent and found.any():
                self._promote(tables, table_index[todo[found]], keys[todo[found]], rows[found])
            promoted.append(todo[found])
            todo = todo[~found]
        if todo.shape[0]:
            t0 = time.perf_counter()
            defaults = np.stack([view.defaults[t] for t in tables])  # [T, D]
            out[todo] = defaults[table_index[todo]]
            self._count("default", ids[todo], np.ones(todo.shape[0], bool), t0)
        if self.caches and promoted:
            at = np.concatenate(promoted)
            for t, table in enumerate(tables):
                mine = at[table_index[at] == t]
                if mine.shape[0]:
                    self.caches[table].insert(torch.from_numpy(keys[mine]), torch.from_numpy(out[mine]))
        result = torch.from_numpy(out)
        return result if self.device.type == "cpu" else result.to(self.device)

    def _group(self, tables: tuple[str, ...]) -> tuple[int, np.ndarray]:
        """(width, global table id [T]) of tables read together, or an error if they cannot be."""
        unknown = [t for t in tables if t not in self.tables]
        if unknown:
            raise KeyError(f"ParameterServer: unknown tables {unknown}; have {sorted(self.tables)}")
        dims = {self.tables[t].dim for t in tables}
        if len(dims) != 1:
            raise ValueError(
                f"ParameterServer.lookup_group: tables {list(tables)} have different widths {sorted(dims)}"
            )
        return dims.pop(), np.array([self._table_id[t] for t in tables], np.int64)

    def _promote(self, tables: tuple[str, ...], table_index: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
        """Rows found in the persistent tier go up into tier 2 (once each)."""
        for t, table in enumerate(tables):
            mine = np.flatnonzero(table_index == t)
            if mine.shape[0]:
                uniq, first = np.unique(keys[mine], return_index=True)
                self.memory.put(table, uniq, rows[mine[first]])

    def _count(self, tier: str, table_ids: np.ndarray, found: np.ndarray, t0: float) -> None:
        i = TIERS.index(tier)
        asked = np.bincount(table_ids, minlength=len(self.tables))
        hits = asked if found.all() else np.bincount(table_ids[found], minlength=len(self.tables))
        dt = time.perf_counter() - t0
        with self._stats_lock:
            self._keys[i] += asked
            self._hits[i] += hits
            self._calls[i] += 1
            self._seconds[i] += dt

    def stats(self) -> TierStats:
        """Counters per tier (overlay, cache, memory = tier 2 also when Redis, persistent, default)."""
        with self._stats_lock:
            return TierStats(
                tuple(self.tables), self._keys.copy(), self._hits.copy(), self._calls.copy(), self._seconds.copy()
            )

    # -- writing -----------------------------------------------------------------------------
    def load(self, updates: Sequence[TableUpdate]) -> None:
        """Bulk-load rows into every tier below the cache (export, restore): not atomic, no readers expected."""
        for u in updates:
            self._check(u)
            if self.persistent is not None:
                self.persistent.write({u.table: (u.keys, u.rows)}, {u.table: u.deleted} if u.deleted.shape[0] else {})
            self.memory.put(u.table, u.keys, u.rows)

    def preload(self, chunk_rows: int = 65536) -> int:
        """Copy every row of the persistent tier into tier 2 (startup); returns the rows copied."""
        if self.persistent is None:
            return 0
        total = 0
        for table in self.tables:
            for keys, rows in self.persistent.scan(table, chunk_rows):
                self.memory.put(table, keys, rows)
                total += keys.shape[0]
        return total

    @contextmanager
    def updates_paused(self) -> Iterator[None]:
        """No update is applied while inside: the tiers hold one version of every row (a consistent copy
        of tier 2 and tier 3 can be taken; readers are not blocked)."""
        with self._apply_lock:
            yield

    def publish_payload(self, payload: object) -> None:
        """Make `payload` what new snapshots see as `snap.payload` (rows unchanged)."""
        with self._apply_lock:
            old = self._view
            self._swap(_View(old.versions, old.overlays, old.defaults, payload))

    def apply(
        self, updates: Sequence[TableUpdate], meta: Mapping[str, str] | None = None, payload: object | None = None
    ) -> dict[str, int]:
        """Apply `updates` (and a new `payload`, unless None) atomically: all switch together.

        Returns the new table versions, once the update is visible to every new snapshot and
        written to every tier (with `meta` entries in the same RocksDB batch; without a persistent
        tier `meta` has nowhere to go). Concurrent calls are applied one after another.
        """
        for u in updates:
            self._check(u)
        tables = [u.table for u in updates]
        if len(set(tables)) != len(tables):
            raise ValueError(f"ParameterServer.apply: one update per table per call, got tables {tables}")
        with self._apply_lock:
            old = self._view
            defaults = {**old.defaults, **{u.table: u.default for u in updates if u.default is not None}}
            overlays: dict[str, _Overlay] = {}
            for u in updates:
                keys = np.concatenate([u.keys, u.deleted])
                gone = np.broadcast_to(defaults[u.table], (u.deleted.shape[0], u.rows.shape[1]))
                rows = np.concatenate([u.rows, gone])
                order = np.argsort(keys, kind="stable")
                overlays[u.table] = _Overlay(keys[order], rows[order])
            versions = {t: v + (t in overlays) for t, v in old.versions.items()}
            new_payload = old.payload if payload is None else payload
            with_overlay = _View(
                versions,
                {t: old.overlays[t] + ((overlays[t],) if t in overlays else ()) for t in old.overlays},
                defaults,
                new_payload,
            )
            self._swap(with_overlay)
            if updates:
                self._wait_for_old_readers(with_overlay)
            self._fold(updates, meta)
            self._swap(_View(versions, {t: () for t in old.overlays}, defaults, new_payload))
            return dict(versions)

    def _check(self, u: TableUpdate) -> None:
        if u.table not in self.tables:
            raise ValueError(f"ParameterServer: update for unknown table {u.table!r}; have {sorted(self.tables)}")
        spec = self.tables[u.table]
        if u.rows.shape[1] != spec.dim:
            raise ValueError(
                f"ParameterServer: update of table {u.table!r} has rows of width {u.rows.shape[1]}, dim is {spec.dim}"
            )
        if spec.num_rows is not None:
            keys = np.concatenate([u.keys, u.deleted])
            bad = keys[(keys < 0) | (keys >= spec.num_rows)]
            if bad.shape[0]:
                raise ValueError(
                    f"ParameterServer: table {u.table!r} is static (ids 0..{spec.num_rows - 1}); update has keys {bad[:5].tolist()}"
                )

    def _swap(self, view: _View) -> None:
        with self._lock:
            old = self._view
            self._view = view
            if old.readers:
                self._retired.append(old)

    def _wait_for_old_readers(self, current: _View) -> None:
        with self._readers_done:
            self._readers_done.wait_for(lambda: all(v.readers == 0 for v in self._retired if v is not current))
            self._retired = [v for v in self._retired if v.readers]

    def _fold(self, updates: Sequence[TableUpdate], meta: Mapping[str, str] | None) -> None:
        if self.persistent is not None:
            puts = {u.table: (u.keys, u.rows) for u in updates if u.keys.shape[0]}
            deletes = {u.table: u.deleted for u in updates if u.deleted.shape[0]}
            saved = {f"default:{u.table}": json.dumps(u.default.tolist()) for u in updates if u.default is not None}
            self.persistent.write(puts, deletes, {**(meta or {}), **saved})
        for u in updates:
            if u.keys.shape[0]:
                self.memory.put(u.table, u.keys, u.rows)
            if u.deleted.shape[0]:
                self.memory.delete(u.table, u.deleted)
            cache = self.caches.get(u.table)
            if cache is not None:
                cache.refresh(torch.from_numpy(u.keys), torch.from_numpy(u.rows))
                cache.invalidate(torch.from_numpy(u.deleted))

    def close(self) -> None:
        self.memory.close()
        if self.persistent is not None:
            self.persistent.close()
