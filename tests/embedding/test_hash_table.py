"""HashTable: policies from DynamicConfig, missing keys, admission, stats, contents, checkpoints, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.embedding.config import DynamicConfig, Eviction, Missing
from hugerec.embedding.hash_table import HashTable
from hugerec.ops import hash_table as ht

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


def test_remap_features_matches_one_table_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """FeatureRemap (single-span tables side by side in one kernel, the rest one by one) gives the
    rows, resets and table states that separate find_or_insert calls give, for every policy, batch
    after batch: with explicit steps and with NEXT, across a table's first eviction (a new heap) and
    across a reload of every table (new arrays), which the kept kernel arguments must follow."""
    from hugerec.embedding import hash_table
    from hugerec.embedding.hash_table import NEXT, FeatureRemap, remap_features
    from hugerec.sparse.features import SparseFeatures

    monkeypatch.setattr(hash_table, "_PARALLEL_MIN_KEYS", 0)  # the side-by-side paths even for tiny batches

    policies = {
        "lru": (60, DynamicConfig(eviction=Eviction.LRU)),
        "lfu": (40, DynamicConfig(eviction=Eviction.LFU, missing=Missing.UNKNOWN_ROW)),
        "ttl": (80, DynamicConfig(eviction=Eviction.TTL, ttl_steps=2)),
        "admit": (500, DynamicConfig(min_count=2, missing=Missing.UNKNOWN_ROW)),
        "shared": (500, DynamicConfig(eviction=Eviction.LRU)),  # two features: the one-table path
    }
    features = {"lru": ("a",), "lfu": ("b",), "ttl": ("c",), "admit": ("d",), "shared": ("e", "f")}

    def make() -> dict[str, HashTable]:
        return {n: HashTable(cap, policy, n) for n, (cap, policy) in policies.items()}

    together, alone = make(), make()
    remap = FeatureRemap(together, features)
    rng = np.random.default_rng(5)
    for step in range(1, 19):
        lists = {
            f: [[int(k) for k in rng.integers(-50, 50, size=rng.integers(0, 4))] for _ in range(8)] for f in "abcdef"
        }
        batch = SparseFeatures.from_lists(lists)
        if step in (5, 6, 10, 11):  # rows freed after evictions: later inserts must reach the new heaps
            gone = torch.arange(-50, 50, 3 + step)
            for name in policies:
                assert together[name].remove(gone).tolist() == alone[name].remove(gone).tolist()
        if step == 9:  # every table gets new arrays: the remap must not write into the old ones
            for table in [*together.values(), *alone.values()]:  # both: a reload compacts the heap
                table.load_state_dict(table.state_dict())
        rows, reset = remap(batch, NEXT if step % 3 == 0 else {n: step for n in policies})
        for name, feats in features.items():
            keys = torch.cat([batch[f].values for f in feats])
            ins = alone[name].find_or_insert(keys, step)
            got = torch.cat([rows[slice(*_span(batch, f))] for f in feats])
            assert got.tolist() == ins.rows.tolist(), (name, step)
            expected_reset = ins.reset_rows.tolist()
            assert (reset[name].tolist() if name in reset else []) == expected_reset, (name, step)
            a, b = together[name].state_dict(), alone[name].state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a), (name, step)
        # eval: find only, missing keys get the unknown row or -1, nothing changes
        rows, reset = remap_features(batch, together, features, None)
        assert reset == {}
        for name, feats in features.items():
            keys = torch.cat([batch[f].values for f in feats])
            got = torch.cat([rows[slice(*_span(batch, f))] for f in feats])
            assert got.tolist() == alone[name].find(keys).tolist(), (name, step)
    assert sum(t.stats().evictions + t.stats().expired for t in together.values()) > 0


def _span(batch: object, feature: str) -> tuple[int, int]:
    keys = list(batch.keys)  # type: ignore[attr-defined]
    lengths = batch.lengths.view(len(keys), -1).sum(dim=1).tolist()  # type: ignore[attr-defined]
    start = sum(lengths[: keys.index(feature)])
    return start, start + lengths[keys.index(feature)]


def test_feature_remap_follows_a_table_that_got_its_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table's first eviction gives it a heap in the one-table path; inserts of later batches on the
    side-by-side path must push into that heap, or LFU evicts the wrong rows afterwards."""
    from hugerec.embedding import hash_table
    from hugerec.embedding.hash_table import NEXT, FeatureRemap
    from hugerec.sparse.features import SparseFeatures

    monkeypatch.setattr(hash_table, "_PARALLEL_MIN_KEYS", 0)
    policy = DynamicConfig(eviction=Eviction.LFU)
    together = {n: HashTable(8, policy, n) for n in ("a", "b")}
    alone = {n: HashTable(8, policy, n) for n in ("a", "b")}
    remap = FeatureRemap(together, {"a": ("a",), "b": ("b",)})
    batches = [
        [list(range(8)) * 3],  # fills the tables, each key seen 3 times
        [[8, 9]],  # full: the first eviction, which allocates the heap
        [[20, 21, 22, 23]],  # after the removal below: fit the free rows, counted once
        [[30, 31, 32, 33]],  # full again: LFU must evict two of them
    ]
    for step, lists in enumerate(batches, start=1):
        if step == 3:
            for tables in (together, alone):
                for t in tables.values():
                    t.remove(torch.tensor([2, 3, 4, 5]))  # keys 6..9 stay, 4 rows free
        batch = SparseFeatures.from_lists({"a": lists, "b": lists})
        rows, _ = remap(batch, NEXT)
        for i, name in enumerate(("a", "b")):
            expected = alone[name].find_or_insert(batch[name].values, step).rows
            assert rows[i * len(lists[0]) : (i + 1) * len(lists[0])].tolist() == expected.tolist(), (name, step)
            assert together[name].export().keys.tolist() == alone[name].export().keys.tolist(), (name, step)
    # LFU (count, last step, row): 8, 9 (once, step 2) go first, then of 20..23 (once, step 3) the two
    # in the lowest rows: the freed rows 2..5 came off the stack as 5, 4, 3, 2, so 23 and 22
    assert sorted(together["a"].export().keys.tolist()) == [6, 7, 20, 21, 30, 31, 32, 33]
