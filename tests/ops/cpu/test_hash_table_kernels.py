"""The hash-table kernels called directly on their arrays (hash_table_arrays wraps them; tests/ops/
test_hash_table_arrays.py compares whole operation sequences with a dict): the status codes and that a refused
call changes nothing, rows handed out from the free stack, every int64 a valid key, remove's freed rows, a
loaded mapping found by lookup, the side-by-side kernels' unknown row, and the count-min sketch never
under-counting."""

from __future__ import annotations

import numpy as np
import pytest

from hugerec.ops.cpu import hash_table_kernels as k
from hugerec.ops.hash_table_arrays import HashTableArrays, TablePack

EXTREMES = np.array([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max], np.int64)


def _call(
    t: HashTableArrays, keys: np.ndarray, step: int, eviction: int, min_count: int = 1
) -> tuple[int, np.ndarray, np.ndarray]:
    rows, reset = np.full(len(keys), -9, np.int64), np.empty(len(keys), np.int64)
    status, n_reset, _, _ = k.find_or_insert(t.kernel(), keys, rows, reset, step, eviction, min_count, False)
    return int(status), rows, reset[:n_reset]


def _snapshot(t: HashTableArrays) -> list[np.ndarray]:
    return [a.copy() for a in (t.slots, t.info, t.row_state, t.free, t.meta)]


def test_rows_come_from_the_free_stack_and_every_int64_is_a_key() -> None:
    t = HashTableArrays.allocate(8, k.EVICT_NONE)
    status, rows, reset = _call(t, EXTREMES, 1, k.EVICT_NONE)
    assert status == k.OK and rows.tolist() == [0, 1, 2, 3, 4] and reset.shape == (0,)
    out = np.empty(6, np.int64)
    k.lookup(t.slots, np.array([*EXTREMES[::-1], 7], np.int64), out)
    assert out.tolist() == [4, 3, 2, 1, 0, -1]
    assert t.meta[k.SIZE] == 5 and t.meta[k.N_FREE] == 3 and t.meta[k.INSERTS] == 5
    assert (t.row_state[:5] == k.USED).all() and t.info[:5, k.KEY].tolist() == EXTREMES.tolist()
    assert (t.info[:5, k.LAST] == 1).all() and t.meta[k.TOUCHED] == 5


def test_a_refused_call_changes_nothing() -> None:
    t = HashTableArrays.allocate(3, k.EVICT_NONE)
    assert _call(t, np.array([1, 2], np.int64), 1, k.EVICT_NONE)[0] == k.OK
    before = _snapshot(t)
    assert _call(t, np.array([3, 4], np.int64), 2, k.EVICT_NONE)[0] == k.FULL  # 1 free row, 2 new keys
    for a, b in zip(before, _snapshot(t), strict=True):
        np.testing.assert_array_equal(a, b)


def test_eviction_needs_a_heap_then_evicts_the_least_recent() -> None:
    t = HashTableArrays.allocate(2, k.EVICT_LRU)
    _call(t, np.array([10], np.int64), 1, k.EVICT_LRU)
    _call(t, np.array([20], np.int64), 2, k.EVICT_LRU)
    assert _call(t, np.array([30], np.int64), 3, k.EVICT_LRU)[0] == k.NEED_HEAP  # the heap is allocated lazily
    t.heap = np.zeros((2 + 2 // 8 + 1, 4), np.int64)
    k.rebuild_heap(t.kernel(), k.EVICT_LRU)
    status, rows, reset = _call(t, np.array([30], np.int64), 3, k.EVICT_LRU)
    assert status == k.OK and rows.tolist() == [0] and reset.tolist() == [0]  # key 10's row, to re-initialise
    out = np.empty(3, np.int64)
    k.lookup(t.slots, np.array([10, 20, 30], np.int64), out)
    assert out.tolist() == [-1, 1, 0] and t.meta[k.EVICTIONS] == 1


def test_keys_of_one_step_are_never_evicted_for_each_other() -> None:
    t = HashTableArrays.allocate(2, k.EVICT_LRU)
    t.heap = np.zeros((3, 4), np.int64)
    before = _snapshot(t)
    status, _, _ = _call(t, np.array([1, 2, 3], np.int64), 1, k.EVICT_LRU)
    assert status == k.BATCH_TOO_LARGE
    for a, b in zip(before, _snapshot(t), strict=True):
        np.testing.assert_array_equal(a, b)


def test_remove_frees_rows_for_reuse() -> None:
    t = HashTableArrays.allocate(4, k.EVICT_NONE)
    _call(t, np.array([5, 6, 7], np.int64), 1, k.EVICT_NONE)
    out = np.empty(3, np.int64)
    k.remove(t.kernel(), np.array([6, 99, 5], np.int64), out)
    assert out.tolist() == [1, -1, 0] and t.meta[k.SIZE] == 1 and t.meta[k.REMOVED] == 2
    assert t.row_state[[0, 1]].tolist() == [k.FREED, k.FREED]
    status, rows, _ = _call(t, np.array([8], np.int64), 2, k.EVICT_NONE)
    assert status == k.OK and rows.tolist() == [0]  # the last freed row is on top of the stack
    probe = np.empty(4, np.int64)
    k.lookup(t.slots, np.array([5, 6, 7, 8], np.int64), probe)
    assert probe.tolist() == [-1, -1, 2, 0]


def test_a_loaded_mapping_is_found() -> None:
    t = HashTableArrays.allocate(300, k.EVICT_NONE)
    keys = np.arange(300, dtype=np.int64) * 7919 - 10**12
    rows = np.arange(300, dtype=np.int64)[::-1].copy()
    k.insert_mapping(t.slots, keys, rows)
    out = np.empty(300, np.int64)
    k.lookup(t.slots, keys, out)
    np.testing.assert_array_equal(out, rows)


def test_side_by_side_tables_with_an_unknown_row() -> None:
    a, b = (
        HashTableArrays.allocate(4, k.EVICT_NONE),
        HashTableArrays.allocate(4, k.EVICT_NONE, sketch_depth=2, sketch_width=16),
    )
    pack = TablePack([a, b], evictions=[k.EVICT_NONE] * 2, min_counts=[1, 2], ttls=[-1, -1], unknown=[-1, 3])
    keys = np.array([1, 2, 7, 7, 8], np.int64)
    starts, ends = np.array([0, 2]), np.array([2, 5])
    rows, reset = np.empty(5, np.int64), np.empty(5, np.int64)
    steps, status = np.array([-1, -1]), np.zeros((2, 4), np.int64)
    k.find_or_insert_tables(pack.group, keys, starts, ends, rows, reset, steps, status)
    assert status[:, 0].tolist() == [k.OK, k.OK] and steps.tolist() == [1, 1]
    # table b admits a key seen twice (min_count 2): 7 gets a row, 8 (seen once) the unknown row 3
    assert rows.tolist() == [0, 1, 0, 0, 3]
    looked = np.empty(5, np.int64)
    k.lookup_tables(pack.group, np.array([2, 9, 7, 8, 9], np.int64), starts, ends, looked)
    assert looked.tolist() == [1, -1, 0, 3, 3]


def test_the_sketch_never_under_counts() -> None:
    t = HashTableArrays.allocate(4, k.EVICT_LRU, sketch_depth=2, sketch_width=8)
    t.heap = np.zeros((5, 4), np.int64)
    seen: dict[int, int] = {}
    rng = np.random.default_rng(0)
    for step in range(1, 6):
        batch = rng.integers(0, 40, 10).astype(np.int64)
        _call(t, batch, step, k.EVICT_LRU, min_count=50)  # nothing admitted: every key only counted
        for key in batch.tolist():
            seen[key] = seen.get(key, 0) + 1
    assert t.meta[k.SIZE] == 0
    for key, count in seen.items():
        assert k.sketch_estimate(t.sketch, key) >= count


@pytest.mark.parametrize("capacity", [1, 3, 64])
def test_slots_are_a_power_of_two_at_least_twice_the_capacity(capacity: int) -> None:
    t = HashTableArrays.allocate(capacity, k.EVICT_NONE)
    s = t.slots.shape[0]
    assert s >= 2 * capacity and s & (s - 1) == 0 and (t.slots[:, 1] == -1).all()
