"""The contract of the parameter server's lower tiers (2: volatile memory or Redis, 3: RocksDB).

    tier 1  RowCache          bounded hot rows, in process, on the GPU when present (cache.py)
    tier 2  MemoryStore       every row, in process (memory_store.py)         } both satisfy `Store`
            RedisStore        every row, shared by many replicas (redis_store.py)
    tier 3  PersistentStore   every row, RocksDB, survives restarts (persistent.py)

A `Store` maps int64 keys to float32 rows, one keyspace per table. Three real implementations share
it, which is why this is a Protocol (the cache is not one: it is bounded and evicts).

Keys travel to the byte-keyed stores (RocksDB, Redis) as 8 big-endian bytes of `key XOR 2^63`, so
that byte order is numeric order (negative keys first) and every int64 is a valid key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

_SIGN = np.uint64(1 << 63)


class Store(Protocol):
    """int64 key -> float32 row [D], per table. Implementations are safe to call from many threads."""

    name: str
    dims: dict[str, int]  # table -> D

    def get(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """keys [N] int64 -> (rows [N, D] float32, found [N] bool); rows of keys not found are zeros."""
        ...

    def get_group(
        self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Tables of one width D at once: key i belongs to tables[table_index[i]] -> (rows [N, D], found [N])."""
        ...

    def put(self, table: str, keys: np.ndarray, rows: np.ndarray) -> None:
        """Insert or overwrite keys [K] (unique) with rows [K, D], all or nothing."""
        ...

    def delete(self, table: str, keys: np.ndarray) -> None:
        """Remove keys [K]; keys that are absent are ignored."""
        ...

    def count(self, table: str) -> int:
        """Number of rows held for `table`."""
        ...

    def scan(self, table: str, chunk_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every (keys [n], rows [n, D]) of `table`, in chunks of at most `chunk_rows`."""
        ...

    def close(self) -> None: ...


def encode_keys(keys: np.ndarray) -> list[bytes]:
    """keys [N] int64 -> N 8-byte keys whose byte order is the numeric order."""
    raw = (np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) ^ _SIGN).astype(">u8").tobytes()
    return [raw[i : i + 8] for i in range(0, len(raw), 8)]


def decode_keys(encoded: Sequence[bytes]) -> np.ndarray:
    """Inverse of `encode_keys`: N 8-byte keys -> [N] int64."""
    if not encoded:
        return np.zeros(0, dtype=np.int64)
    return (np.frombuffer(b"".join(encoded), dtype=">u8").astype(np.uint64) ^ _SIGN).view(np.int64)


def decode_rows(values: Sequence[bytes | None], dim: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """N stored rows (None = absent) -> (rows [N, D] float32 with zeros where absent, found [N] bool)."""
    n = len(values)
    found = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    rows = np.zeros((n, dim), dtype=np.float32)
    if found.any():
        blob = b"".join(v for v in values if v is not None)
        got = np.frombuffer(blob, dtype=np.float32)
        if got.size != int(found.sum()) * dim:
            raise ValueError(f"{where}: stored rows have {got.size} floats, expected {int(found.sum())} x dim {dim}")
        rows[found] = got.reshape(-1, dim)  # [F * D] -> [F, D]
    return rows, found


def check_keys_rows(where: str, dims: dict[str, int], table: str, keys: np.ndarray, rows: np.ndarray | None) -> None:
    """ValueError unless `table` is known, keys are [K] int64 and rows (when given) are [K, D] float32."""
    if table not in dims:
        raise ValueError(f"{where}: unknown table {table!r}; have {sorted(dims)}")
    if keys.ndim != 1 or keys.dtype != np.int64:
        raise ValueError(f"{where}: keys of table {table!r} must be [K] int64, got shape {keys.shape} {keys.dtype}")
    if rows is not None and (rows.shape != (keys.shape[0], dims[table]) or rows.dtype != np.float32):
        raise ValueError(
            f"{where}: rows of table {table!r} must be [{keys.shape[0]}, {dims[table]}] float32, "
            f"got {rows.shape} {rows.dtype}"
        )


def get_by_table(
    store: Store, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`get_group` as one `get` per table (for stores without a faster path)."""
    out = np.zeros((keys.shape[0], store.dims[tables[0]]), np.float32)
    found = np.zeros(keys.shape[0], bool)
    for t, table in enumerate(tables):
        at = np.flatnonzero(table_index == t)
        if at.shape[0]:
            out[at], found[at] = store.get(table, keys[at])
    return out, found
