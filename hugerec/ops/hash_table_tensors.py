"""The collisionless hash table on a device: the contract of `hugerec.ops.hash_table_arrays` (its module
docstring states it; `DictHashTable` is the oracle of both) with the state in torch tensors, the probing in
Triton kernels (`hugerec.ops.gpu.hash_table_kernels`) and the bookkeeping in torch ops.

A training lookup (`find_or_insert`) never loops over keys on the host:
  1. every key is probed in parallel (found rows, or -1);
  2. the distinct missing keys in order of first occurrence: torch.unique, then each key's first position
     (scatter_reduce amin) sorted;
  3. admission from the count-min sketch (a kernel reads each key's estimate);
  4. the capacity checks, on a few numbers read back (the only host round trip: a table that does not fit
     must raise before anything changes);
  5. the admitted keys take the free stack's top rows in order, then the rows of smallest eviction score
     among those not touched at this step (LRU / TTL: (last step, row), LFU: (count, last step, row)),
     chosen all at once by a sort, which is the order the CPU table's heap pops them in;
  6. evicted keys' slots become tombstones, the new keys are inserted by compare-and-swap.
The rows, reset rows, counters and scores equal the CPU table's, call for call (tests compare both and
the dict oracle). The slot layout differs (tombstones instead of backward-shift deletion); tombstones
are swept by re-inserting the held keys once they pass a quarter of the slots.

Counters stay on the host (`meta`, the CPU table's layout and indices); TOUCHED and HEAP_SIZE are the CPU
table's bookkeeping and are derived when the state is exported.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import torch

from hugerec.ops import hash_table_arrays as arrays
from hugerec.ops.cpu import hash_table_kernels as layout


def _kernels() -> ModuleType:
    return importlib.import_module("hugerec.ops.gpu.hash_table_kernels")


@dataclass
class HashTableTensors:
    """Mutable state of one device hash table of capacity C (layout: `hugerec.ops.gpu.hash_table_kernels`)."""

    slot_keys: torch.Tensor  # [S + 1] int64
    slot_rows: torch.Tensor  # [S + 1] int64
    key: torch.Tensor  # [C] int64: the key each row holds
    last: torch.Tensor  # [C] int64: step the row was last touched
    count: torch.Tensor  # [C] int64: occurrences since the row got its key
    row_state: torch.Tensor  # [C] int8: FRESH / USED / FREED
    free: torch.Tensor  # [C] int64: stack of free rows, top = free[meta[N_FREE] - 1]
    sketch: torch.Tensor  # [d, w] int32, or [0, 0]
    meta: np.ndarray  # [META_LEN] int64 on the host
    tombstones: int = 0

    @staticmethod
    def allocate(capacity: int, device: torch.device, sketch_depth: int = 0, sketch_width: int = 0) -> HashTableTensors:
        num_slots = 2
        while num_slots < 2 * capacity:
            num_slots *= 2
        slot_rows = torch.full((num_slots + 1,), -1, dtype=torch.int64, device=device)
        slot_rows[num_slots] = -3  # the junk slot
        meta = np.zeros(layout.META_LEN, dtype=np.int64)
        meta[layout.N_FREE] = capacity
        meta[layout.STEP] = -1
        return HashTableTensors(
            slot_keys=torch.zeros(num_slots + 1, dtype=torch.int64, device=device),
            slot_rows=slot_rows,
            key=torch.zeros(capacity, dtype=torch.int64, device=device),
            last=torch.zeros(capacity, dtype=torch.int64, device=device),
            count=torch.zeros(capacity, dtype=torch.int64, device=device),
            row_state=torch.zeros(capacity, dtype=torch.int8, device=device),
            free=torch.arange(capacity - 1, -1, -1, dtype=torch.int64, device=device),
            sketch=torch.zeros(sketch_depth, sketch_width, dtype=torch.int32, device=device),
            meta=meta,
        )

    @property
    def capacity(self) -> int:
        return int(self.key.shape[0])

    @property
    def device(self) -> torch.device:
        return self.key.device

    def counter(self, index: int) -> int:
        return int(self.meta[index])

    # -- to and from the CPU table's arrays ------------------------------------------------------------
    @staticmethod
    def from_arrays(a: arrays.HashTableArrays, device: torch.device) -> HashTableTensors:
        """The same table on `device` (keys, rows, scores, free stack, sketch and counters)."""
        t = HashTableTensors.allocate(a.capacity, device, *a.sketch.shape)
        t.key.copy_(torch.from_numpy(a.info[:, layout.KEY].copy()))
        t.last.copy_(torch.from_numpy(a.info[:, layout.LAST].copy()))
        t.count.copy_(torch.from_numpy(a.info[:, layout.COUNT].copy()))
        t.row_state.copy_(torch.from_numpy(a.row_state.copy()))
        t.free.copy_(torch.from_numpy(a.free.copy()))
        t.sketch.copy_(torch.from_numpy(a.sketch.astype(np.int32)))
        t.meta[:] = a.meta
        held = torch.nonzero(t.row_state == layout.USED).squeeze(1)
        _kernels().insert_mapping(t.slot_keys, t.slot_rows, t.key[held], held)
        return t

    def to_arrays(self, eviction: int) -> arrays.HashTableArrays:
        """The CPU table's arrays of the same table (slots rebuilt, the eviction heap rebuilt if it keeps one)."""
        sketch = self.sketch.cpu().numpy()
        a = arrays.HashTableArrays.allocate(self.capacity, eviction, *sketch.shape)
        a.info[:, layout.KEY] = self.key.cpu().numpy()
        a.info[:, layout.LAST] = self.last.cpu().numpy()
        a.info[:, layout.COUNT] = self.count.cpu().numpy()
        a.row_state[:] = self.row_state.cpu().numpy()
        a.free[:] = self.free.cpu().numpy()
        a.sketch[:] = np.minimum(sketch, arrays.SKETCH_MAX).astype(np.uint16)
        a.meta[:] = self.meta
        used = a.row_state == layout.USED
        a.meta[layout.TOUCHED] = int((used & (a.info[:, layout.LAST] == a.meta[layout.STEP])).sum())
        held = np.flatnonzero(used).astype(np.int64)
        arrays.insert_mapping(a, np.ascontiguousarray(a.info[held, layout.KEY]), held)
        if eviction != arrays.EVICT_NONE:
            a.heap = np.zeros((arrays.heap_capacity(a.capacity), 4), dtype=np.int64)
            arrays.rebuild_heap(a, eviction)
        return a


def lookup(t: HashTableTensors, keys: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """keys [N] int64 (on the table's device) -> rows [N] int64, -1 where absent."""
    out = torch.empty(keys.shape[0], dtype=torch.int64, device=keys.device) if out is None else out
    _kernels().lookup(t.slot_keys, t.slot_rows, keys, out)
    return out


def _release(t: HashTableTensors, rows: torch.Tensor) -> None:
    """Rows give up their keys: tombstones in the slots, FREED (re-initialised on reuse)."""
    _kernels().delete_keys(t.slot_keys, t.slot_rows, t.key[rows])
    t.row_state[rows] = layout.FREED
    t.tombstones += int(rows.shape[0])


def _sweep(t: HashTableTensors) -> None:
    """Re-insert the held keys into empty slots once tombstones pass a quarter of the slots."""
    if t.tombstones * 4 <= t.slot_rows.shape[0] - 1:
        return
    t.slot_rows[:-1] = -1
    held = torch.nonzero(t.row_state == layout.USED).squeeze(1)
    _kernels().insert_mapping(t.slot_keys, t.slot_rows, t.key[held], held)
    t.tombstones = 0


def _order(t: HashTableTensors, rows: torch.Tensor, eviction: int) -> torch.Tensor:
    """rows sorted by eviction score: LRU / TTL (last step, row), LFU (count, last step, row)."""
    rows, _ = torch.sort(rows)
    by_last = rows[torch.argsort(t.last[rows], stable=True)]
    if eviction != arrays.EVICT_LFU:
        return by_last
    return by_last[torch.argsort(t.count[by_last], stable=True)]


def expire(t: HashTableTensors, step: int, ttl: int) -> int:
    """Free every row with step - last_step > ttl, oldest first; returns how many."""
    old = torch.nonzero((t.row_state == layout.USED) & (t.last < step - ttl)).squeeze(1)
    k = int(old.shape[0])
    if k == 0:
        return 0
    old = _order(t, old, arrays.EVICT_TTL)
    _release(t, old)
    n_free = t.counter(layout.N_FREE)
    t.free[n_free : n_free + k] = old
    t.meta[layout.N_FREE] += k
    t.meta[layout.SIZE] -= k
    t.meta[layout.EXPIRED] += k
    _sweep(t)
    return k


def find_or_insert(
    t: HashTableTensors,
    keys: torch.Tensor,
    step: int,
    eviction: int,
    min_count: int = 1,
    admit_all: bool = False,
    where: str = "hash table",
) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [N] int64 -> (rows [N] int64, -1: not admitted; reset rows [E] int64), on the table's device.
    Semantics and errors: `hugerec.ops.hash_table_arrays.find_or_insert`."""
    meta = t.meta
    if step < meta[layout.STEP]:
        raise ValueError(
            f"{where}: step {step} is before the last step seen ({meta[layout.STEP]}); steps must not decrease"
        )
    device = keys.device
    n = keys.shape[0]
    rows = lookup(t, keys)
    miss_at = torch.nonzero(rows < 0).squeeze(1)
    missing = keys[miss_at]
    ukeys, inverse, uocc = torch.unique(missing, return_inverse=True, return_counts=True)
    num_u = int(ukeys.shape[0])
    if num_u:  # distinct missing keys in order of first occurrence
        first = torch.full((num_u,), n, dtype=torch.int64, device=device)
        first.scatter_reduce_(0, inverse, miss_at, "amin")
        by_first = torch.argsort(first)
        rank = torch.empty_like(by_first)
        rank[by_first] = torch.arange(num_u, device=device)
        ukeys, uocc, inverse = ukeys[by_first], uocc[by_first], rank[inverse]
    use_sketch = min_count > 1 and not admit_all and t.sketch.numel() > 0
    admitted = torch.ones(num_u, dtype=torch.bool, device=device)
    if use_sketch and num_u:
        estimate = torch.empty(num_u, dtype=torch.int64, device=device)
        _kernels().sketch_estimate(t.sketch, ukeys, estimate)
        admitted = estimate.clamp(max=arrays.SKETCH_MAX) + uocc >= min_count
    needed = int(admitted.sum()) if num_u else 0
    n_free = t.counter(layout.N_FREE)
    found = rows[rows >= 0]
    if needed:
        if eviction == arrays.EVICT_NONE:
            if meta[layout.SIZE] + needed > t.capacity:
                raise ValueError(
                    f"{where}: full ({meta[layout.SIZE]} of {t.capacity} rows held) and {needed} new keys arrived "
                    "with eviction NONE; raise the capacity (TableConfig.num_rows) or choose an eviction policy"
                )
        elif needed > n_free:
            mark = (t.row_state == layout.USED) & (t.last == step)
            mark[found] = True
            protected = int(mark.sum())
            if protected + needed > t.capacity:
                raise ValueError(
                    f"{where}: step {step} needs {protected} rows already touched in it + {needed} new rows but the "
                    f"capacity is {t.capacity}; keys of a step are never evicted for keys of the same step, so raise "
                    "the capacity"
                )
    # the batch fits: from here on the table changes
    if use_sketch and num_u:
        _kernels().sketch_add(t.sketch, ukeys, uocc)
    meta[layout.STEP] = step
    t.count.index_add_(0, found, torch.ones_like(found))
    t.last[found] = step
    meta[layout.REFUSED] += num_u - needed
    if not needed:
        if num_u:
            rows[miss_at] = -1
        return rows, torch.empty(0, dtype=torch.int64, device=device)
    from_free = min(needed, n_free)
    taken = t.free[n_free - from_free : n_free].flip(0)  # the stack's top first
    meta[layout.N_FREE] -= from_free
    if needed > from_free:  # evict the unprotected rows of smallest score, in score order
        k = needed - from_free
        candidates = torch.nonzero((t.row_state == layout.USED) & (t.last != step)).squeeze(1)
        victims = _order(t, candidates, eviction)[:k]
        _release(t, victims)
        meta[layout.SIZE] -= k
        meta[layout.EVICTIONS] += k
        taken = torch.cat([taken, victims])
    reset = taken[t.row_state[taken] != layout.FRESH]
    new_keys = ukeys[admitted]
    _kernels().insert_mapping(t.slot_keys, t.slot_rows, new_keys, taken)
    t.key[taken] = new_keys
    t.last[taken] = step
    t.count[taken] = uocc[admitted]
    t.row_state[taken] = layout.USED
    meta[layout.SIZE] += needed
    meta[layout.INSERTS] += needed
    row_of = torch.full((num_u,), -1, dtype=torch.int64, device=device)
    row_of[admitted] = taken
    rows[miss_at] = row_of[inverse]
    _sweep(t)
    return rows, reset


def remove(t: HashTableTensors, keys: torch.Tensor) -> torch.Tensor:
    """Drop keys; returns the freed row per key (-1 where absent or a repeat of an earlier key)."""
    rows = lookup(t, keys)
    n = keys.shape[0]
    if n:  # a key given twice frees its row once, at its first occurrence
        first = torch.full((n,), n, dtype=torch.int64, device=keys.device)
        _, inverse = torch.unique(keys, return_inverse=True)
        first.scatter_reduce_(0, inverse, torch.arange(n, device=keys.device), "amin")
        rows[first[inverse] != torch.arange(n, device=keys.device)] = -1
    freed = rows[rows >= 0]
    k = int(freed.shape[0])
    if k:
        _release(t, freed)
        n_free = t.counter(layout.N_FREE)
        t.free[n_free : n_free + k] = freed
        t.meta[layout.N_FREE] += k
        t.meta[layout.SIZE] -= k
        t.meta[layout.REMOVED] += k
        _sweep(t)
    return rows
