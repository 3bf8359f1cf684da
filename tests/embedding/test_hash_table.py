"""HashTable: policies from DynamicConfig, missing keys, admission, stats, contents, checkpoints, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.embedding.hash_table import HashTable
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing
from hugerec.ops import hash_table_arrays as ht

I64_MIN, I64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


def _t(*keys: int) -> torch.Tensor:
    return torch.tensor(keys, dtype=torch.int64)


def test_extreme_and_sentinel_like_keys_are_ordinary_keys() -> None:
    table = HashTable(8, DynamicConfig(eviction=Eviction.NONE))
    keys = _t(I64_MIN, I64_MAX, -1, 0, I64_MIN + 1, I64_MAX - 1)
    rows = table.find_or_insert(keys, step=0).rows
    assert rows.tolist() == [0, 1, 2, 3, 4, 5]
    assert torch.equal(table.find(keys), rows)
    assert table.find(_t(7)).tolist() == [-1]
    assert table.remove(_t(-1, I64_MIN)).tolist() == [2, 0]
    assert table.find(keys).tolist() == [-1, 1, -1, 3, 4, 5]


def test_unknown_row_is_the_last_row_and_takes_missing_and_refused_keys() -> None:
    table = HashTable(4, DynamicConfig(missing=Missing.UNKNOWN_ROW, min_count=2, sketch_width=1 << 12))
    assert (table.unknown_row, table.key_capacity) == (3, 3)
    assert table.find_or_insert(_t(5, 6), step=0).rows.tolist() == [3, 3]  # seen once: not admitted yet
    assert table.find_or_insert(_t(5, 7, 7), step=1).rows.tolist() == [0, 1, 1]  # 5 twice overall, 7 twice here
    assert table.find(_t(5, 6, 7)).tolist() == [0, 3, 1]
    assert table.stats().refused == 2  # 5 and 6 at step 0


def test_zeros_missing_maps_to_minus_one_and_admission_bypass() -> None:
    table = HashTable(4, DynamicConfig(min_count=3, sketch_width=1 << 12))
    assert table.find_or_insert(_t(1, 1), step=0).rows.tolist() == [-1, -1]
    assert table.find_or_insert(_t(1, 2), step=1).rows.tolist() == [0, -1]
    assert table.find_or_insert(_t(9), step=1, admit_all=True).rows.tolist() == [1]


def test_eviction_resets_rows_and_counts_in_stats() -> None:
    table = HashTable(2, DynamicConfig(eviction=Eviction.LRU))
    table.find_or_insert(_t(1, 2), step=0)
    ins = table.find_or_insert(_t(2, 3), step=1)
    assert ins.rows.tolist() == [1, 0] and ins.reset_rows.tolist() == [0]
    s = table.stats()
    assert (s.size, s.capacity, s.load_factor, s.inserts, s.evictions) == (2, 2, 1.0, 3, 1)
    assert s.as_dict()["evictions"] == 1.0


def test_ttl_expires_before_the_lookup() -> None:
    table = HashTable(4, DynamicConfig(eviction=Eviction.TTL, ttl_steps=2))
    table.find_or_insert(_t(1, 2), step=0)
    table.find_or_insert(_t(2), step=2)
    ins = table.find_or_insert(_t(3), step=3)  # key 1 unseen for 3 > 2 steps: gone first
    assert table.find(_t(1, 2, 3)).tolist() == [-1, 1, ins.rows.item()]
    assert table.stats().expired == 1


def test_find_changes_nothing() -> None:
    table = HashTable(4)
    table.find_or_insert(_t(1), step=0)
    before = table.state_dict()
    table.find(_t(1, 2, 3))
    after = table.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_changed_since_lists_exactly_the_keys_touched_after_the_step() -> None:
    table = HashTable(16)
    table.find_or_insert(_t(1, 2, 3), step=0)
    table.find_or_insert(_t(2, 4), step=1)
    table.find_or_insert(_t(5, 4), step=2)
    assert sorted(table.changed_since(0).keys.tolist()) == [2, 4, 5]
    assert sorted(table.changed_since(1).keys.tolist()) == [4, 5]
    assert table.changed_since(2).keys.numel() == 0
    assert sorted(table.changed_since(-1).keys.tolist()) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("eviction", list(Eviction))
def test_state_dict_restores_a_table_that_then_behaves_identically(eviction: Eviction) -> None:
    policy = DynamicConfig(eviction=eviction, ttl_steps=3, min_count=2, sketch_width=1 << 10, sketch_depth=2)
    rng = np.random.default_rng(0)
    a = HashTable(40, policy)
    steps = [rng.integers(0, 60, size=30) for _ in range(12)]
    for step, keys in enumerate(steps[:6]):
        if step == 3:
            a.remove(keys[:2])
        try:
            a.find_or_insert(keys, step)
        except ValueError:
            assert eviction is Eviction.NONE
    b = HashTable(40, policy)
    b.load_state_dict(a.state_dict())
    for step, keys in enumerate(steps[6:], start=6):
        try:
            ia = a.find_or_insert(keys, step)
        except ValueError:
            with pytest.raises(ValueError):
                b.find_or_insert(keys, step)
            continue
        ib = b.find_or_insert(keys, step)
        assert torch.equal(ia.rows, ib.rows) and torch.equal(ia.reset_rows, ib.reset_rows)
    assert a.stats() == b.stats()


def test_load_installs_an_exported_mapping() -> None:
    a = HashTable(10, DynamicConfig(eviction=Eviction.LFU))
    a.find_or_insert(_t(7, 8, 9), step=0)
    a.remove(_t(8))
    b = HashTable(10, DynamicConfig(eviction=Eviction.LFU))
    b.load(a.export())
    assert torch.equal(b.find(_t(7, 8, 9)), a.find(_t(7, 8, 9)))
    assert b.step == 0 and len(b) == 2
    assert b.find_or_insert(_t(10), step=1).rows.tolist() == [1]  # lowest free row; it was fresh in b
    with pytest.raises(ValueError, match="duplicate keys"):
        b.load(type(a.export())(_t(1, 1), _t(0, 1), _t(0, 0), _t(1, 1)))
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 10\)"):
        b.load(type(a.export())(_t(1), _t(10), _t(0), _t(1)))


def test_uint64_keys_are_reinterpreted_and_small_ints_widened() -> None:
    table = HashTable(4)
    big = np.array([2**64 - 1, 5], dtype=np.uint64)
    rows = table.find_or_insert(big, step=0).rows
    assert torch.equal(table.find(_t(-1, 5)), rows)
    assert torch.equal(table.find(torch.tensor([5], dtype=torch.int32)), rows[1:])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: HashTable(0), "capacity must be an int >= 1, got 0"),
        (lambda: HashTable(1, DynamicConfig(missing=Missing.UNKNOWN_ROW)), "capacity must be an int >= 2"),
        (lambda: HashTable(2.5), "capacity must be"),  # type: ignore[arg-type]  # bad input on purpose
        (lambda: HashTable(4).find_or_insert(torch.tensor([1.5]), 0), "keys must be integers, got dtype float32"),
        (lambda: HashTable(4).find(torch.zeros(2, 2, dtype=torch.int64)), r"keys must be 1-D \[N\]"),
        (lambda: HashTable(4).find_or_insert(_t(1), -1), "step must be an int >= 0, got -1"),
        (lambda: HashTable(4).find_or_insert(torch.tensor([True]), 0), "keys must be integers, got dtype bool"),
        (lambda: HashTable(4, DynamicConfig(min_count=70_000)), "exceeds the sketch's counter limit"),
    ],
)
def test_bad_input_raises_clearly(make: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()  # type: ignore[operator]  # the parametrized callables


def test_full_table_without_eviction_raises_and_keeps_its_keys() -> None:
    table = HashTable(3, DynamicConfig(eviction=Eviction.NONE), name="user")
    table.find_or_insert(_t(1, 2), step=0)
    with pytest.raises(ValueError, match=r"HashTable 'user'.find_or_insert: full \(2 of 3 rows held\) and 2 new"):
        table.find_or_insert(_t(3, 4, 1), step=1)
    assert table.find(_t(1, 2, 3)).tolist() == [0, 1, -1]


def test_large_random_workload_matches_reference() -> None:
    # a bigger table than the property tests use: many evictions, rebuilt heaps, long probe chains
    rng = np.random.default_rng(3)
    table = HashTable(300, DynamicConfig(eviction=Eviction.LFU))
    ref = ht.DictHashTable(300, ht.EVICT_LFU)
    for step in range(60):
        keys = (rng.zipf(1.3, size=200) % 2000).astype(np.int64) * 7919 - 10**6
        rows = table.find_or_insert(keys, step)
        expected_rows, expected_reset = ref.find_or_insert(keys.tolist(), step)
        assert rows.rows.tolist() == expected_rows
        assert rows.reset_rows.tolist() == expected_reset
        if step % 10 == 5:
            gone = keys[:20]
            assert table.remove(gone).tolist() == ref.remove(gone.tolist())


def test_rows_can_be_written_into_a_given_tensor() -> None:
    table = HashTable(8, DynamicConfig(missing=Missing.UNKNOWN_ROW))
    buf = torch.full((5,), 99, dtype=torch.int64)
    ins = table.find_or_insert(_t(4, 5), step=0, out=buf[1:3])
    assert buf.tolist() == [99, 0, 1, 99, 99] and ins.rows.data_ptr() == buf[1:3].data_ptr()
    table.find(_t(5, 6), out=buf[3:])
    assert buf.tolist() == [99, 0, 1, 1, 7]  # 6 is missing: the unknown row
    with pytest.raises(ValueError, match=r"out must be a contiguous CPU int64 tensor of shape \(2,\)"):
        table.find(_t(5, 6), out=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="out must be"):
        table.find(_t(5, 6), out=torch.zeros(2, dtype=torch.int32))


def test_advance_to_moves_the_clock_and_expires_like_a_step() -> None:
    """advance_to(s) is an empty training step at s: the clock moves, TTL rows past their time expire,
    a step at or behind the clock changes nothing, a bad step is refused."""
    ttl = HashTable(16, DynamicConfig(eviction=Eviction.TTL, ttl_steps=2), "t")
    twin = HashTable(16, DynamicConfig(eviction=Eviction.TTL, ttl_steps=2), "t")
    for t in (ttl, twin):
        t.find_or_insert(torch.tensor([1, 2, 3]), step=1)
    ttl.advance_to(5)
    twin.find_or_insert(torch.zeros(0, dtype=torch.int64), step=5)
    assert ttl.step == 5 and len(ttl) == 0
    assert all(torch.equal(a, b) for a, b in zip(ttl.state_dict().values(), twin.state_dict().values(), strict=True))
    ttl.advance_to(3)  # behind the clock: nothing
    assert ttl.step == 5
    with pytest.raises(ValueError, match="advance_to: step must be an int >= 0, got -1"):
        ttl.advance_to(-1)


def test_load_with_a_sketch_takes_the_other_tables_admission_counts() -> None:
    """load(contents, sketch=...) carries the admission counts over: a key seen once in the source is
    admitted at its second sighting in the target, as it would be in the source."""
    policy = DynamicConfig(min_count=2)
    source, target, plain = (HashTable(32, policy, n) for n in ("s", "t", "p"))
    source.find_or_insert(torch.tensor([7, 8, 8]), step=1)  # 8 admitted, 7 seen once
    target.load(source.export(), sketch=source.state_dict()["sketch"])
    plain.load(source.export())
    assert sorted(target.export().keys.tolist()) == [8]
    assert target.find_or_insert(torch.tensor([7]), step=2).rows.tolist() != [-1]  # second sighting
    assert plain.find_or_insert(torch.tensor([7]), step=2).rows.tolist() == [-1]  # first, for a table without it
    with pytest.raises(ValueError, match="sketch shape"):
        HashTable(32, DynamicConfig(min_count=2, sketch_width=64), "w").load(
            source.export(), sketch=source.state_dict()["sketch"]
        )


def test_kernel_view_follows_the_arrays_and_policy() -> None:
    table = HashTable(10, DynamicConfig(eviction=Eviction.TTL, ttl_steps=3, missing=Missing.UNKNOWN_ROW), "k")
    view = table.kernel_view()
    assert (view.eviction, view.ttl, view.unknown_row, view.min_count) == (ht.EVICT_TTL, 3, 9, 1)
    table.load_state_dict(table.state_dict())  # new arrays: a new view sees them
    assert table.kernel_view().arrays is not view.arrays
