"""FeatureStore: user and item features keyed by id, on the parameter server's tiers.

    store = FeatureStore.in_memory({"user": ("age", "region"), "item": ("price", "category", "available")})
    store.write("item", ids, {"price": ..., "category": ..., "available": ...})   # at export, or online
    store.update("item", ids, {"available": zeros})                              # some columns, online
    values, found = store.read("item", ids)        # ids [N] -> [N, C] float32 (columns in table order), [N] bool

A feature table is one keyspace of a `Store` (store/tiers.py): id -> one float32 row holding the table's
columns in order, so the same three tiers that hold embedding rows hold features (memory by default,
Redis shared by replicas, RocksDB on disk), and a batch read is one `Store.get`. Values are float32:
integer columns (categories, ids, flags) are exact below 2^24; a value that float32 cannot hold
exactly is refused at write, never rounded silently.

On disk (`save` / `load`, used by the pipeline bundle): <folder>/<table>.npz with "ids" [N] int64 and
"values" [N, C] float32, and <folder>/features.json naming each table's columns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.tiers import Store

SCHEMA_FILE = "features.json"
_EXACT = 1 << 24  # float32 holds every integer of magnitude below 2^24 exactly


class FeatureStore:
    """Feature tables (name -> columns) on one `Store`; reads are lock-free when the store's are."""

    def __init__(self, store: Store, tables: Mapping[str, tuple[str, ...]]) -> None:
        for table, columns in tables.items():
            if not columns or len(set(columns)) != len(columns):
                raise ValueError(f"FeatureStore: table {table!r} needs distinct column names, got {list(columns)}")
            if store.dims.get(table) != len(columns):
                raise ValueError(
                    f"FeatureStore: the {store.name} store holds table {table!r} with dim {store.dims.get(table)}, "
                    f"its columns are {len(columns)}"
                )
        self.store = store
        self.tables = {t: tuple(c) for t, c in tables.items()}
        self._position = {t: {c: i for i, c in enumerate(cols)} for t, cols in self.tables.items()}

    @staticmethod
    def in_memory(tables: Mapping[str, tuple[str, ...]]) -> FeatureStore:
        return FeatureStore(MemoryStore({t: len(c) for t, c in tables.items()}), tables)

    @staticmethod
    def on_tier(tables: Mapping[str, tuple[str, ...]], tier: str, location: str | None = None, namespace: str = "hugerec:features") -> FeatureStore:
        """tier "memory", "redis" (location: its URL) or "rocksdb" (location: a folder)."""
        dims = {t: len(c) for t, c in tables.items()}
        store: Store
        match tier:
            case "memory":
                store = MemoryStore(dims)
            case "redis":
                from hugerec.serving.store.redis_store import RedisStore

                if not location:
                    raise ValueError("FeatureStore: tier 'redis' needs the server's URL")
                store = RedisStore(location, dims, namespace=namespace)
            case "rocksdb":
                from hugerec.serving.store.persistent import PersistentStore

                if not location:
                    raise ValueError("FeatureStore: tier 'rocksdb' needs a folder")
                store = PersistentStore(location, dims)
            case _:
                raise ValueError(f"FeatureStore: tier must be 'memory', 'redis' or 'rocksdb', got {tier!r}")
        return FeatureStore(store, tables)

    def column(self, table: str, name: str) -> int:
        """Position of column `name` in the rows of `table`."""
        self._table(table)
        at = self._position[table].get(name)
        if at is None:
            raise ValueError(f"FeatureStore: table {table!r} has no column {name!r}; it has {list(self.tables[table])}")
        return at

    def read(self, table: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ids [N] int64 -> (values [N, C] float32, zeros where not found; found [N] bool)."""
        self._table(table)
        return self.store.get(table, np.ascontiguousarray(ids, dtype=np.int64))

    def write(self, table: str, ids: np.ndarray, columns: Mapping[str, np.ndarray] | np.ndarray) -> None:
        """Whole rows: every column of `table` (a mapping by name, or [N, C] in column order); ids unique."""
        keys = self._keys(table, ids)
        rows = self._rows(table, keys.shape[0], columns, require_all=True)
        self.store.put(table, keys, rows)

    def update(self, table: str, ids: np.ndarray, columns: Mapping[str, np.ndarray]) -> None:
        """Some columns of existing rows (the other columns keep their values); every id must exist."""
        keys = self._keys(table, ids)
        rows, found = self.store.get(table, keys)
        if not found.all():
            raise ValueError(f"FeatureStore.update: table {table!r} has no row for id {int(keys[~found][0])} (write whole rows first)")
        new = self._rows(table, keys.shape[0], columns, require_all=False)
        for name in columns:
            at = self.column(table, name)
            rows[:, at] = new[:, at]
        self.store.put(table, keys, rows)

    def delete(self, table: str, ids: np.ndarray) -> None:
        self.store.delete(table, self._keys(table, ids))

    def count(self, table: str) -> int:
        return self.store.count(self._table(table))

    def save(self, folder: str | Path) -> Path:
        """Every table to <folder>/<table>.npz and the columns to features.json."""
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for table, columns in self.tables.items():
            parts = list(self.store.scan(table))
            ids = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.int64)
            values = np.concatenate([v for _, v in parts]) if parts else np.zeros((0, len(columns)), np.float32)
            np.savez(out / f"{table}.npz", ids=ids, values=values)
        (out / SCHEMA_FILE).write_text(json.dumps({"tables": {t: list(c) for t, c in self.tables.items()}}, indent=1) + "\n")
        return out

    @staticmethod
    def load(folder: str | Path, tier: str = "memory", location: str | None = None, namespace: str = "hugerec:features") -> FeatureStore:
        """The tables saved at `folder`, written into a store on `tier` (see `on_tier`)."""
        src = Path(folder)
        try:
            spec = json.loads((src / SCHEMA_FILE).read_text())
            tables = {str(t): tuple(str(c) for c in cols) for t, cols in spec["tables"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"FeatureStore.load: {src / SCHEMA_FILE} is missing or not a feature schema ({e})") from None
        store = FeatureStore.on_tier(tables, tier, location, namespace)
        for table, columns in tables.items():
            with np.load(src / f"{table}.npz", allow_pickle=False) as saved:
                ids, values = saved["ids"], saved["values"]
            if ids.ndim != 1 or values.shape != (ids.shape[0], len(columns)) or values.dtype != np.float32:
                raise ValueError(f"FeatureStore.load: {src / (table + '.npz')} holds ids {ids.shape} / values {values.shape} {values.dtype}, expected [N] / [N, {len(columns)}] float32")
            if ids.shape[0]:
                store.store.put(table, ids.astype(np.int64), values)
        return store

    def close(self) -> None:
        self.store.close()

    def _table(self, table: str) -> str:
        if table not in self.tables:
            raise ValueError(f"FeatureStore: unknown table {table!r}; have {sorted(self.tables)}")
        return table

    def _keys(self, table: str, ids: np.ndarray) -> np.ndarray:
        self._table(table)
        keys = np.asarray(ids)
        if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
            raise ValueError(f"FeatureStore: ids of table {table!r} must be [N] integers, got {keys.shape} {keys.dtype}")
        keys = keys.astype(np.int64)
        if np.unique(keys).shape[0] != keys.shape[0]:
            raise ValueError(f"FeatureStore: ids of table {table!r} must be unique in one write")
        return keys

    def _rows(self, table: str, n: int, columns: Mapping[str, np.ndarray] | np.ndarray, require_all: bool) -> np.ndarray:
        names = self.tables[table]
        rows = np.zeros((n, len(names)), np.float32)
        if isinstance(columns, np.ndarray):
            if columns.shape != (n, len(names)):
                raise ValueError(f"FeatureStore: rows of table {table!r} must be [{n}, {len(names)}], got {columns.shape}")
            given: Mapping[str, np.ndarray] = {c: columns[:, i] for i, c in enumerate(names)}
        else:
            given = columns
        missing = [c for c in names if c not in given]
        if require_all and missing:
            raise ValueError(f"FeatureStore: a write to table {table!r} lacks columns {missing}")
        for name, values in given.items():
            at = self.column(table, name)
            v = np.asarray(values)
            if v.shape != (n,):
                raise ValueError(f"FeatureStore: column {table}.{name} has shape {v.shape}, expected ({n},)")
            as32 = v.astype(np.float32)
            if not np.isfinite(as32).all():
                raise ValueError(f"FeatureStore: column {table}.{name} holds NaN or infinite values")
            if np.issubdtype(v.dtype, np.integer) and (np.abs(v) >= _EXACT).any():
                bad = v[np.abs(v) >= _EXACT][0]
                raise ValueError(f"FeatureStore: column {table}.{name} value {int(bad)} is not exact in float32 (integers must be below 2^24)")
            rows[:, at] = as32
        return rows
