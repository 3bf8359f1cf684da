"""Triton kernels of the device hash table (`hugerec.ops.hash_table_tensors` holds the table and its ops).

Layout (S slots, a power of two >= 2 C, plus one spare slot at index S):

    slot_keys  [S + 1] int64   the key of each slot
    slot_rows  [S + 1] int64   its row; EMPTY (-1) ends a probe, TOMBSTONE (-2) is a deleted entry that a
                               probe steps over and an insert may take; the spare slot at S holds JUNK
                               (-3), a value no real slot holds: a lane with nothing to claim swaps
                               expecting it, which changes nothing
    sketch     [d, w] int32    count-min counters (saturate at SKETCH_MAX when read)

Probing is linear from the same splitmix64 home slot as the CPU table (`hugerec.ops.cpu.hash_table_kernels`).
Every kernel works on BLOCK keys per program, one lane per key, each lane probing until it is done
(a hit or an empty slot); the program loops while any lane is still probing.

`insert_mapping` claims a slot with one atomic compare-and-swap of its row (EMPTY -> row, or
TOMBSTONE -> row, whichever the lane read there) and then writes the key. Its keys are distinct and known to be absent (the caller
looked them up first), so two lanes never insert one key and a tombstone may be reused; readers run
in later kernels, after every insert of the launch has landed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EMPTY, TOMBSTONE, JUNK = -1, -2, -3
SKETCH_MAX = 65535
BLOCK = 128


@triton.jit
def _mix(key):
    """splitmix64's finalizer on the key's bits (uint64), as the CPU table hashes."""
    x = key.to(tl.uint64, bitcast=True)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _lookup_kernel(slot_keys, slot_rows, keys, out, n, mask, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n
    k = tl.load(keys + idx, mask=live, other=0)
    s = (_mix(k) & mask).to(tl.int64)
    found = tl.full([BLOCK], -1, dtype=tl.int64)
    probing = live
    while tl.max(probing.to(tl.int32), axis=0) > 0:
        r = tl.load(slot_rows + s, mask=probing, other=-1)
        sk = tl.load(slot_keys + s, mask=probing, other=0)
        hit = probing & (r >= 0) & (sk == k)
        found = tl.where(hit, r, found)
        probing = probing & ~hit & (r != -1)
        s = (s + 1) & mask
    tl.store(out + idx, found, mask=live)


@triton.jit
def _insert_kernel(slot_keys, slot_rows, keys, rows, n, mask, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n
    k = tl.load(keys + idx, mask=live, other=0)
    row = tl.load(rows + idx, mask=live, other=0)
    s = (_mix(k) & mask).to(tl.int64)
    probing = live
    while tl.max(probing.to(tl.int32), axis=0) > 0:
        r = tl.load(slot_rows + s, mask=probing, other=0)
        free = probing & (r < 0)  # EMPTY or TOMBSTONE: claim it if nobody else does first
        # One compare-and-swap per lane, on the lane's own slot: a lane with nothing to claim expects JUNK,
        # which no real slot holds, so its swap changes nothing (no shared dummy address to contend on).
        old = tl.atomic_cas(slot_rows + s, tl.where(free, r, -3), row)
        took = free & (old == r)
        tl.store(slot_keys + s, k, mask=took)
        # an occupied slot is never this key's (keys are absent): step on; a lost race re-reads the slot
        s = tl.where(probing & ~free, (s + 1) & mask, s)
        probing = probing & ~took


@triton.jit
def _delete_kernel(slot_keys, slot_rows, keys, n, mask, BLOCK: tl.constexpr):
    """Mark the slots of present keys as tombstones (absent keys: nothing)."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n
    k = tl.load(keys + idx, mask=live, other=0)
    s = (_mix(k) & mask).to(tl.int64)
    probing = live
    while tl.max(probing.to(tl.int32), axis=0) > 0:
        r = tl.load(slot_rows + s, mask=probing, other=-1)
        sk = tl.load(slot_keys + s, mask=probing, other=0)
        hit = probing & (r >= 0) & (sk == k)
        tl.store(slot_rows + s, tl.full([BLOCK], -2, dtype=tl.int64), mask=hit)
        probing = probing & ~hit & (r != -1)
        s = (s + 1) & mask


@triton.jit
def _sketch_column(k, row, width):
    """Column of key k in count-min row `row` ([BLOCK] uint64 holding the row index + 1), as the CPU table."""
    x = k.to(tl.uint64, bitcast=True) + row * 0x9E3779B97F4A7C15
    return (_mix(x.to(tl.int64, bitcast=True)) % width.to(tl.uint64)).to(tl.int64)


@triton.jit
def _sketch_kernel(sketch, keys, occurrences, out, n, depth, width, ADD: tl.constexpr, BLOCK: tl.constexpr):
    """ADD: every counter of each key += its occurrences (saturating); else out = the keys' estimates."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = idx < n
    k = tl.load(keys + idx, mask=live, other=0)
    estimate = tl.full([BLOCK], 65535, dtype=tl.int32)
    occ = tl.load(occurrences + idx, mask=live, other=0).to(tl.int32)
    for j in range(0, depth):
        c = _sketch_column(k, tl.zeros([BLOCK], dtype=tl.uint64) + (j + 1), width)
        at = sketch + j * width + c
        if ADD:
            tl.atomic_add(at, occ, mask=live)
            tl.atomic_min(at, tl.full([BLOCK], 65535, dtype=tl.int32), mask=live)
        else:
            estimate = tl.minimum(estimate, tl.load(at, mask=live, other=0))
    if not ADD:
        tl.store(out + idx, estimate.to(tl.int64), mask=live)


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)


def lookup(slot_keys: torch.Tensor, slot_rows: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> None:
    """out[i] = row of keys[i], or -1."""
    n = keys.shape[0]
    if n:
        _lookup_kernel[_grid(n)](slot_keys, slot_rows, keys, out, n, slot_rows.shape[0] - 2, BLOCK=BLOCK)


def insert_mapping(slot_keys: torch.Tensor, slot_rows: torch.Tensor, keys: torch.Tensor, rows: torch.Tensor) -> None:
    """Put distinct, absent keys into the slots, pointing at rows."""
    n = keys.shape[0]
    if n:
        _insert_kernel[_grid(n)](slot_keys, slot_rows, keys, rows, n, slot_rows.shape[0] - 2, BLOCK=BLOCK)


def delete_keys(slot_keys: torch.Tensor, slot_rows: torch.Tensor, keys: torch.Tensor) -> None:
    """Tombstone the slots of the given keys (absent keys are skipped)."""
    n = keys.shape[0]
    if n:
        _delete_kernel[_grid(n)](slot_keys, slot_rows, keys, n, slot_rows.shape[0] - 2, BLOCK=BLOCK)


def sketch_estimate(sketch: torch.Tensor, keys: torch.Tensor, out: torch.Tensor) -> None:
    """out [N] int64 = the count-min estimates of keys [N] (sketch [d, w] int32, d >= 1)."""
    n = keys.shape[0]
    if n:
        _sketch_kernel[_grid(n)](sketch, keys, keys, out, n, sketch.shape[0], sketch.shape[1], ADD=False, BLOCK=BLOCK)


def sketch_add(sketch: torch.Tensor, keys: torch.Tensor, occurrences: torch.Tensor) -> None:
    """Every counter of distinct keys [N] += occurrences [N] (int64), saturating at SKETCH_MAX."""
    n = keys.shape[0]
    if n:
        _sketch_kernel[_grid(n)](
            sketch, keys, occurrences, keys, n, sketch.shape[0], sketch.shape[1], ADD=True, BLOCK=BLOCK
        )
