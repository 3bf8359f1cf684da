"""RedisStore: tier 2 as a real Redis server, shared by many serving replicas.

    hash "<namespace>:<table>"   field = 8-byte key (see tiers.encode_keys), value = row bytes (D float32)

A lookup of N keys is one HMGET round trip; a put is one MULTI/EXEC transaction (HSET), so another
client never reads half of it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import redis

from hugerec.serving.store.tiers import check_keys_rows, decode_keys, decode_rows, encode_keys


class RedisStore:
    """`Store` backed by the Redis server at `url` (e.g. "redis://127.0.0.1:6379/0")."""

    name = "redis"

    def __init__(self, url: str, dims: Mapping[str, int], namespace: str = "hugerec") -> None:
        if not namespace or namespace.endswith(":"):
            raise ValueError(
                f"RedisStore: namespace must be a non-empty name without a trailing ':', got {namespace!r}"
            )
        self.url = url
        self.dims = dict(dims)
        self.namespace = namespace
        self._client: Any = redis.Redis.from_url(url)
        try:
            self._client.ping()
        except redis.RedisError as e:
            raise ConnectionError(f"RedisStore: cannot reach Redis at {url}: {e}") from e

    def _key(self, table: str) -> str:
        return f"{self.namespace}:{table}"

    def get(self, table: str, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        check_keys_rows("RedisStore.get", self.dims, table, keys, None)
        if keys.shape[0] == 0:
            return np.zeros((0, self.dims[table]), np.float32), np.zeros(0, dtype=bool)
        values = self._client.hmget(self._key(table), encode_keys(keys))
        return decode_rows(values, self.dims[table], f"RedisStore table {table!r}")

    def get_group(
        self, tables: Sequence[str], table_index: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One round trip for all tables (a pipeline of HMGETs)."""
        dim = self.dims[tables[0]]
        out = np.zeros((keys.shape[0], dim), np.float32)
        found = np.zeros(keys.shape[0], bool)
        positions = [np.flatnonzero(table_index == t) for t in range(len(tables))]
        pipe = self._client.pipeline(transaction=False)
        for table, at in zip(tables, positions, strict=True):
            check_keys_rows("RedisStore.get_group", self.dims, table, keys[at], None)
            if at.shape[0]:
                pipe.hmget(self._key(table), encode_keys(keys[at]))
        replies = iter(pipe.execute())
        for table, at in zip(tables, positions, strict=True):
            if at.shape[0]:
                out[at], found[at] = decode_rows(next(replies), dim, f"RedisStore table {table!r}")
        return out, found

    def put(self, table: str, keys: np.ndarray, rows: np.ndarray) -> None:
        check_keys_rows("RedisStore.put", self.dims, table, keys, rows)
        if keys.shape[0] == 0:
            return
        blob = np.ascontiguousarray(rows, dtype="<f4").tobytes()
        step = self.dims[table] * 4
        mapping = {k: blob[i * step : (i + 1) * step] for i, k in enumerate(encode_keys(keys))}
        pipe = self._client.pipeline(transaction=True)
        pipe.hset(self._key(table), mapping=mapping)
        pipe.execute()

    def delete(self, table: str, keys: np.ndarray) -> None:
        check_keys_rows("RedisStore.delete", self.dims, table, keys, None)
        if keys.shape[0]:
            self._client.hdel(self._key(table), *encode_keys(keys))

    def count(self, table: str) -> int:
        return int(self._client.hlen(self._key(table)))

    def scan(self, table: str, chunk_rows: int = 65536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        dim = self.dims[table]
        cursor = 0
        while True:
            cursor, found = self._client.hscan(self._key(table), cursor, count=chunk_rows)
            if found:
                keys = list(found)
                yield decode_keys(keys), decode_rows([found[k] for k in keys], dim, f"RedisStore table {table!r}")[0]
            if cursor == 0:
                return

    def clear(self) -> None:
        """Drop every table of this namespace (a fresh bundle version starts empty)."""
        self._client.delete(*[self._key(t) for t in self.dims])

    def close(self) -> None:
        self._client.close()
