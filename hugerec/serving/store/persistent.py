"""PersistentStore: tier 3, every row in RocksDB (via rocksdict); survives restarts.

    <path>/            one RocksDB database
      column family "default"   metadata: applied updates, bundle version, ... (str -> str)
      column family <table>     8-byte key (see tiers.encode_keys) -> row bytes (D float32, little endian)

A `put` is one RocksDB WriteBatch, so a crash leaves all of it or none of it. RocksDB checksums
every block it reads, so a damaged file is reported rather than served.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rocksdict import Checkpoint, Options, Rdict, WriteBatch

from hugerec.serving.store.tiers import check_keys_rows, decode_keys, decode_rows, encode_keys, get_by_table

_META_PREFIX = "meta:"


def _options() -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    return opt


class PersistentStore:
    """RocksDB `Store` at `path` with one column family per table (created when missing)."""

    name = "persistent"

    def __init__(self, path: str | Path, dims: Mapping[str, int], read_only: bool = False) -> None:
        self.path = Path(path)
        self.dims = dict(dims)
        self._lock = threading.Lock()
        existing = set(Rdict.list_cf(str(self.path), _options())) if (self.path / "CURRENT").exists() else {"default"}
        if read_only:
            missing = set(self.dims) - existing
            if missing:
                raise ValueError(f"PersistentStore: {self.path} has no rows for tables {sorted(missing)}")
        families = {name: _options() for name in existing if name != "default"}
        try:
            self._db = Rdict(str(self.path), _options(), column_families=families)
        except Exception as e:  # RocksDB reports a locked or damaged database as a bare Exception
            raise ValueError(f"PersistentStore: cannot open RocksDB at {self.path}: {e}") from e
        self._families: dict[str, Any] = {}
        for table in self.dims:
            if table not in existing:
                self._db.create_column_family(table, _options())
            self._families[table] = self._db.get_column_family(table)
        self._handles = {t: self._db.get_column_family_handle(t) for t in self.dims}

    def get(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_keys_rows("PersistentStore.get", self.dims, table, keys, None)
        if keys.shape[0] == 0:
            return np.zeros((0, self.dims[table]), np.float32), np.zeros(0, dtype=bool)
        values = self._families[table].get(encode_keys(keys))
        return decode_rows(values, self.dims[table], f"PersistentStore table {table!r}")

    def get_group(
        self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        return get_by_table(self, tables, table_index, keys)

    def put(self, table: str, keys: np.ndarray, rows: np.ndarray) -> None:
        self.write({table: (keys, rows)}, {})

    def delete(self, table: str, keys: np.ndarray) -> None:
        check_keys_rows("PersistentStore.delete", self.dims, table, keys, None)
        self.write({}, {table: keys})

    def write(
        self,
        puts: Mapping[str, tuple[np.ndarray, np.ndarray]],
        deletes: Mapping[str, np.ndarray],
        meta: Mapping[str, str] | None = None,
    ) -> None:
        """One atomic WriteBatch: rows put and deleted in several tables, plus metadata entries."""
        batch = WriteBatch(raw_mode=True)
        for table, (keys, rows) in puts.items():
            check_keys_rows("PersistentStore.put", self.dims, table, keys, rows)
            handle = self._handles[table]
            blob = np.ascontiguousarray(rows, dtype="<f4").tobytes()
            step = self.dims[table] * 4
            for i, k in enumerate(encode_keys(keys)):
                batch.put(k, blob[i * step : (i + 1) * step], handle)
        for table, keys in deletes.items():
            check_keys_rows("PersistentStore.delete", self.dims, table, keys, None)
            handle = self._handles[table]
            for k in encode_keys(keys):
                batch.delete(k, handle)
        for name, value in (meta or {}).items():
            batch.put((_META_PREFIX + name).encode(), value.encode())
        with self._lock:
            self._db.write(batch)

    def count(self, table: str) -> int:
        est = self._families[table].property_int_value("rocksdb.estimate-num-keys")
        if est is not None and est > 1_000_000:  # an exact count walks every key: only for small tables
            return int(est)
        return sum(1 for _ in self._families[table].keys())  # noqa: SIM118  (an Rdict iterates items)

    def scan(self, table: str, chunk_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        dim = self.dims[table]
        keys: list[bytes] = []
        values: list[bytes | None] = []
        for k, v in self._families[table].items():
            keys.append(k)
            values.append(v)
            if len(keys) == chunk_rows:
                yield decode_keys(keys), decode_rows(values, dim, f"PersistentStore table {table!r}")[0]
                keys, values = [], []
        if keys:
            yield decode_keys(keys), decode_rows(values, dim, f"PersistentStore table {table!r}")[0]

    def get_meta(self, name: str) -> str | None:
        value = self._db.get((_META_PREFIX + name).encode())
        return None if value is None else bytes(value).decode()

    def set_meta(self, name: str, value: str) -> None:
        self.write({}, {}, {name: value})

    def checkpoint(self, path: str | Path) -> None:
        """A consistent copy of the database at `path` (which must not exist): RocksDB hard-links its
        immutable files, so this costs about the size of the unflushed writes, not the rows."""
        with self._lock:  # no write batch half-way
            Checkpoint(self._db).create_checkpoint(str(path))

    def close(self) -> None:
        # every column family object holds the database open: drop them before closing it
        self._families.clear()
        self._handles.clear()
        self._db.close()
