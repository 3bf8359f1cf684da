"""RowCache: never a wrong row, bounded, and one set behaves exactly as an LRU of W rows (OrderedDict oracle)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.serving.store.cache import CacheConfig, CachePolicy, RowCache

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def row_of(keys: torch.Tensor, dim: int = 4) -> torch.Tensor:
    """A row that encodes its key, so a wrong row is visible."""
    return keys.to(torch.float32).unsqueeze(1).repeat(1, dim) + torch.arange(dim, dtype=torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", list(CachePolicy))
def test_hits_return_the_inserted_rows_and_capacity_is_bounded(device: str, policy: CachePolicy) -> None:
    cache = RowCache(4, CacheConfig(rows=64, policy=policy, ways=4), device)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        keys = torch.randint(-(2**62), 2**62, (40,), generator=gen)
        keys[:10] = torch.arange(10)  # some keys every round: they get hot
        cache.insert(keys, row_of(keys))
        rows, found = cache.get(keys)
        assert torch.equal(rows[found].cpu(), row_of(keys[found.cpu()]))
        assert len(cache) <= cache.capacity == 64
    rows, found = cache.get(torch.arange(10))
    assert found.sum() >= 5, "rows touched every round should mostly stay cached"


@pytest.mark.parametrize("device", DEVICES)
def test_refresh_and_invalidate(device: str) -> None:
    cache = RowCache(4, CacheConfig(rows=32, ways=4), device)
    keys = torch.tensor([1, 2, 3, -(2**63), 2**63 - 1])
    cache.insert(keys, row_of(keys))
    cache.refresh(torch.tensor([2, 99]), torch.full((2, 4), 7.0))
    rows, found = cache.get(keys)
    assert found.all()
    assert torch.equal(rows[1].cpu(), torch.full((4,), 7.0))
    assert not cache.get(torch.tensor([99]))[1].item()  # refresh never inserts
    cache.invalidate(torch.tensor([3, 12345]))
    _, found = cache.get(keys)
    assert found.cpu().tolist() == [True, True, False, True, True]


def test_duplicate_inserts_keep_one_copy() -> None:
    cache = RowCache(4, CacheConfig(rows=16, ways=16), "cpu")
    keys = torch.tensor([5, 5, 6, 5])
    cache.insert(keys, row_of(keys))
    cache.insert(keys, row_of(keys))
    assert len(cache) == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60))
def test_one_set_is_exactly_lru(ops: list[tuple[bool, int]]) -> None:
    # one key per call: keys inserted or hit in one call share a tick, so their relative age is not defined
    ways = 4
    cache = RowCache(4, CacheConfig(rows=ways, ways=ways, policy=CachePolicy.LRU), "cpu")
    oracle: OrderedDict[int, None] = OrderedDict()
    for is_insert, k in ops:
        key = torch.tensor([k])
        if is_insert:
            if k not in oracle:
                if len(oracle) == ways:
                    oracle.popitem(last=False)
                oracle[k] = None
            cache.insert(key, row_of(key))
        else:
            rows, found = cache.get(key)
            assert bool(found[0]) == (k in oracle)
            if k in oracle:
                assert torch.equal(rows, row_of(key))
                oracle.move_to_end(k)
    assert len(cache) == len(oracle)


def test_lfu_keeps_frequent_rows() -> None:
    cache = RowCache(1, CacheConfig(rows=4, ways=4, policy=CachePolicy.LFU), "cpu")
    hot = torch.tensor([1, 2])
    cache.insert(hot, row_of(hot, 1))
    for _ in range(3):
        cache.get(hot)
    for k in range(10, 30):  # a scan of one-off keys
        cache.insert(torch.tensor([k]), row_of(torch.tensor([k]), 1))
    _, found = cache.get(hot)
    assert found.all()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="ways"):
        CacheConfig(ways=0)
    with pytest.raises(ValueError, match="rows"):
        CacheConfig(rows=-1)
    assert CacheConfig(policy="lfu").policy is CachePolicy.LFU  # type: ignore[arg-type]  # JSON/CLI strings
    with pytest.raises(ValueError, match="capacity"):
        RowCache(4, CacheConfig(rows=0))
