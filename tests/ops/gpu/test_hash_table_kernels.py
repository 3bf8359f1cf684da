"""The device hash table's kernels called directly (hash_table_tensors builds the table on them; tests/ops/
test_hash_table_tensors.py compares the whole table with the host one): inserted keys are found and absent ones
are not, deleted keys leave tombstones that probes step over and inserts reuse, every int64 is a key, and the
count-min sketch counts exactly when nothing collides and never under-counts. On a CUDA device compiled,
without one under Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import torch

from hugerec.ops.gpu import hash_table_kernels as k
from tests.ops.gpu.conftest import DEVICE

EXTREMES = [-(2**63), -1, 0, 1, 2**63 - 1]


def _table(slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """slot_keys, slot_rows [S + 1]: S empty slots and the spare slot holding JUNK."""
    keys = torch.zeros(slots + 1, dtype=torch.int64, device=DEVICE)
    rows = torch.full((slots + 1,), k.EMPTY, dtype=torch.int64, device=DEVICE)
    rows[slots] = k.JUNK
    return keys, rows


def _lookup(slot_keys: torch.Tensor, slot_rows: torch.Tensor, keys: list[int]) -> list[int]:
    q = torch.tensor(keys, dtype=torch.int64, device=DEVICE)
    out = torch.full_like(q, -9)
    k.lookup(slot_keys, slot_rows, q, out)
    return out.tolist()


def test_inserted_keys_are_found() -> None:
    slot_keys, slot_rows = _table(512)
    keys = [*EXTREMES, *range(1000, 1200, 3)]  # more keys than one block of lanes: several programs
    rows = list(range(len(keys)))
    k.insert_mapping(slot_keys, slot_rows, torch.tensor(keys, device=DEVICE), torch.tensor(rows, device=DEVICE))
    assert _lookup(slot_keys, slot_rows, keys) == rows
    assert _lookup(slot_keys, slot_rows, [2, 999, 1001, -2]) == [-1] * 4
    assert int((slot_rows[:512] >= 0).sum()) == len(keys) and int(slot_rows[512]) == k.JUNK
    assert _lookup(slot_keys, slot_rows, []) == []


def test_deletes_leave_tombstones_that_inserts_reuse() -> None:
    slot_keys, slot_rows = _table(16)
    keys = torch.arange(6, dtype=torch.int64, device=DEVICE) * 16  # 6 keys in 16 slots
    k.insert_mapping(slot_keys, slot_rows, keys, torch.arange(6, device=DEVICE))
    k.delete_keys(slot_keys, slot_rows, torch.tensor([0, 32, 77], device=DEVICE))  # 77 is absent: skipped
    assert int((slot_rows == k.TOMBSTONE).sum()) == 2
    assert _lookup(slot_keys, slot_rows, [0, 16, 32, 48, 64, 80]) == [-1, 1, -1, 3, 4, 5]  # probes step over them
    k.insert_mapping(slot_keys, slot_rows, torch.tensor([0, 99], device=DEVICE), torch.tensor([10, 11], device=DEVICE))
    assert _lookup(slot_keys, slot_rows, [0, 99, 48]) == [10, 11, 3]
    assert int((slot_rows[:16] >= 0).sum()) == 6


def test_the_sketch_counts() -> None:
    sketch = torch.zeros(2, 1 << 16, dtype=torch.int32, device=DEVICE)  # wide: these keys collide nowhere
    keys = torch.tensor([5, -7, 2**62], dtype=torch.int64, device=DEVICE)
    k.sketch_add(sketch, keys, torch.tensor([1, 3, 2], device=DEVICE))
    k.sketch_add(sketch, keys[:1], torch.tensor([4], device=DEVICE))
    out = torch.empty(4, dtype=torch.int64, device=DEVICE)
    k.sketch_estimate(sketch, torch.tensor([5, -7, 2**62, 6], device=DEVICE), out)
    assert out.tolist() == [5, 3, 2, 0]
    small = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)  # two counters: everything collides
    many = torch.arange(10, dtype=torch.int64, device=DEVICE)
    k.sketch_add(small, many, torch.ones(10, dtype=torch.int64, device=DEVICE))
    est = torch.empty(10, dtype=torch.int64, device=DEVICE)
    k.sketch_estimate(small, many, est)
    assert (est >= 1).all() and int(small.sum()) == 10


def test_the_sketch_saturates() -> None:
    sketch = torch.zeros(1, 4, dtype=torch.int32, device=DEVICE)
    key = torch.tensor([3], dtype=torch.int64, device=DEVICE)
    k.sketch_add(sketch, key, torch.tensor([k.SKETCH_MAX - 1], device=DEVICE))
    k.sketch_add(sketch, key, torch.tensor([10], device=DEVICE))
    out = torch.empty(1, dtype=torch.int64, device=DEVICE)
    k.sketch_estimate(sketch, key, out)
    assert out.tolist() == [k.SKETCH_MAX]
