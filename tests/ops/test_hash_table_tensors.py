"""The device hash table (tensors + Triton kernels; interpreted on the CPU without CUDA) == the host table
(Numba) == the dict oracle, call for call: rows, reset rows, counters, scores, state dict; with eviction by
LRU / LFU / TTL score, admission counts, removal and huge keys."""

from __future__ import annotations

import re

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

from hugerec.embedding.hash_table import HashTable
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing
from hugerec.ops import hash_table_arrays as ht
from hugerec.ops.cpu import hash_table_kernels as layout

pytest.importorskip("triton")

DEVICE = torch.empty(0, device="cuda" if torch.cuda.is_available() else "cpu").device  # as tensors report it: cuda:0
HUGE = [2**63 - 1, -(2**63), -1, 0, 2**62 + 5, -(2**40)]


def assert_same_state(host: HashTable, device: HashTable) -> None:
    a, b = host.state_dict(), device.state_dict()
    for k in HashTable.STATE_KEYS:
        assert torch.equal(a[k], b[k]), (k, a[k], b[k])


@settings(max_examples=25, deadline=None)
@given(
    eviction=st.sampled_from(list(Eviction)),
    min_count=st.sampled_from([1, 2, 3]),
    missing=st.sampled_from(list(Missing)),
    capacity=st.integers(3, 12),
    data=st.data(),
)
def test_device_table_equals_the_host_table(
    eviction: Eviction, min_count: int, missing: Missing, capacity: int, data: st.DataObject
) -> None:
    policy = DynamicConfig(eviction=eviction, min_count=min_count, missing=missing, ttl_steps=2)
    host = HashTable(capacity, policy)
    device = HashTable(capacity, policy).move(DEVICE)
    keys = st.one_of(st.integers(0, 15), st.sampled_from(HUGE))
    step = 0
    for _ in range(data.draw(st.integers(1, 6), "calls")):
        step += data.draw(st.integers(0, 2), "step gap")
        batch = data.draw(st.lists(keys, max_size=10), "keys")
        action = data.draw(st.sampled_from(["insert", "insert", "find", "remove"]), "action")
        k = torch.tensor(batch, dtype=torch.int64)
        if action == "find":
            assert torch.equal(host.find(k), device.find(k).cpu())
            continue
        if action == "remove":
            assert torch.equal(host.remove(k), device.remove(k).cpu())
            continue
        try:
            want = host.find_or_insert(k, step)
        except ValueError as e:
            with pytest.raises(ValueError, match=re.escape(str(e).split(":")[1][:20])):
                device.find_or_insert(k, step)
            continue
        got = device.find_or_insert(k, step)
        assert torch.equal(got.rows.cpu(), want.rows)
        assert torch.equal(got.reset_rows.cpu(), want.reset_rows)
        assert host.stats() == device.stats()
    assert_same_state(host, device)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), eviction=st.sampled_from([ht.EVICT_NONE, ht.EVICT_LRU, ht.EVICT_LFU]))
def test_tensor_ops_equal_the_dict_oracle(data: st.DataObject, eviction: int) -> None:
    from hugerec.ops import hash_table_tensors as tensors

    capacity = data.draw(st.integers(2, 8), "capacity")
    t = tensors.HashTableTensors.allocate(capacity, DEVICE)
    ref = ht.DictHashTable(capacity, eviction)
    for step in range(data.draw(st.integers(1, 6), "steps")):
        batch = data.draw(st.lists(st.integers(-3, 12), max_size=8), "keys")
        try:
            want_rows, want_reset = ref.find_or_insert(batch, step)
        except ValueError:
            with pytest.raises(ValueError):
                tensors.find_or_insert(t, torch.tensor(batch, dtype=torch.int64, device=DEVICE), step, eviction)
            continue
        rows, reset = tensors.find_or_insert(t, torch.tensor(batch, dtype=torch.int64, device=DEVICE), step, eviction)
        assert rows.tolist() == want_rows
        assert reset.tolist() == want_reset
    assert t.counter(layout.SIZE) == len(ref.row_of)


def test_tombstones_are_swept_and_keys_stay_findable() -> None:
    """Many evictions leave tombstones; past a quarter of the slots the held keys are re-inserted."""
    table = HashTable(8, DynamicConfig(eviction=Eviction.LRU, missing=Missing.ZEROS)).move(DEVICE)
    for step in range(12):
        keys = torch.arange(step * 8, step * 8 + 8)
        rows = table.find_or_insert(keys, step).rows
        assert torch.equal(table.find(keys).cpu(), rows.cpu())
    tensors = table._tensors
    assert tensors is not None and tensors.tombstones * 4 <= tensors.slot_rows.shape[0] - 1
    assert len(table) == 8


def test_moving_back_and_forth_keeps_everything() -> None:
    policy = DynamicConfig(eviction=Eviction.LFU, min_count=2)
    table = HashTable(20, policy)
    table.find_or_insert(torch.tensor([1, 1, 2, 3, 3, 3, 2**62]), 0)
    twin = HashTable(20, policy)
    twin.load_state_dict(table.state_dict())
    table.move(DEVICE)
    assert table.device == DEVICE
    table.move(None)
    assert table.device is None
    assert_same_state(twin, table)
    assert torch.equal(
        table.find_or_insert(torch.tensor([4, 1]), 1).rows, twin.find_or_insert(torch.tensor([4, 1]), 1).rows
    )


def test_host_only_paths_refuse_a_device_table() -> None:
    table = HashTable(4).move(DEVICE)
    with pytest.raises(ValueError, match="tensor methods"):
        table.find_numpy(np.zeros(1, dtype=np.int64))
    with pytest.raises(ValueError, match="kernel_view"):
        table.kernel_view()


def test_kernels_compile_for_hopper() -> None:
    from tests.ops.gpu.conftest import compile_for_hopper

    module = "hugerec.ops.gpu.hash_table_kernels"
    lookup = {
        "slot_keys": "*i64",
        "slot_rows": "*i64",
        "keys": "*i64",
        "out": "*i64",
        "n": "i32",
        "mask": "i64",
        "BLOCK": "constexpr",
    }
    insert = {
        "slot_keys": "*i64",
        "slot_rows": "*i64",
        "keys": "*i64",
        "rows": "*i64",
        "n": "i32",
        "mask": "i64",
        "BLOCK": "constexpr",
    }
    delete = {"slot_keys": "*i64", "slot_rows": "*i64", "keys": "*i64", "n": "i32", "mask": "i64", "BLOCK": "constexpr"}
    sketch = {
        "sketch": "*i32",
        "keys": "*i64",
        "occurrences": "*i64",
        "out": "*i64",
        "n": "i32",
        "depth": "i32",
        "width": "i32",
        "ADD": "constexpr",
        "BLOCK": "constexpr",
    }
    compile_for_hopper(
        [
            (module, "_lookup_kernel", lookup, {"BLOCK": 128}),
            (module, "_insert_kernel", insert, {"BLOCK": 128}),
            (module, "_delete_kernel", delete, {"BLOCK": 128}),
            (module, "_sketch_kernel", sketch, {"ADD": True, "BLOCK": 128}),
            (module, "_sketch_kernel", sketch, {"ADD": False, "BLOCK": 128}),
        ]
    )
