"""Numba kernels of the collisionless hash table (keys -> rows), see `hugerec.ops.hash_table_arrays`.

Layout (S slots, a power of two >= 2 C, so the load factor stays <= 0.5 and probes stay short):

    slots      [S, 2] int64   (key, row); row == -1 marks an empty slot. Occupancy lives in the row
                              column, so every int64 is a valid key (no sentinel key is reserved).
    info       [C, 4] int64   per row, one cache line for what a lookup touches:
                              KEY (held key), LAST (step the row was last touched by find_or_insert),
                              COUNT (occurrences of the key since it got the row),
                              GEN (bumped whenever the row gets a new key; invalidates old heap entries)
    row_state  [C] int8       FRESH (never held a key) / USED / FREED (held one, must be re-initialised)
    free       [C] int64      stack of free rows; the top is free[meta[N_FREE] - 1]
    heap       [H, 4] int64   min-heap of (score1, score2, row, gen) for eviction; H = C + C/8 + 1,
                              allocated when a call first has to evict (from the start for TTL)
    sketch     [d, w] uint16  count-min sketch for admission ([0, 0] when min_count == 1)
    meta       [9] int64      the scalar counters below

Probing is linear on a splitmix64 hash; deletion shifts the cluster back (no tombstones).

The eviction heap is lazy: every held row has at least one entry whose score is a lower bound of its
current score (scores only grow while a row keeps its key). Popping an entry whose score is stale
re-pushes the row with its current score; an exact entry is the true minimum. Touching a row
therefore costs nothing; the heap is only worked on when rows are evicted or expire.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from hugerec.ops.cpu.rows import prefetch

# meta indices
N_FREE = 0
HEAP_SIZE = 1
SIZE = 2
STEP = 3
INSERTS = 4
EVICTIONS = 5
EXPIRED = 6
REFUSED = 7
REMOVED = 8
TOUCHED = 9  # rows touched at step meta[STEP] (they may not be evicted during that step)
META_LEN = 10

# info columns
KEY = 0
LAST = 1
COUNT = 2
GEN = 3

# row_state values
FRESH = 0
USED = 1
FREED = 2

# keys between the prefetch of a key's home slot (or row info) and its probe: the probe loop is short,
# but its data-dependent exit branch stops the CPU from running ahead into the next keys' slots
AHEAD = 8

# eviction codes (mirrors hugerec.embedding.table_config.Eviction, which ops may not import)
EVICT_NONE = 0
EVICT_LRU = 1
EVICT_LFU = 2
EVICT_TTL = 3

# find_or_insert status codes
OK = 0
FULL = 1  # eviction NONE and not enough free rows
BATCH_TOO_LARGE = 2  # the batch alone needs more rows than the table has
NEED_HEAP = 3  # eviction must run and the heap is not allocated yet: allocate, rebuild, call again

# scalars are Python ints at the call sites and np.int64 inside the kernels
Int = int | np.int64


class Arrays(NamedTuple):
    """One table's arrays as every kernel takes them (layout above): one typed tuple, not seven arguments."""

    slots: np.ndarray
    info: np.ndarray
    row_state: np.ndarray
    free: np.ndarray
    heap: np.ndarray
    sketch: np.ndarray
    meta: np.ndarray


class TableGroup(NamedTuple):
    """Several tables as the side-by-side kernels take them: per field of `Arrays`, one array per table
    (a parallel loop cannot take a tuple of tuples), and their policies, int64 [T, 4] (POLICY_*)."""

    slots: tuple[np.ndarray, ...]
    info: tuple[np.ndarray, ...]
    row_state: tuple[np.ndarray, ...]
    free: tuple[np.ndarray, ...]
    heap: tuple[np.ndarray, ...]
    sketch: tuple[np.ndarray, ...]
    meta: tuple[np.ndarray, ...]
    policy: np.ndarray


# per-table policy columns of TableGroup.policy
POLICY_EVICTION = 0
POLICY_MIN_COUNT = 1
POLICY_TTL = 2  # -1: no expiry
POLICY_UNKNOWN = 3  # the row a key without one gets; -1: none

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always", cache=True)
def _mix(x: np.uint64) -> np.uint64:
    # splitmix64 finalizer: a bijection of uint64 with good avalanche
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@njit(inline="always", cache=True)
def _home(key: Int, mask: Int) -> Int:
    return np.int64(_mix(np.uint64(key)) & np.uint64(mask))


@njit(inline="always", cache=True)
def _probe(slots: np.ndarray, mask: Int, key: Int) -> Int:
    """Slot holding `key`, or -1 - (first empty slot on its probe path)."""
    i = _home(key, mask)
    while True:
        if slots[i, 1] == -1:
            return -1 - i
        if slots[i, 0] == key:
            return i
        i = (i + 1) & mask


@njit(cache=True)
def _delete_slot(slots: np.ndarray, i: Int) -> None:
    """Empty slot i and shift later members of its cluster back so every probe path stays unbroken."""
    mask = slots.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if slots[j, 1] == -1:
            break
        h = _home(slots[j, 0], mask)
        # the entry at j may move to i only if its home is not cyclically inside (i, j]
        if i <= j:
            stays = i < h <= j
        else:
            stays = h > i or h <= j
        if not stays:
            slots[i, 0] = slots[j, 0]
            slots[i, 1] = slots[j, 1]
            i = j
    slots[i, 1] = -1


@njit(cache=True, nogil=True)
def lookup(slots: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    """out[i] = row of keys[i], or -1.

    Serial on purpose: a lookup is a few hundred microseconds per table and batch, about what waking
    a thread team costs, and a team spinning beside torch's own OpenMP threads on two cores made
    it 20x slower in a training step.
    """
    mask = slots.shape[0] - 1
    n = keys.shape[0]
    for i in range(n):
        if i + AHEAD < n:
            prefetch(slots, _home(keys[i + AHEAD], mask) * 2, 2)
        s = _probe(slots, mask, keys[i])
        out[i] = slots[s, 1] if s >= 0 else -1


# -- eviction heap ---------------------------------------------------------------------------------


@njit(inline="always", cache=True)
def _less(heap: np.ndarray, a: Int, b: Int) -> bool:
    if heap[a, 0] != heap[b, 0]:
        return heap[a, 0] < heap[b, 0]
    if heap[a, 1] != heap[b, 1]:
        return heap[a, 1] < heap[b, 1]
    return heap[a, 2] < heap[b, 2]


@njit(inline="always", cache=True)
def _swap(heap: np.ndarray, a: Int, b: Int) -> None:
    for c in range(4):
        t = heap[a, c]
        heap[a, c] = heap[b, c]
        heap[b, c] = t


@njit(cache=True)
def _sift_down(heap: np.ndarray, n: Int, i: Int) -> None:
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        m = left
        if left + 1 < n and _less(heap, left + 1, left):
            m = left + 1
        if not _less(heap, m, i):
            return
        _swap(heap, i, m)
        i = m


@njit(cache=True)
def _push(heap: np.ndarray, meta: np.ndarray, s1: Int, s2: Int, row: Int, g: Int) -> None:
    i = meta[HEAP_SIZE]
    meta[HEAP_SIZE] = i + 1
    heap[i, 0] = s1
    heap[i, 1] = s2
    heap[i, 2] = row
    heap[i, 3] = g
    while i > 0:
        parent = (i - 1) // 2
        if not _less(heap, i, parent):
            return
        _swap(heap, i, parent)
        i = parent


@njit(cache=True)
def _pop(heap: np.ndarray, meta: np.ndarray) -> None:
    n = meta[HEAP_SIZE] - 1
    meta[HEAP_SIZE] = n
    for c in range(4):
        heap[0, c] = heap[n, c]
    _sift_down(heap, n, 0)


@njit(inline="always", cache=True)
def _score(eviction: Int, info: np.ndarray, r: Int) -> tuple[Int, Int]:
    # LRU / TTL: (last step seen, row); LFU: (count, last step seen, row); the row breaks ties
    if eviction == EVICT_LFU:
        return info[r, COUNT], info[r, LAST]
    return info[r, LAST], np.int64(0)


@njit(cache=True, nogil=True)
def rebuild_heap(t: Arrays, eviction: Int) -> None:
    """One exact entry per held row; drops every stale entry."""
    info, row_state, heap, meta = t.info, t.row_state, t.heap, t.meta
    n = 0
    for r in range(row_state.shape[0]):
        if row_state[r] == USED:
            s1, s2 = _score(eviction, info, r)
            heap[n, 0] = s1
            heap[n, 1] = s2
            heap[n, 2] = r
            heap[n, 3] = info[r, GEN]
            n += 1
    meta[HEAP_SIZE] = n
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(heap, n, i)


@njit(cache=True)
def _pop_exact(info: np.ndarray, row_state: np.ndarray, heap: np.ndarray, meta: np.ndarray, eviction: Int) -> Int:
    """Pop until the top entry is exact for a held row and return that row (-1: heap empty)."""
    while meta[HEAP_SIZE] > 0:
        r = heap[0, 2]
        e1 = heap[0, 0]
        e2 = heap[0, 1]
        g = heap[0, 3]
        _pop(heap, meta)
        if row_state[r] != USED or info[r, GEN] != g:
            continue  # the row lost this key since the entry was pushed
        s1, s2 = _score(eviction, info, r)
        if s1 != e1 or s2 != e2:
            _push(heap, meta, s1, s2, r, g)
            continue
        return r
    return -1


@njit(cache=True)
def _release(slots: np.ndarray, info: np.ndarray, row_state: np.ndarray, r: Int) -> None:
    """Row r gives up its key: its slot is deleted, the row is marked for re-initialisation."""
    mask = slots.shape[0] - 1
    _delete_slot(slots, _probe(slots, mask, info[r, KEY]))
    row_state[r] = FREED


@njit(cache=True, nogil=True)
def expire(t: Arrays, step: Int, ttl: Int) -> Int:
    """TTL: free every row not seen for more than `ttl` steps (step - last_step > ttl), oldest first."""
    slots, info, row_state, free, heap, meta = t.slots, t.info, t.row_state, t.free, t.heap, t.meta
    n = 0
    while meta[HEAP_SIZE] > 0 and heap[0, 0] < step - ttl:
        r = _pop_exact(info, row_state, heap, meta, EVICT_TTL)
        if r < 0:
            break
        if info[r, LAST] >= step - ttl:
            _push(heap, meta, info[r, LAST], 0, r, info[r, GEN])  # the exact top is still alive: done
            break
        if info[r, LAST] == meta[STEP]:  # expiring at a later step a row touched at the last one
            meta[TOUCHED] -= 1
        _release(slots, info, row_state, r)
        free[meta[N_FREE]] = r
        meta[N_FREE] += 1
        meta[SIZE] -= 1
        n += 1
    meta[EXPIRED] += n
    return n


# -- count-min sketch --------------------------------------------------------------------------------


@njit(inline="always", cache=True)
def _sketch_col(key: Int, depth_row: Int, width: Int) -> Int:
    return np.int64(_mix(np.uint64(key) + np.uint64(depth_row + 1) * _GOLDEN) % np.uint64(width))


@njit(cache=True)
def sketch_estimate(sketch: np.ndarray, key: Int) -> Int:
    est = np.int64(65535)
    for j in range(sketch.shape[0]):
        est = min(est, np.int64(sketch[j, _sketch_col(key, j, sketch.shape[1])]))
    return est


@njit(cache=True)
def _sketch_add(sketch: np.ndarray, key: Int, occ: Int) -> None:
    for j in range(sketch.shape[0]):
        c = _sketch_col(key, j, sketch.shape[1])
        sketch[j, c] = min(np.int64(sketch[j, c]) + occ, 65535)  # saturates instead of wrapping


# -- find_or_insert ----------------------------------------------------------------------------------
#
# find_or_insert runs as named steps. Two fast paths need no eviction and no admission:
#   _insert_pipelined  fewer keys than free rows: one software-pipelined pass over the batch
#   _probe_batch + _insert_missing   the batch's new keys fit the free rows
# otherwise the general path, where nothing changes until the batch is known to fit:
#   _probe_batch -> _distinct_missing -> _admission -> _room -> _insert_admitted
# A missing key's entry in `rows` is -2 - (the empty slot that ended its probe) after _probe_batch,
# then -2 - (its index among the distinct missing keys) after _distinct_missing.


@njit(cache=True)
def _protected_rows(info: np.ndarray, meta: np.ndarray, rows: np.ndarray, step: Int) -> Int:
    """Rows protected once this batch is touched: those already touched at `step` plus the batch's
    other distinct found rows (a small temporary set; only used when eviction is about to run)."""
    size = 2
    while size < 2 * rows.shape[0]:
        size *= 2
    seen = np.full(size, -1, dtype=np.int64)
    mask = size - 1
    n = meta[TOUCHED] if meta[STEP] == step else 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0 or info[r, LAST] == step:
            continue
        s = _home(r, mask)
        while seen[s] != -1 and seen[s] != r:
            s = (s + 1) & mask
        if seen[s] == -1:
            seen[s] = r
            n += 1
    return n


@njit(cache=True)
def _touch_found(info: np.ndarray, meta: np.ndarray, rows: np.ndarray, step: Int) -> None:
    if meta[STEP] != step:
        meta[STEP] = step
        meta[TOUCHED] = 0
    n = rows.shape[0]
    for i in range(n):
        if i + AHEAD < n and rows[i + AHEAD] >= 0:
            prefetch(info, rows[i + AHEAD] * 4, 4)
        r = rows[i]
        if r >= 0:
            info[r, COUNT] += 1
            if info[r, LAST] != step:
                info[r, LAST] = step
                meta[TOUCHED] += 1


@njit(inline="always", cache=True)
def _bind(
    slots: np.ndarray, info: np.ndarray, row_state: np.ndarray, s: Int, r: Int, key: Int, occ: Int, step: Int
) -> None:
    """Row r now holds `key` at the empty slot s, seen `occ` times at `step` (the counters in meta are
    the caller's: the pipelined path keeps them in locals)."""
    slots[s, 0] = key
    slots[s, 1] = r
    info[r, KEY] = key
    info[r, GEN] += 1
    info[r, LAST] = step
    info[r, COUNT] = occ
    row_state[r] = USED


@njit(cache=True)
def _push_scored(heap: np.ndarray, meta: np.ndarray, info: np.ndarray, r: Int, eviction: Int) -> None:
    """Row r enters the eviction heap with its current score (callers check that the table keeps a heap).

    The loops below pop a free row with four written-out lines and call this only under `if
    heap.shape[0]`: an inlined helper that returns the updated reset counter, or one that holds the
    heap test, made the insert loops markedly slower (benchmarks/README.md, hash-table kernels)."""
    s1, s2 = _score(eviction, info, r)
    _push(heap, meta, s1, s2, r, info[r, GEN])


@njit(inline="always", cache=True)
def _room_in_heap(t: Arrays, pushes: Int, eviction: Int) -> None:
    """Compact the heap (drop stale entries) when `pushes` more entries would overflow it."""
    if t.heap.shape[0] and t.meta[HEAP_SIZE] + pushes > t.heap.shape[0]:
        rebuild_heap(t, eviction)


@njit(cache=True)
def _insert_pipelined(
    t: Arrays, keys: np.ndarray, rows: np.ndarray, reset: np.ndarray, step: Int, eviction: Int
) -> Int:
    """Every key admitted and more free rows than keys (no eviction can happen): one pass, new keys take
    rows in order of first occurrence. Returns the number of reset rows.

    The pass is a software pipeline: the home slot of key i + 2 AHEAD is prefetched, key i + AHEAD is
    probed and its row's info prefetched, key i is touched or inserted. The probe of key i + AHEAD may
    predate the insertion of an equal key among i .. i + AHEAD - 1, so an insertion re-probes from the
    empty slot that ended the early probe (the path before it is still full: nothing is deleted here).
    The table's counters stay in locals until the end.
    """
    _room_in_heap(t, keys.shape[0], eviction)
    # the arrays as locals: an array taken out of the tuple inside the loop costs a reference count
    slots, info, row_state, free, heap, meta = t.slots, t.info, t.row_state, t.free, t.heap, t.meta
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    if meta[STEP] != step:
        meta[STEP] = step
        meta[TOUCHED] = 0
    n_free = meta[N_FREE]
    touched = meta[TOUCHED]
    inserted = 0
    n_reset: Int = 0
    for i in range(min(AHEAD, n)):
        s = _probe(slots, mask, keys[i])
        rows[i] = slots[s, 1] if s >= 0 else s - 1
    for i in range(AHEAD, min(2 * AHEAD, n)):
        prefetch(slots, _home(keys[i], mask) * 2, 2)
    for i in range(n):
        j = i + AHEAD
        if j < n:
            if j + AHEAD < n:
                prefetch(slots, _home(keys[j + AHEAD], mask) * 2, 2)
            s = _probe(slots, mask, keys[j])
            if s >= 0:
                rj = slots[s, 1]
                rows[j] = rj
                prefetch(info, rj * 4, 4)
            else:
                rows[j] = s - 1
        r = rows[i]
        if r >= 0:
            info[r, COUNT] += 1
            touched += info[r, LAST] != step
            info[r, LAST] = step
            continue
        key = keys[i]
        s = _resume_probe(slots, mask, -2 - r, key)
        if slots[s, 1] != -1:  # an earlier key of this batch inserted it
            r = slots[s, 1]
            info[r, COUNT] += 1
        else:
            n_free -= 1
            r = free[n_free]
            if row_state[r] != FRESH:  # it held a key before: re-initialise it
                reset[n_reset] = r
                n_reset += 1
            _bind(slots, info, row_state, s, r, key, 1, step)
            inserted += 1
            touched += 1
            if heap.shape[0]:
                _push_scored(heap, meta, info, r, eviction)
        rows[i] = r
    meta[N_FREE] = n_free
    meta[TOUCHED] = touched
    meta[SIZE] += inserted
    meta[INSERTS] += inserted
    return n_reset


@njit(inline="always", cache=True)
def _resume_probe(slots: np.ndarray, mask: Int, s: Int, key: Int) -> Int:
    """Continue a probe for `key` from slot s (the empty slot that ended an earlier probe): inserts
    since then may have filled it and the slots after it; the path before it is unchanged (nothing
    was deleted). Returns the slot holding `key` or the next empty one."""
    while slots[s, 1] != -1 and slots[s, 0] != key:
        s = (s + 1) & mask
    return s


@njit(cache=True)
def _probe_batch(t: Arrays, keys: np.ndarray, rows: np.ndarray) -> Int:
    """rows[i] = the row of keys[i], or -2 - (the empty slot that ended its probe); returns the number
    of missing occurrences. Changes nothing in the table."""
    slots = t.slots
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    n_miss = 0
    for i in range(n):
        if i + AHEAD < n:
            prefetch(slots, _home(keys[i + AHEAD], mask) * 2, 2)
        s = _probe(slots, mask, keys[i])
        if s >= 0:
            rows[i] = slots[s, 1]
        else:
            rows[i] = s - 1
            n_miss += 1
    return n_miss


@njit(cache=True)
def _insert_missing(
    t: Arrays, keys: np.ndarray, rows: np.ndarray, reset: np.ndarray, step: Int, eviction: Int, n_miss: Int
) -> Int:
    """After _probe_batch, when every key is admitted and the free rows suffice: touch the found rows,
    then new keys take free rows in order of first occurrence (a repeat finds its first occurrence).
    Returns the number of reset rows."""
    _room_in_heap(t, n_miss, eviction)
    slots, info, row_state, free, heap, meta = t.slots, t.info, t.row_state, t.free, t.heap, t.meta
    mask = slots.shape[0] - 1
    _touch_found(info, meta, rows, step)
    n_reset: Int = 0
    for i in range(keys.shape[0]):
        if rows[i] >= 0:
            continue
        key = keys[i]
        s = _resume_probe(slots, mask, -2 - rows[i], key)
        if slots[s, 1] != -1:
            r = slots[s, 1]
            info[r, COUNT] += 1
        else:
            meta[N_FREE] -= 1
            r = free[meta[N_FREE]]
            if row_state[r] != FRESH:
                reset[n_reset] = r
                n_reset += 1
            _give_row(slots, info, row_state, heap, meta, s, r, key, 1, step, eviction)
        rows[i] = r
    return n_reset


@njit(inline="always", cache=True)
def _give_row(
    slots: np.ndarray,
    info: np.ndarray,
    row_state: np.ndarray,
    heap: np.ndarray,
    meta: np.ndarray,
    s: Int,
    r: Int,
    key: Int,
    occ: Int,
    step: Int,
    eviction: Int,
) -> None:
    """_bind with the table's counters and the heap kept up to date."""
    _bind(slots, info, row_state, s, r, key, occ, step)
    meta[SIZE] += 1
    meta[INSERTS] += 1
    meta[TOUCHED] += 1
    if heap.shape[0]:
        _push_scored(heap, meta, info, r, eviction)


@njit(cache=True)
def _distinct_missing(keys: np.ndarray, rows: np.ndarray, n_miss: Int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct missing keys in order of first occurrence and their occurrences in the batch;
    rows[i] of a missing key becomes -2 - (its index among them)."""
    size = 2
    while size < 2 * n_miss:
        size *= 2
    mask = size - 1
    seen_key = np.empty(size, dtype=np.int64)
    seen_index = np.full(size, -1, dtype=np.int64)
    ukeys = np.empty(n_miss, dtype=np.int64)
    uocc = np.zeros(n_miss, dtype=np.int64)
    n_u = 0
    for i in range(keys.shape[0]):
        if rows[i] >= 0:
            continue
        key = keys[i]
        s = _home(key, mask)
        while seen_index[s] != -1 and seen_key[s] != key:
            s = (s + 1) & mask
        if seen_index[s] == -1:
            seen_index[s] = n_u
            seen_key[s] = key
            ukeys[n_u] = key
            n_u += 1
        u = seen_index[s]
        uocc[u] += 1
        rows[i] = -2 - u
    return ukeys[:n_u], uocc[:n_u]


@njit(cache=True)
def _admission(sketch: np.ndarray, ukeys: np.ndarray, uocc: np.ndarray, use_sketch: bool, min_count: Int) -> np.ndarray:
    """Which distinct new keys are admitted: all, or those whose count-min estimate plus their
    occurrences in this batch reaches min_count (decided before the sketch counts this batch)."""
    admitted = np.ones(ukeys.shape[0], dtype=np.bool_)
    if use_sketch:
        for u in range(ukeys.shape[0]):
            admitted[u] = sketch_estimate(sketch, ukeys[u]) + uocc[u] >= min_count
    return admitted


@njit(cache=True)
def _room(t: Arrays, rows: np.ndarray, needed: Int, step: Int, eviction: Int) -> tuple[Int, Int]:
    """Whether `needed` new rows can be had at `step`: (status, protected rows). Rows touched at this
    step (by this batch or an earlier call at the same step) are never evicted for this step's keys."""
    protected: Int = 0
    if needed == 0:
        return OK, protected
    if eviction == EVICT_NONE:
        if t.meta[SIZE] + needed > t.info.shape[0]:
            return FULL, protected
    elif needed > t.meta[N_FREE]:
        protected = _protected_rows(t.info, t.meta, rows, step)
        if protected + needed > t.info.shape[0]:
            return BATCH_TOO_LARGE, protected
        if t.heap.shape[0] == 0:
            return NEED_HEAP, protected
    # rows taken from the free stack push without popping; evictions pop before they push
    _room_in_heap(t, min(needed, t.meta[N_FREE]), eviction)
    return OK, protected


@njit(cache=True)
def _insert_admitted(
    t: Arrays,
    rows: np.ndarray,
    reset: np.ndarray,
    ukeys: np.ndarray,
    uocc: np.ndarray,
    admitted: np.ndarray,
    use_sketch: bool,
    step: Int,
    eviction: Int,
) -> Int:
    """The general path's changes, once the batch is known to fit: the sketch counts the batch, found
    rows are touched, admitted keys take a free row or evict one (refused keys map to -1), and rows[]
    gets each missing occurrence's row. Returns the number of reset rows.

    Eviction frees the held row with the smallest exact score; rows touched at this step that come
    off the heap first are kept aside (`deferred`) and pushed back at the end."""
    slots, info, row_state, free, heap, meta = t.slots, t.info, t.row_state, t.free, t.heap, t.meta
    n_u = ukeys.shape[0]
    mask = slots.shape[0] - 1
    if use_sketch:
        for u in range(n_u):
            _sketch_add(t.sketch, ukeys[u], uocc[u])
    _touch_found(info, meta, rows, step)
    n_reset: Int = 0
    new_row = np.empty(n_u, dtype=np.int64)
    deferred = np.empty(0, dtype=np.int64)
    n_def = 0
    for u in range(n_u):
        if not admitted[u]:
            new_row[u] = -1
            meta[REFUSED] += 1
            continue
        if meta[N_FREE] > 0:
            meta[N_FREE] -= 1
            r = free[meta[N_FREE]]
        else:
            if deferred.shape[0] == 0:
                deferred = np.empty(info.shape[0], dtype=np.int64)
            while True:
                r = _pop_exact(info, row_state, heap, meta, eviction)
                if r < 0:
                    raise RuntimeError("hash table: eviction heap ran empty (internal invariant broken)")
                if info[r, LAST] != step:
                    break
                deferred[n_def] = r
                n_def += 1
            _release(slots, info, row_state, r)
            meta[SIZE] -= 1
            meta[EVICTIONS] += 1
        if row_state[r] != FRESH:
            reset[n_reset] = r
            n_reset += 1
        empty = -1 - _probe(slots, mask, ukeys[u])  # probed after the eviction: deletion moves entries
        _give_row(slots, info, row_state, heap, meta, empty, r, ukeys[u], uocc[u], step, eviction)
        new_row[u] = r
    for k in range(n_def):
        _push_scored(heap, meta, info, deferred[k], eviction)
    for i in range(rows.shape[0]):
        if rows[i] <= -2:
            rows[i] = new_row[-2 - rows[i]]
    return n_reset


@njit(cache=True, nogil=True)
def find_or_insert(
    t: Arrays,
    keys: np.ndarray,
    rows: np.ndarray,
    reset: np.ndarray,
    step: Int,
    eviction: Int,
    min_count: Int,
    admit_all: bool,
) -> tuple[Int, Int, Int, Int]:
    """keys [N] -> rows [N] (written): touch found rows, give rows to admitted new keys (see hugerec.ops.hash_table_arrays).

    Returns (status, E, rows needed, rows protected) with reset[:E] (reset is [N]) the rows that held
    another key before and must be re-initialised. On a non-OK status nothing in the table changed.
    Only ints are returned: boxing a returned array costs a pickle round trip per call.
    """
    n = keys.shape[0]
    use_sketch = bool(min_count > 1 and not admit_all)
    if not use_sketch and n <= t.meta[N_FREE]:
        return OK, _insert_pipelined(t, keys, rows, reset, step, eviction), n, 0
    n_miss = _probe_batch(t, keys, rows)
    if not use_sketch and n_miss <= t.meta[N_FREE]:
        return OK, _insert_missing(t, keys, rows, reset, step, eviction, n_miss), n_miss, 0
    ukeys, uocc = _distinct_missing(keys, rows, n_miss)
    admitted = _admission(t.sketch, ukeys, uocc, use_sketch, min_count)
    needed = np.int64(admitted.sum())
    status, protected = _room(t, rows, needed, step, eviction)
    if status != OK:
        return status, 0, needed, protected
    n_reset = _insert_admitted(t, rows, reset, ukeys, uocc, admitted, use_sketch, step, eviction)
    return OK, n_reset, needed, protected


# -- remove / load -----------------------------------------------------------------------------------


@njit(cache=True)
def remove(t: Arrays, keys: np.ndarray, out: np.ndarray) -> None:
    """Drop keys (absent ones are skipped); out[i] = freed row or -1. Freed rows go on the free stack."""
    slots, info, row_state, free, meta = t.slots, t.info, t.row_state, t.free, t.meta
    mask = slots.shape[0] - 1
    for i in range(keys.shape[0]):
        s = _probe(slots, mask, keys[i])
        if s < 0:
            out[i] = -1
            continue
        r = slots[s, 1]
        _delete_slot(slots, s)
        if info[r, LAST] == meta[STEP]:
            meta[TOUCHED] -= 1
        row_state[r] = FREED
        free[meta[N_FREE]] = r
        meta[N_FREE] += 1
        meta[SIZE] -= 1
        meta[REMOVED] += 1
        out[i] = r


@njit(cache=True)
def insert_mapping(slots: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> None:
    """Put distinct, absent keys into the slots (loading a saved table)."""
    mask = slots.shape[0] - 1
    for i in range(keys.shape[0]):
        s = -1 - _probe(slots, mask, keys[i])
        slots[s, 0] = keys[i]
        slots[s, 1] = rows[i]


@njit(cache=True, parallel=True)
def find_or_insert_tables(
    group: TableGroup,
    keys: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    reset: np.ndarray,
    steps: np.ndarray,
    status: np.ndarray,
) -> None:
    """`find_or_insert` (after `expire` where the table has a ttl) of T tables side by side.

    Table t maps keys[starts[t]:ends[t]] into the same span of `rows` at steps[t]; a negative
    steps[t] means the table's next step (its last step + 1, 1 for the first), written back into
    steps[t]. The spans do not overlap. Keys without a row get the table's unknown row where it has
    one, else -1. Its (status, E, needed, protected) go to status[t] and its reset rows to
    reset[starts[t]:starts[t] + E]. A table with a non-OK status is unchanged (apart from the
    expiry): the caller handles it alone.

    One parallel region on the kernels' own thread team: Python threads calling the serial kernel
    share the cores with that team's spinning workers, which made them about twice as slow.
    """
    slots, info, row_state, free, heap, sketch, meta, policy = group
    for t in prange(len(slots)):
        table = Arrays(slots[t], info[t], row_state[t], free[t], heap[t], sketch[t], meta[t])
        a, b = starts[t], ends[t]
        if steps[t] < 0:
            steps[t] = max(table.meta[STEP], 0) + 1
        ttl = policy[t, POLICY_TTL]
        if ttl >= 0 and steps[t] >= table.meta[STEP]:
            expire(table, steps[t], ttl)
        eviction, min_count = policy[t, POLICY_EVICTION], policy[t, POLICY_MIN_COUNT]
        code, n_reset, needed, protected = find_or_insert(
            table, keys[a:b], rows[a:b], reset[a:b], steps[t], eviction, min_count, False
        )
        status[t, 0] = code
        status[t, 1] = n_reset
        status[t, 2] = needed
        status[t, 3] = protected
        if code == OK:
            _fill_unknown(rows, a, b, policy[t, POLICY_UNKNOWN])


@njit(inline="always", cache=True)
def _fill_unknown(rows: np.ndarray, a: Int, b: Int, unknown: Int) -> None:
    if unknown >= 0:
        for i in range(a, b):
            if rows[i] < 0:
                rows[i] = unknown


@njit(cache=True, parallel=True)
def lookup_tables(group: TableGroup, keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> None:
    """`lookup` of T tables side by side: rows[starts[t]:ends[t]] = rows of keys[starts[t]:ends[t]] in
    table t, missing keys getting the table's unknown row where it has one, else -1; the spans do
    not overlap."""
    slots, policy = group.slots, group.policy
    for t in prange(len(slots)):
        lookup(slots[t], keys[starts[t] : ends[t]], rows[starts[t] : ends[t]])
        _fill_unknown(rows, starts[t], ends[t], policy[t, POLICY_UNKNOWN])
