"""FeatureRemap: every dynamic table of a batch remapped at once equals one table at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.embedding.hash_table import HashTable
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing


def test_remap_features_matches_one_table_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """FeatureRemap (single-span tables side by side in one kernel, the rest one by one) gives the
    rows, resets and table states that separate find_or_insert calls give, for every policy, batch
    after batch: with explicit steps and with NEXT, across a table's first eviction (a new heap) and
    across a reload of every table (new arrays), which the kept kernel arguments must follow."""
    from hugerec.embedding import feature_remap
    from hugerec.embedding.feature_remap import NEXT, FeatureRemap, remap_features
    from hugerec.sparse.features import SparseFeatures

    monkeypatch.setattr(feature_remap, "_PARALLEL_MIN_KEYS", 0)  # the side-by-side paths even for tiny batches

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
    from hugerec.embedding import feature_remap
    from hugerec.embedding.feature_remap import NEXT, FeatureRemap
    from hugerec.sparse.features import SparseFeatures

    monkeypatch.setattr(feature_remap, "_PARALLEL_MIN_KEYS", 0)
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


def test_tables_on_a_device_remap_as_on_the_host() -> None:
    """Tables moved to a device (Triton kernels; interpreted on the CPU without CUDA) give the host tables'
    rows and resets, batch after batch, a table shared by two features included; eval lookups too."""
    pytest.importorskip("triton")
    from hugerec.embedding.feature_remap import NEXT, FeatureRemap
    from hugerec.sparse.features import SparseFeatures

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policies = {
        "lru": (12, DynamicConfig(eviction=Eviction.LRU)),
        "admit": (40, DynamicConfig(min_count=2, missing=Missing.UNKNOWN_ROW)),
        "shared": (40, DynamicConfig(eviction=Eviction.LFU)),
    }
    features = {"lru": ("a",), "admit": ("b",), "shared": ("c", "d")}

    def make() -> dict[str, HashTable]:
        return {n: HashTable(cap, policy, n) for n, (cap, policy) in policies.items()}

    host_tables, device_tables = make(), make()
    for t in device_tables.values():
        t.move(device)
    host, on_device = FeatureRemap(host_tables, features), FeatureRemap(device_tables, features)
    rng = np.random.default_rng(7)
    for step in range(1, 6):
        lists = {f: [[int(k) for k in rng.integers(-9, 9, size=rng.integers(0, 3))] for _ in range(3)] for f in "abcde"}
        batch = SparseFeatures.from_lists(lists)
        steps = None if step == 4 else NEXT
        want_rows, want_reset = host(batch, steps)
        got_rows, got_reset = on_device(batch.to(device), steps)
        assert got_rows.cpu().tolist() == want_rows.tolist(), step
        assert {k: v.cpu().tolist() for k, v in got_reset.items()} == {k: v.tolist() for k, v in want_reset.items()}
