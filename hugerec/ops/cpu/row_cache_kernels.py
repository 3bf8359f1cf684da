"""Numba kernels of the disk tier's hot-row cache (`hugerec.ops.row_cache` states the contract).

One cache serves one table: C slots, each holding one row's record (weight bytes + state bytes)
copied from the table's file, an exact LRU list over the slots (doubly linked: prev/next), and
`slot_of_row` [R] int32 for the lookup. Every kernel releases the GIL, so that the training pipeline
can prepare the next batch's rows while the current step computes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# counters [4] int64: what a prepare did
HITS, MISSES, READS, WRITES = 0, 1, 2, 3
# state [3] int64: LRU head (least recent), tail (most recent), clock (prepares so far)
HEAD, TAIL, CLOCK = 0, 1, 2
BAD_ID, CACHE_FULL = -1, -2


@njit(inline="always", cache=True)
def _unlink(s: int, prev: np.ndarray, nxt: np.ndarray, state: np.ndarray) -> None:
    p, n = prev[s], nxt[s]
    if p >= 0:
        nxt[p] = n
    else:
        state[HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        state[TAIL] = p


@njit(inline="always", cache=True)
def _append(s: int, prev: np.ndarray, nxt: np.ndarray, state: np.ndarray) -> None:
    t = state[TAIL]
    prev[s] = t
    nxt[s] = -1
    if t >= 0:
        nxt[t] = s
    else:
        state[HEAD] = s
    state[TAIL] = s


@njit(inline="always", cache=True)
def _write_back(s: int, r: int, file: np.ndarray, wcache: np.ndarray, scache: np.ndarray) -> None:
    wb = wcache.shape[1]
    for j in range(wb):
        file[r, j] = wcache[s, j]
    for j in range(scache.shape[1]):
        file[r, wb + j] = scache[s, j]


@njit(cache=True, nogil=True)
def prepare(
    ids: np.ndarray,
    missing_ok: bool,
    mark_dirty: bool,
    pinned: int,
    slot_of_row: np.ndarray,
    row_of_slot: np.ndarray,
    prev: np.ndarray,
    nxt: np.ndarray,
    stamp: np.ndarray,
    dirty: np.ndarray,
    state: np.ndarray,
    file: np.ndarray,
    wcache: np.ndarray,
    scache: np.ndarray,
    out: np.ndarray,
    counters: np.ndarray,
) -> int:
    """out[i] = the cache slot of row ids[i] (-1 stays -1 when missing_ok); misses evict the LRU slot
    (written back when dirty) and read the row from the file. Returns 0, or BAD_ID at the first id
    outside [0, R) (out[i] = its index), or CACHE_FULL when the LRU slot belongs to one of the last
    `pinned` prepares (its rows are in use)."""
    state[CLOCK] += 1
    clock = state[CLOCK]
    protect = clock - pinned + 1  # slots stamped by this prepare or the pinned - 1 before it stay
    num_rows = slot_of_row.shape[0]
    wb = wcache.shape[1]
    sb = scache.shape[1]
    for i in range(ids.shape[0]):
        r = ids[i]
        if r < 0 or r >= num_rows:
            if r == -1 and missing_ok:
                out[i] = -1
                continue
            out[0] = i
            return BAD_ID
        s = slot_of_row[r]
        if s >= 0:
            if stamp[s] != clock:
                counters[HITS] += 1
        else:
            counters[MISSES] += 1
            s = state[HEAD]
            if stamp[s] >= protect:
                return CACHE_FULL
            old = row_of_slot[s]
            if old >= 0:
                slot_of_row[old] = -1
                if dirty[s]:
                    _write_back(s, old, file, wcache, scache)
                    counters[WRITES] += 1
            for j in range(wb):
                wcache[s, j] = file[r, j]
            for j in range(sb):
                scache[s, j] = file[r, wb + j]
            counters[READS] += 1
            row_of_slot[s] = r
            slot_of_row[r] = s
            dirty[s] = 0
        if state[TAIL] != s:
            _unlink(s, prev, nxt, state)
            _append(s, prev, nxt, state)
        stamp[s] = clock
        if mark_dirty:
            dirty[s] = 1
        out[i] = s
    return 0


@njit(cache=True, nogil=True)
def flush(
    row_of_slot: np.ndarray,
    stamp: np.ndarray,
    dirty: np.ndarray,
    keep_dirty_from: int,
    file: np.ndarray,
    wcache: np.ndarray,
    scache: np.ndarray,
) -> int:
    """Writes every dirty slot back to its row; slots stamped >= keep_dirty_from (a prepared batch whose
    update may not have run yet) stay dirty. Returns the rows written."""
    written = 0
    for s in range(row_of_slot.shape[0]):
        if dirty[s] and row_of_slot[s] >= 0:
            _write_back(s, row_of_slot[s], file, wcache, scache)
            written += 1
            if stamp[s] < keep_dirty_from:
                dirty[s] = 0
    return written


@njit(cache=True, nogil=True)
def gather(
    rows: np.ndarray, slot_of_row: np.ndarray, file: np.ndarray, wcache: np.ndarray, scache: np.ndarray, out: np.ndarray
) -> None:
    """out[i] = the record of rows[i] (weight bytes + state bytes), from its slot if cached, else the file."""
    wb = wcache.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slot_of_row[r]
        if s >= 0:
            for j in range(wb):
                out[i, j] = wcache[s, j]
            for j in range(scache.shape[1]):
                out[i, wb + j] = scache[s, j]
        else:
            for j in range(out.shape[1]):
                out[i, j] = file[r, j]


@njit(cache=True, nogil=True)
def scatter(
    rows: np.ndarray,
    records: np.ndarray,
    slot_of_row: np.ndarray,
    dirty: np.ndarray,
    file: np.ndarray,
    wcache: np.ndarray,
    scache: np.ndarray,
) -> None:
    """The record of rows[i] = records[i]: into its slot (made dirty) if cached, else into the file."""
    wb = wcache.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        s = slot_of_row[r]
        if s >= 0:
            for j in range(wb):
                wcache[s, j] = records[i, j]
            for j in range(scache.shape[1]):
                scache[s, j] = records[i, wb + j]
            dirty[s] = 1
        else:
            for j in range(records.shape[1]):
                file[r, j] = records[i, j]
