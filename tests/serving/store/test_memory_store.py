"""MemoryStore's own layouts: static tables (ids 0..R-1) fused by width and gathered at once, dynamic tables in a
sorted index whose freed rows are reused; bad tables, keys and dims refused with the value named."""

from __future__ import annotations

import numpy as np
import pytest

from hugerec.serving.store.memory_store import MemoryStore


def _rows(n: int, dim: int, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(n * dim, dtype=np.float32)).reshape(n, dim)


def test_static_tables_of_one_width_are_one_gather() -> None:
    store = MemoryStore({"a": 2, "b": 2, "c": 3}, num_rows={"a": 4, "b": 3, "c": 5})
    store.put("a", np.array([0, 3], np.int64), _rows(2, 2))
    store.put("b", np.array([1], np.int64), _rows(1, 2, 100.0))
    # key i of table ("a", "b")[table_index[i]]; a never-written row and an out-of-range id are not found
    rows, found = store.get_group(["a", "b"], np.array([0, 1, 0, 1, 0]), np.array([3, 1, 1, 7, -1], np.int64))
    np.testing.assert_array_equal(found, [True, True, False, False, False])
    np.testing.assert_array_equal(rows, [[2, 3], [100, 101], [0, 0], [0, 0], [0, 0]])
    assert store.count("a") == 2 and store.count("b") == 1 and store.count("c") == 0


def test_get_group_mixes_static_and_dynamic_tables() -> None:
    store = MemoryStore({"s": 2, "d": 2}, num_rows={"s": 2})
    store.put("s", np.array([1], np.int64), _rows(1, 2))
    store.put("d", np.array([1 << 60], np.int64), _rows(1, 2, 9.0))
    rows, found = store.get_group(["s", "d"], np.array([1, 0, 0]), np.array([1 << 60, 1, 0], np.int64))
    np.testing.assert_array_equal(found, [True, True, False])
    np.testing.assert_array_equal(rows, [[9, 10], [0, 1], [0, 0]])


def test_static_put_outside_its_rows_is_refused_naming_the_keys() -> None:
    store = MemoryStore({"a": 2}, num_rows={"a": 4})
    with pytest.raises(ValueError, match=r"table 'a' is static \(ids 0..3\); got keys \[4, -1\]"):
        store.put("a", np.array([1, 4, -1], np.int64), _rows(3, 2))
    assert store.count("a") == 0  # nothing half-written


def test_static_delete_and_scan() -> None:
    store = MemoryStore({"a": 1}, num_rows={"a": 5})
    store.put("a", np.array([4, 0, 2], np.int64), np.array([[4.0], [0.0], [2.0]], np.float32))
    store.delete("a", np.array([2, 9], np.int64))  # an id out of range is ignored, like an absent key
    chunks = list(store.scan("a", chunk_rows=1))
    keys = np.concatenate([k for k, _ in chunks])
    rows = np.concatenate([r for _, r in chunks])
    np.testing.assert_array_equal(keys, [0, 4])
    np.testing.assert_array_equal(rows[:, 0], [0.0, 4.0])


def test_dynamic_rows_freed_by_a_delete_are_reused() -> None:
    store = MemoryStore({"d": 2})
    store.put("d", np.array([30, 10, 20], np.int64), _rows(3, 2))
    store.delete("d", np.array([10, 99], np.int64))
    store.put("d", np.array([5, 20], np.int64), _rows(2, 2, 50.0))  # 5 new (reuses 10's row), 20 overwritten
    rows, found = store.get("d", np.array([5, 10, 20, 30], np.int64))
    np.testing.assert_array_equal(found, [True, False, True, True])
    np.testing.assert_array_equal(rows, [[50, 51], [0, 0], [52, 53], [0, 1]])
    keys = np.concatenate([k for k, _ in store.scan("d")])
    np.testing.assert_array_equal(keys, [5, 20, 30])  # sorted


def test_dynamic_table_grows_past_its_first_block() -> None:
    store = MemoryStore({"d": 1})
    keys = np.arange(3000, dtype=np.int64) * 7 - 10_000
    for part in np.array_split(keys, 3):
        store.put("d", part, part[:, None].astype(np.float32))
    rows, found = store.get("d", keys[::-1].copy())
    assert found.all()
    np.testing.assert_array_equal(rows[:, 0], keys[::-1])
    assert store.count("d") == 3000


def test_empty_get_and_repeated_put_keys() -> None:
    store = MemoryStore({"d": 3})
    rows, found = store.get("d", np.zeros(0, np.int64))
    assert rows.shape == (0, 3) and found.shape == (0,)
    with pytest.raises(ValueError, match="keys of table 'd' repeat"):
        store.put("d", np.array([1, 1], np.int64), _rows(2, 3))


@pytest.mark.parametrize(
    ("dims", "num_rows", "message"),
    [
        ({"a": 0}, None, r"table 'a' needs dim > 0, got 0"),
        ({"a": 2}, {"b": 3}, r"num_rows for unknown tables \['b'\]"),
    ],
)
def test_bad_declarations_are_refused(dims: dict[str, int], num_rows: dict[str, int] | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryStore(dims, num_rows)


def test_bad_calls_name_the_table_and_shape() -> None:
    store = MemoryStore({"a": 2})
    with pytest.raises(ValueError, match=r"unknown table 'x'; have \['a'\]"):
        store.get("x", np.zeros(1, np.int64))
    with pytest.raises(ValueError, match=r"keys of table 'a' must be \[K\] int64, got shape \(1,\) int32"):
        store.get("a", np.zeros(1, np.int32))
    with pytest.raises(ValueError, match=r"rows of table 'a' must be \[1, 2\] float32, got \(1, 3\) float32"):
        store.put("a", np.zeros(1, np.int64), np.zeros((1, 3), np.float32))
