"""The Store contract, run against every implementation (memory, RocksDB, real Redis) with a dict as the oracle."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.serving.store.memory_store import MemoryStore
from hugerec.serving.store.persistent import PersistentStore
from hugerec.serving.store.tiers import Store, decode_keys, encode_keys

DIMS = {"a": 3, "b": 1}
EXTREMES = [np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max]


@pytest.fixture(params=["memory", "persistent", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store
    match request.param:
        case "memory":
            s = MemoryStore(DIMS)
        case "persistent":
            s = PersistentStore(tmp_path / "db", DIMS)
        case _:
            from hugerec.serving.store.redis_store import RedisStore

            s = RedisStore(request.getfixturevalue("redis_url"), DIMS, namespace=f"t{uuid.uuid4().hex}")
    yield s
    s.close()


def test_encode_keys_roundtrip_and_byte_order() -> None:
    keys = np.array([5, *EXTREMES, -7, 1 << 40], dtype=np.int64)
    enc = encode_keys(keys)
    assert all(len(k) == 8 for k in enc)
    np.testing.assert_array_equal(decode_keys(enc), keys)
    assert sorted(enc) == encode_keys(np.sort(keys))  # byte order == numeric order
    assert decode_keys([]).shape == (0,)


def test_put_get_delete_against_dict(store: Store) -> None:
    rng = np.random.default_rng(0)
    oracle: dict[int, np.ndarray] = {}
    for step in range(6):
        keys = np.unique(rng.integers(-50, 50, 20)).astype(np.int64)
        if step == 3:
            keys = np.array(EXTREMES, dtype=np.int64)
        rows = rng.standard_normal((keys.shape[0], 3)).astype(np.float32)
        store.put("a", keys, rows)
        oracle.update({int(k): r for k, r in zip(keys, rows, strict=True)})
        gone = keys[::3]
        store.delete("a", gone)
        for k in gone:
            oracle.pop(int(k))
        query = np.concatenate([rng.integers(-60, 60, 30), EXTREMES]).astype(np.int64)
        got, found = store.get("a", query)
        assert got.shape == (query.shape[0], 3) and got.dtype == np.float32
        for k, row, f in zip(query, got, found, strict=True):
            assert f == (int(k) in oracle)
            np.testing.assert_array_equal(row, oracle[int(k)] if f else np.zeros(3, np.float32))
    assert store.count("a") == len(oracle)
    assert store.count("b") == 0
    scanned = {int(k): r for keys, rows in store.scan("a", chunk_rows=7) for k, r in zip(keys, rows, strict=True)}
    assert scanned.keys() == oracle.keys()
    for k, r in scanned.items():
        np.testing.assert_array_equal(r, oracle[k])


def test_tables_are_separate_and_empty_lookups_work(store: Store) -> None:
    store.put("b", np.array([1], np.int64), np.array([[9.0]], np.float32))
    rows, found = store.get("a", np.array([1], np.int64))
    assert not found[0]
    rows, found = store.get("b", np.zeros(0, np.int64))
    assert rows.shape == (0, 1) and found.shape == (0,)
    store.delete("b", np.array([123], np.int64))  # absent: ignored
    assert store.count("b") == 1


def test_bad_input_names_the_problem(store: Store) -> None:
    with pytest.raises(ValueError, match="unknown table 'zzz'"):
        store.get("zzz", np.zeros(1, np.int64))
    with pytest.raises(ValueError, match=r"int64"):
        store.get("a", np.zeros(1, np.int32))
    with pytest.raises(ValueError, match=r"\[2, 3\] float32"):
        store.put("a", np.arange(2, dtype=np.int64), np.zeros((2, 4), np.float32))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12)), max_size=8))
def test_memory_store_matches_dict(ops: list[tuple[bool, list[int]]]) -> None:
    store = MemoryStore({"t": 2})
    oracle: dict[int, np.ndarray] = {}
    for i, (is_put, raw) in enumerate(ops):
        keys = np.unique(np.array(raw, dtype=np.int64))
        if is_put:
            rows = np.full((keys.shape[0], 2), float(i), np.float32)
            store.put("t", keys, rows)
            oracle.update({int(k): rows[0] for k in keys})
        else:
            store.delete("t", keys)
            for k in keys:
                oracle.pop(int(k), None)
    query = np.array([*sorted(oracle), 3, -3], dtype=np.int64)
    rows, found = store.get("t", query)
    for k, row, f in zip(query, rows, found, strict=True):
        assert f == (int(k) in oracle)
        if f:
            np.testing.assert_array_equal(row, oracle[int(k)])
    assert store.count("t") == len(oracle)


def test_persistent_store_survives_reopen_and_keeps_meta(tmp_path: Path) -> None:
    keys = np.array([3, -4], np.int64)
    rows = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    s = PersistentStore(tmp_path / "db", DIMS)
    s.write({"a": (keys, rows)}, {}, {"applied": "delta-1"})
    s.close()
    s = PersistentStore(tmp_path / "db", DIMS)
    got, found = s.get("a", keys)
    assert found.all()
    np.testing.assert_array_equal(got, rows)
    assert s.get_meta("applied") == "delta-1" and s.get_meta("other") is None
    s.close()
    with pytest.raises(ValueError, match="no rows for tables"):
        PersistentStore(tmp_path / "db", {**DIMS, "new": 2}, read_only=True)


def test_static_tables_share_one_fused_array() -> None:
    store = MemoryStore({"a": 2, "b": 2, "c": 3, "d": 2}, {"a": 5, "b": 3, "c": 4, "d": None})
    store.put("a", np.array([0, 4], np.int64), np.array([[1, 1], [4, 4]], np.float32))
    store.put("b", np.array([2], np.int64), np.array([[7, 7]], np.float32))
    rows, found = store.get("a", np.array([4, 1, -1, 5], np.int64))  # held, not held, out of range twice
    assert found.tolist() == [True, False, False, False]
    np.testing.assert_array_equal(rows, [[4, 4], [0, 0], [0, 0], [0, 0]])
    rows, found = store.get_group(("a", "b"), np.array([1, 0, 1]), np.array([2, 0, 0], np.int64))
    assert found.tolist() == [True, True, False]
    np.testing.assert_array_equal(rows, [[7, 7], [1, 1], [0, 0]])
    rows, found = store.get_group(("a", "d"), np.array([0, 1]), np.array([4, 4], np.int64))  # static + dynamic
    assert found.tolist() == [True, False]
    np.testing.assert_array_equal(rows, [[4, 4], [0, 0]])
    assert (store.count("a"), store.count("b"), store.count("c")) == (2, 1, 0)
    store.delete("a", np.array([0, 99], np.int64))
    assert [k.tolist() for k, _ in store.scan("a")] == [[4]]
    with pytest.raises(ValueError, match=r"static \(ids 0..2\)"):
        store.put("b", np.array([3], np.int64), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="unknown tables"):
        MemoryStore({"a": 2}, {"z": 3})
