"""Hash-table kernels == the dict reference on random operation sequences (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.ops import hash_table_arrays as ht
from hugerec.ops.cpu import hash_table_kernels as layout

I64_MIN, I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
# a small key pool so sequences hit, miss, collide in batches and fill tables; it includes the int64
# limits and the values an implementation might be tempted to use as empty-slot sentinels
SPECIAL = [I64_MIN, I64_MIN + 1, I64_MAX, I64_MAX - 1, -1, 0, 1]
POLICIES = [ht.EVICT_NONE, ht.EVICT_LRU, ht.EVICT_LFU, ht.EVICT_TTL]

keys_st = st.lists(st.one_of(st.integers(-12, 12), st.sampled_from(SPECIAL)), max_size=24)
op_st = st.one_of(
    st.tuples(st.just("insert"), keys_st),
    st.tuples(st.just("insert again"), keys_st),  # another call at the same step
    st.tuples(st.just("remove"), keys_st),
    st.tuples(st.just("skip"), st.integers(1, 4)),  # let steps pass (TTL)
)


def _arr(keys: list[int]) -> np.ndarray:
    return np.array(keys, dtype=np.int64)


def _check_same(kern: ht.HashTableArrays, ref: ht.DictHashTable) -> None:
    probe = _arr([*range(-14, 15), *SPECIAL])
    assert ht.lookup(kern, probe).tolist() == ref.lookup(probe.tolist())
    assert kern.counter(layout.SIZE) == len(ref.row_of)
    for name, index in [
        ("inserts", layout.INSERTS),
        ("evictions", layout.EVICTIONS),
        ("expired", layout.EXPIRED),
        ("refused", layout.REFUSED),
        ("removed", layout.REMOVED),
    ]:
        assert kern.counter(index) == ref.stats[name], name
    held = np.flatnonzero(kern.row_state == layout.USED)
    assert sorted(held.tolist()) == sorted(ref.row_of.values())
    # the rows touched at the last step (never evicted for keys of that same step)
    touched = int((kern.info[held, layout.LAST] == kern.counter(layout.STEP)).sum())
    assert kern.counter(layout.TOUCHED) == touched
    for r in held:
        key, last, count, _ = kern.info[r]
        assert (key, last, count) == (ref.key_of[r], ref.last_step[r], ref.count[r])


@settings(max_examples=150, deadline=None)
@given(
    capacity=st.integers(1, 12),
    eviction=st.sampled_from(POLICIES),
    min_count=st.sampled_from([1, 1, 2, 3]),
    ops=st.lists(op_st, max_size=25),
)
def test_kernels_match_dict_reference(capacity: int, eviction: int, min_count: int, ops: list) -> None:
    ttl = 2
    kern = ht.HashTableArrays.allocate(capacity, eviction, 4, 1 << 16)
    ref = ht.DictHashTable(capacity, eviction, min_count)
    step = 0
    last = 0  # step of the last successful find_or_insert
    for kind, arg in ops:
        if kind == "skip":
            step += arg
            continue
        if kind == "remove":
            assert ht.remove(kern, _arr(arg)).tolist() == ref.remove(arg)
            _check_same(kern, ref)
            continue
        now = last if kind == "insert again" else step
        if eviction == ht.EVICT_TTL:
            assert ht.expire(kern, now, ttl) == ref.expire(now, ttl)
        try:
            expected = ref.find_or_insert(arg, now)
        except ValueError:
            with pytest.raises(ValueError, match=r"full|capacity"):
                ht.find_or_insert(kern, _arr(arg), now, eviction, min_count)
        else:
            rows, reset = ht.find_or_insert(kern, _arr(arg), now, eviction, min_count)
            assert (rows.tolist(), reset.tolist()) == expected
            last = now
        _check_same(kern, ref)
        step = max(step, now + 1)


def test_rows_are_collision_free_and_handed_out_in_order() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(I64_MIN, I64_MAX, size=5000, dtype=np.int64)
    keys = np.concatenate([keys, _arr(SPECIAL)])
    t = ht.HashTableArrays.allocate(keys.size, ht.EVICT_NONE)
    rows, reset = ht.find_or_insert(t, keys, 0, ht.EVICT_NONE)
    _, first = np.unique(keys, return_index=True)
    assert np.unique(rows).size == np.unique(keys).size  # no two keys share a row
    assert sorted(rows[np.sort(first)].tolist()) == rows[np.sort(first)].tolist()  # 0, 1, 2, ... by first sight
    assert reset.size == 0
    assert np.array_equal(ht.lookup(t, keys), rows)


def test_remove_keeps_probe_chains_intact() -> None:
    # many keys in a small table force long clusters; removing half must not hide the other half
    keys = np.arange(-300, 300, dtype=np.int64) * 1_000_003
    t = ht.HashTableArrays.allocate(keys.size, ht.EVICT_NONE)
    rows, _ = ht.find_or_insert(t, keys, 0, ht.EVICT_NONE)
    gone = keys[::2]
    assert np.array_equal(ht.remove(t, gone), rows[::2])
    assert np.array_equal(ht.lookup(t, keys[1::2]), rows[1::2])
    assert (ht.lookup(t, gone) == -1).all()


def test_lru_evicts_least_recent_and_spares_the_batch() -> None:
    t = ht.HashTableArrays.allocate(3, ht.EVICT_LRU)
    ht.find_or_insert(t, _arr([10, 11, 12]), 0, ht.EVICT_LRU)  # rows 0, 1, 2
    ht.find_or_insert(t, _arr([10, 12]), 1, ht.EVICT_LRU)
    rows, reset = ht.find_or_insert(t, _arr([12, 13]), 2, ht.EVICT_LRU)
    assert rows.tolist() == [2, 1] and reset.tolist() == [1]  # 11 (seen at step 0) made room
    rows, _ = ht.find_or_insert(t, _arr([14, 15, 12]), 3, ht.EVICT_LRU)
    assert ht.lookup(t, _arr([10, 13])).tolist() == [-1, -1]  # evicted oldest first: 10 (step 1), then 13
    assert rows.tolist() == [0, 1, 2]


def test_lfu_evicts_least_frequent() -> None:
    t = ht.HashTableArrays.allocate(2, ht.EVICT_LFU)
    ht.find_or_insert(t, _arr([1, 1, 1, 2]), 0, ht.EVICT_LFU)  # counts: 1 -> 3, 2 -> 1
    ht.find_or_insert(t, _arr([2]), 1, ht.EVICT_LFU)  # 2 -> 2, more recent than 1 but rarer
    ht.find_or_insert(t, _arr([3]), 2, ht.EVICT_LFU)
    assert ht.lookup(t, _arr([1, 2, 3])).tolist() == [0, -1, 1]


def test_ttl_expires_unseen_rows() -> None:
    t = ht.HashTableArrays.allocate(4, ht.EVICT_TTL)
    ht.find_or_insert(t, _arr([1, 2]), 0, ht.EVICT_TTL)
    ht.find_or_insert(t, _arr([2]), 3, ht.EVICT_TTL)
    assert ht.expire(t, 5, 4) == 1  # key 1: not seen for 5 > 4 steps
    assert ht.lookup(t, _arr([1, 2])).tolist() == [-1, 1]


def test_errors_leave_the_table_unchanged() -> None:
    t = ht.HashTableArrays.allocate(2, ht.EVICT_NONE)
    ht.find_or_insert(t, _arr([5]), 0, ht.EVICT_NONE)
    before = t.meta.copy(), t.slots.copy()
    with pytest.raises(ValueError, match="eviction NONE"):
        ht.find_or_insert(t, _arr([5, 6, 7]), 1, ht.EVICT_NONE)
    assert np.array_equal(before[0], t.meta) and np.array_equal(before[1], t.slots)
    lru = ht.HashTableArrays.allocate(2, ht.EVICT_LRU)
    ht.find_or_insert(lru, _arr([5, 6]), 0, ht.EVICT_LRU)
    with pytest.raises(ValueError, match="capacity is 2"):
        ht.find_or_insert(lru, _arr([5, 6, 7]), 1, ht.EVICT_LRU)
    assert ht.lookup(lru, _arr([5, 6, 7])).tolist() == [0, 1, -1]
    ht.find_or_insert(lru, _arr([5]), 3, ht.EVICT_LRU)
    with pytest.raises(ValueError, match="step 2 is before the last step seen"):
        ht.find_or_insert(lru, _arr([5]), 2, ht.EVICT_LRU)


def test_count_min_sketch_never_underestimates() -> None:
    t = ht.HashTableArrays.allocate(4, ht.EVICT_LRU, 2, 64)  # tiny sketch: collisions on purpose
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 500, size=2000, dtype=np.int64)
    for step, batch in enumerate(np.array_split(keys, 20)):
        ht.find_or_insert(t, batch, step, ht.EVICT_LRU, min_count=10_000)  # never admits: all counted
    true = np.bincount(keys, minlength=500)
    est = np.array([ht.sketch_estimate(t, k) for k in range(500)])
    assert (est >= true).all()
    assert t.counter(layout.SIZE) == 0


@settings(max_examples=60, deadline=None)
@given(
    eviction=st.sampled_from(POLICIES),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("insert"), st.lists(st.integers(-30, 30), min_size=17, max_size=80)),
            st.tuples(st.just("remove"), keys_st),
        ),
        max_size=12,
    ),
)
def test_one_pass_insertion_matches_dict_reference(eviction: int, ops: list) -> None:
    """Batches longer than the kernel's prefetch distance, with repeats of new keys inside it, into a
    table whose free rows outnumber them (the one-pass path), and removals that free rows for reuse."""
    kern = ht.HashTableArrays.allocate(200, eviction)
    ref = ht.DictHashTable(200, eviction, 1)
    for step, (kind, arg) in enumerate(ops):
        if kind == "remove":
            assert ht.remove(kern, _arr(arg)).tolist() == ref.remove(arg)
        else:
            rows, reset = ht.find_or_insert(kern, _arr(arg), step, eviction)
            assert (rows.tolist(), reset.tolist()) == ref.find_or_insert(arg, step)
        _check_same(kern, ref)


def _copy(t: ht.HashTableArrays) -> ht.HashTableArrays:
    return ht.HashTableArrays(*(np.array(getattr(t, f), copy=True) for f in ht.HashTableArrays.__dataclass_fields__))


def test_tables_side_by_side_match_one_table_calls() -> None:
    """find_or_insert_tables == find_or_insert per table (after expire for TTL), and a table that
    cannot take its keys as they are comes back unchanged (bar its span of rows), marked None."""
    rng = np.random.default_rng(3)
    ttl = 2
    specs = [  # (capacity, eviction, min_count)
        (500, ht.EVICT_LRU, 1),
        (40, ht.EVICT_LRU, 1),  # fills up and evicts: needs a heap on its first eviction
        (30, ht.EVICT_LFU, 1),
        (60, ht.EVICT_TTL, 1),
        (300, ht.EVICT_NONE, 2),
        (35, ht.EVICT_NONE, 1),  # fills up: every later batch with new keys is refused
    ]
    batched = [ht.HashTableArrays.allocate(c, e, 4, 1 << 12) for c, e, _ in specs]
    alone = [_copy(t) for t in batched]
    handed_back = 0
    for step in range(12):
        sizes = rng.integers(0, 30, size=len(specs))
        keys = np.concatenate([rng.integers(-60, 60, size=n) for n in sizes]).astype(np.int64)
        spans = [(int(a), int(a + n)) for a, n in zip(np.cumsum(sizes) - sizes, sizes, strict=True)]
        rows = np.full_like(keys, -99)
        pack = ht.TablePack(
            batched,
            [e for _, e, _ in specs],
            [m for _, _, m in specs],
            [ttl if e == ht.EVICT_TTL else -1 for _, e, _ in specs],
            [-1] * len(specs),
        )
        starts = np.asarray([a for a, _ in spans], dtype=np.int64)
        ends = np.asarray([b for _, b in spans], dtype=np.int64)
        # odd steps given; on even ones, tables whose last step was step - 1 are asked for their next step
        steps = np.asarray(
            [-1 if step % 2 == 0 and step > 0 and t.meta[layout.STEP] == step - 1 else step for t in batched],
            dtype=np.int64,
        )
        reset = np.empty_like(keys)
        status = ht.find_or_insert_tables(pack, keys, starts, ends, rows, steps, reset).copy()
        assert steps.tolist() == [step] * len(specs)  # "next" was written back as the step it means
        resets: list[np.ndarray | None] = [
            reset[a : a + n] if code == ht.OK else None
            for a, (code, n) in zip(starts, status[:, :2].tolist(), strict=True)
        ]
        for i, ((a, b), (_, eviction, min_count)) in enumerate(zip(spans, specs, strict=True)):
            if eviction == ht.EVICT_TTL:
                ht.expire(alone[i], step, ttl)
            try:
                expected, expected_reset = ht.find_or_insert(alone[i], keys[a:b], step, eviction, min_count)
            except ValueError:
                expected = None
            if resets[i] is None:
                handed_back += 1
                if expected is not None:  # the kernel needed a heap: the one-table call made it and went on
                    assert eviction != ht.EVICT_NONE
                    got, got_reset = ht.find_or_insert(batched[i], keys[a:b], step, eviction, min_count)
                    rows[a:b] = got
                    resets[i] = got_reset
            if expected is not None:
                assert rows[a:b].tolist() == expected.tolist()
                assert resets[i] is not None and resets[i].tolist() == expected_reset.tolist()
            for field in ("slots", "info", "row_state", "free", "sketch", "meta"):
                assert np.array_equal(getattr(batched[i], field), getattr(alone[i], field)), (i, field)
    assert handed_back >= 3


def test_lru_evicts_several_rows_in_score_order() -> None:
    """Several evictions in one batch take the least recent rows first, ties by row: not in row order."""
    t = ht.HashTableArrays.allocate(4, ht.EVICT_LRU)
    ref = ht.DictHashTable(4, ht.EVICT_LRU, 1)
    batches = [[10, 11, 12, 13], [10, 11], [10, 13], [20, 21, 22, 10]]  # last steps: rows 0:2, 1:1, 2:0, 3:2
    for step, keys in enumerate(batches):
        rows, reset = ht.find_or_insert(t, _arr(keys), step, ht.EVICT_LRU)
        assert (rows.tolist(), reset.tolist()) == ref.find_or_insert(keys, step)
    # 20 -> row 2 (step 0), 21 -> row 1 (step 1), 22 -> row 3 (step 2; row 0 is touched by this batch)
    assert rows.tolist() == [2, 1, 3, 0]
