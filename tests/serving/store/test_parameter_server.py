"""ParameterServer: fall-through and promotion, defaults, atomic updates under concurrent readers, restarts."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.serving.store.cache import CacheConfig
from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.parameter_server import ParameterServer, TableSpec, TableUpdate
from hugerec.serving.store.persistent import PersistentStore

SPECS = [TableSpec("user", 4), TableSpec("item", 2, default=(0.5, -0.5))]  # both dynamic
DIMS = {t.name: t.dim for t in SPECS}


def rows_for(keys: np.ndarray, dim: int, version: float = 0.0) -> np.ndarray:
    return (keys[:, None] * 10 + np.arange(dim) + version).astype(np.float32)


def make_server(tmp_path: Path, cache_rows: int = 16, redis_url: str | None = None) -> ParameterServer:
    if redis_url is None:
        memory = MemoryStore(DIMS)
    else:
        from hugerec.serving.store.redis_store import RedisStore

        memory = RedisStore(redis_url, DIMS, namespace=f"ps{uuid.uuid4().hex}")
    return ParameterServer(
        SPECS, memory, PersistentStore(tmp_path / "db", DIMS), CacheConfig(rows=cache_rows, ways=4), device="cpu"
    )


def test_lookup_falls_through_tiers_promotes_and_fills_defaults(tmp_path: Path) -> None:
    ps = make_server(tmp_path)
    keys = np.arange(100, dtype=np.int64)
    assert ps.persistent is not None
    ps.persistent.put("user", keys, rows_for(keys, 4))  # only in RocksDB
    query = torch.tensor([5, 7, 5, 1000, -1])
    got = ps.lookup("user", query)
    expect = rows_for(np.array([5, 7, 5, 0, 0]), 4)
    expect[3:] = 0
    np.testing.assert_array_equal(got.numpy(), expect)
    stats = ps.stats()
    assert stats.at("user", "persistent") == (5, 3) and stats.at("user", "default") == (2, 2)
    assert ps.memory.count("user") == 2  # promoted into tier 2
    got = ps.lookup("user", query)
    stats = ps.stats()
    assert stats.at("user", "cache") == (5 + 5, 3)  # promoted into tier 1
    assert stats.at("user", "persistent")[0] == 5 + 2  # only the missing keys fell through again
    np.testing.assert_array_equal(got.numpy(), expect)
    np.testing.assert_array_equal(ps.lookup("item", np.array([3], np.int64)).numpy(), [[0.5, -0.5]])
    assert ps.lookup("user", np.zeros(0, np.int64)).shape == (0, 4)
    ps.close()


def test_lookup_rejects_bad_input(tmp_path: Path) -> None:
    ps = make_server(tmp_path)
    with pytest.raises(KeyError, match=r"unknown tables \['nope'\]"):
        ps.lookup("nope", np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="int64"):
        ps.lookup("user", np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="repeat"):
        TableUpdate("user", np.array([1, 1]), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="width 3"):
        ps.apply([TableUpdate("user", np.array([1]), np.zeros((1, 3)))])
    with pytest.raises(ValueError, match="NaN"):
        TableUpdate("user", np.array([1]), np.full((1, 4), np.nan))
    ps.close()


def test_apply_overwrites_inserts_deletes_in_every_tier(tmp_path: Path) -> None:
    ps = make_server(tmp_path, cache_rows=8)
    keys = np.arange(20, dtype=np.int64)
    ps.load([TableUpdate("user", keys, rows_for(keys, 4))])
    ps.lookup("user", keys[:8])  # warm the cache with rows that the update replaces
    new_keys = np.array([3, 4, 500], np.int64)
    versions = ps.apply(
        [TableUpdate("user", new_keys, rows_for(new_keys, 4, 0.25), deleted=np.array([5, 6]))], {"k": "v"}
    )
    assert versions == {"user": 1, "item": 0}
    got = ps.lookup("user", np.array([3, 4, 500, 5, 6, 7], np.int64)).numpy()
    np.testing.assert_array_equal(got[:3], rows_for(new_keys, 4, 0.25))
    np.testing.assert_array_equal(got[3:5], 0)
    np.testing.assert_array_equal(got[5], rows_for(np.array([7]), 4)[0])
    assert ps.persistent is not None and ps.persistent.get_meta("k") == "v"
    ps.close()


@pytest.mark.parametrize("tier2", ["memory", "redis"])
def test_concurrent_readers_never_see_half_an_update(
    tmp_path: Path, tier2: str, request: pytest.FixtureRequest
) -> None:
    redis_url = request.getfixturevalue("redis_url") if tier2 == "redis" else None
    ps = make_server(tmp_path, cache_rows=64, redis_url=redis_url)
    keys = np.arange(300, dtype=np.int64)  # more than the cache holds: reads span cache, tier 2 and RocksDB
    ps.load(
        [
            TableUpdate("user", keys, np.zeros((300, 4), np.float32)),
            TableUpdate("item", keys, np.zeros((300, 2), np.float32)),
        ]
    )
    stop = threading.Event()
    errors: list[str] = []
    seen: set[float] = set()

    def reader(seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            q = rng.choice(keys, 50)
            with ps.snapshot() as snap:
                u = snap.lookup("user", q).numpy()
                i = snap.lookup("item", q).numpy()
            values = np.unique(np.concatenate([u.ravel(), i.ravel()]))
            if values.shape[0] != 1:
                errors.append(f"mixed versions in one snapshot: {values}")
            seen.add(float(values[0]))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    try:
        for v in range(1, 16):
            ps.apply(
                [
                    TableUpdate("user", keys, np.full((300, 4), v, np.float32)),
                    TableUpdate("item", keys, np.full((300, 2), v, np.float32)),
                ]
            )
            time.sleep(0.005)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors[:3]
    assert len(seen) > 2  # readers really ran during the updates
    np.testing.assert_array_equal(ps.lookup("user", keys).numpy(), 15)
    assert ps.versions() == {"user": 15, "item": 15}
    ps.close()


def test_restart_serves_updated_rows(tmp_path: Path) -> None:
    ps = make_server(tmp_path)
    keys = np.arange(10, dtype=np.int64)
    ps.load([TableUpdate("user", keys, rows_for(keys, 4))])
    ps.apply([TableUpdate("user", keys[:3], rows_for(keys[:3], 4, 0.5), deleted=keys[9:])])
    ps.close()
    ps = make_server(tmp_path)  # a fresh process: empty cache and memory tier
    assert ps.preload() == 9
    got = ps.lookup("user", keys).numpy()
    np.testing.assert_array_equal(got[:3], rows_for(keys[:3], 4, 0.5))
    np.testing.assert_array_equal(got[3:9], rows_for(keys[3:9], 4))
    np.testing.assert_array_equal(got[9], 0)
    assert ps.stats().at("user", "persistent")[0] == 1  # preloaded: only the deleted key fell through
    ps.close()


def test_lookup_group_over_static_and_dynamic_tables_equals_per_table_lookups(tmp_path: Path) -> None:
    specs = [
        TableSpec("a", 3, num_rows=50),
        TableSpec("b", 3, num_rows=20),
        TableSpec("c", 3),
        TableSpec("d", 2, num_rows=5),
    ]
    dims = {t.name: t.dim for t in specs}
    memory = MemoryStore(dims, {t.name: t.num_rows for t in specs})
    ps = ParameterServer(specs, memory, PersistentStore(tmp_path / "db", dims), CacheConfig(rows=0), device="cpu")
    rng = np.random.default_rng(0)
    for name, n in (("a", 50), ("b", 20)):
        keys = np.arange(n, dtype=np.int64)
        ps.load([TableUpdate(name, keys[: n - 3], rng.standard_normal((n - 3, 3)))])  # the last 3 ids have no row
    dyn = rng.integers(-(2**62), 2**62, 30)
    ps.load([TableUpdate("c", dyn, rng.standard_normal((30, 3)))])
    tables = ("a", "b", "c")
    table_index = rng.integers(0, 3, 200)
    keys = np.where(table_index == 2, rng.choice(dyn, 200), rng.integers(-2, 52, 200)).astype(
        np.int64
    )  # some out of range
    got = ps.lookup_group(tables, table_index, keys).numpy()
    for t, name in enumerate(tables):
        at = np.flatnonzero(table_index == t)
        np.testing.assert_array_equal(got[at], ps.lookup(name, keys[at]).numpy())
    only_static = ps.lookup_group(("a", "b"), table_index % 2, np.abs(keys) % 20).numpy()
    np.testing.assert_array_equal(
        only_static[table_index % 2 == 1], ps.lookup("b", (np.abs(keys) % 20)[table_index % 2 == 1]).numpy()
    )
    with pytest.raises(ValueError, match="different widths"):
        ps.lookup_group(("a", "d"), np.zeros(1, np.int64), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match=r"static \(ids 0..49\)"):
        ps.apply([TableUpdate("a", np.array([50]), np.zeros((1, 3)))])
    with pytest.raises(ValueError, match="static"):
        memory.put("b", np.array([-1]), np.zeros((1, 3), np.float32))
    ps.close()
