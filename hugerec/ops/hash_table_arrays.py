"""Collisionless hash table ops: raw int64 keys -> rows 0..C-1 of an embedding table.

The state is a bundle of numpy arrays (`HashTableArrays`, layout in `hugerec.ops.cpu.hash_table_kernels`);
the ops below mutate it in place. `DictHashTable` is the same contract written with Python dicts
and lists: the specification, and the oracle the tests compare the kernels against.

Semantics of `find_or_insert(keys [N], step)` (both bodies):
  0. steps never decrease (ValueError otherwise).
  1. keys already held map to their rows; each occurrence adds 1 to the row's count and the row's
     last step becomes `step` (which protects it from eviction during this call).
  2. the distinct missing keys, in order of first occurrence, are admitted if min_count == 1, or if
     their count-min estimate plus their occurrences in this batch reaches min_count (admit_all
     skips admission, for imports); refused keys map to -1.
  3. an admitted key takes the top of the free-row stack (initially rows 0, 1, 2, ... in order);
     when the stack is empty the eviction policy frees the held row with the smallest score among
     rows not protected (touched at this step, by this call or an earlier one at the same step):
     LRU / TTL: (last_step, row);  LFU: (count, last_step, row).
     The new row starts with count = occurrences in the batch and last_step = step. A row that held
     a key before is reported for re-initialisation ("reset rows").
  4. capacity is checked before anything changes: eviction NONE and more new keys than free rows,
     or (with eviction) protected rows + new keys > C, raise ValueError and leave the table as it was.
`expire(step, ttl)` (TTL tables, called before find_or_insert) frees, oldest first, every held row
with step - last_step > ttl. `remove(keys)` frees the rows of the given keys, in order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hugerec.ops import huge_pages
from hugerec.ops.cpu import hash_table_kernels as _cpu

EVICT_NONE = _cpu.EVICT_NONE
EVICT_LRU = _cpu.EVICT_LRU
EVICT_LFU = _cpu.EVICT_LFU
EVICT_TTL = _cpu.EVICT_TTL
OK = _cpu.OK  # find_or_insert_tables status code of a table that took its keys
SKETCH_MAX = 65535  # count-min counters are uint16 and saturate here


@dataclass
class HashTableArrays:
    """Mutable state of one hash table of capacity C (see hugerec.ops.cpu.hash_table_kernels for the layout)."""

    slots: np.ndarray  # [S, 2] int64
    info: np.ndarray  # [C, 4] int64: KEY, LAST, COUNT, GEN
    row_state: np.ndarray  # [C] int8
    free: np.ndarray  # [C] int64
    heap: np.ndarray  # [H, 4] int64 once eviction may be needed (see `heap_capacity`), else [0, 4]
    sketch: np.ndarray  # [depth, width] uint16, or [0, 0] without admission
    meta: np.ndarray  # [META_LEN] int64

    @staticmethod
    def allocate(capacity: int, eviction: int, sketch_depth: int = 0, sketch_width: int = 0) -> HashTableArrays:
        num_slots = 2
        while num_slots < 2 * capacity:
            num_slots *= 2
        # slots and row info are probed at random: huge pages (see hugerec.ops.huge_pages)
        slots = huge_pages.empty_numpy((num_slots, 2), np.int64)
        slots[:, 0] = 0
        slots[:, 1] = -1
        meta = np.zeros(_cpu.META_LEN, dtype=np.int64)
        meta[_cpu.N_FREE] = capacity
        meta[_cpu.STEP] = -1
        # written, not just zero-mapped: the capacity is claimed up front, so that the first touch of
        # each page (a page fault per 128 rows) is paid here and not by the training steps that insert
        info = huge_pages.empty_numpy((capacity, 4), np.int64)
        info.fill(0)
        row_state = np.empty(capacity, dtype=np.int8)
        row_state.fill(0)
        return HashTableArrays(
            slots=slots,
            info=info,
            row_state=row_state,
            # stack top is the end: rows come out as 0, 1, 2, ...
            free=np.arange(capacity - 1, -1, -1, dtype=np.int64),
            heap=np.zeros((heap_capacity(capacity) if eviction == EVICT_TTL else 0, 4), dtype=np.int64),
            sketch=np.zeros((sketch_depth, sketch_width), dtype=np.uint16),
            meta=meta,
        )

    @property
    def capacity(self) -> int:
        return int(self.info.shape[0])

    def kernel(self) -> _cpu.Arrays:
        """The arrays as the kernels take them (one typed tuple)."""
        return _cpu.Arrays(self.slots, self.info, self.row_state, self.free, self.heap, self.sketch, self.meta)

    def counter(self, index: int) -> int:
        return int(self.meta[index])


def heap_capacity(capacity: int) -> int:
    """Eviction-heap entries: one per held row, plus slack for the stale entries of freed rows."""
    return capacity + capacity // 8 + 1


def lookup(t: HashTableArrays, keys: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """keys [N] int64 -> rows [N] int64 (into `out` if given), -1 where absent. Read-only: readers may run
    concurrently with each other, not with a writer."""
    out = np.empty(keys.shape[0], dtype=np.int64) if out is None else out
    _cpu.lookup(t.slots, keys, out)
    return out


def expire(t: HashTableArrays, step: int, ttl: int) -> int:
    """Free every row with step - last_step > ttl; returns how many."""
    return int(_cpu.expire(t.kernel(), step, ttl))


def find_or_insert(
    t: HashTableArrays,
    keys: np.ndarray,
    step: int,
    eviction: int,
    min_count: int = 1,
    admit_all: bool = False,
    where: str = "hash table",
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """keys [N] int64 -> (rows [N] int64 (-1: not admitted; into `out` if given), reset rows [E] int64).

    See the module docstring for the semantics.
    """
    last = t.counter(_cpu.STEP)
    if step < last:
        raise ValueError(f"{where}: step {step} is before the last step seen ({last}); steps must not decrease")
    rows = np.empty(keys.shape[0], dtype=np.int64) if out is None else out
    reset = np.empty(keys.shape[0], dtype=np.int64)

    def call() -> tuple[_cpu.Int, _cpu.Int, _cpu.Int, _cpu.Int]:
        return _cpu.find_or_insert(t.kernel(), keys, rows, reset, step, eviction, min_count, admit_all)

    status, n_reset, needed, protected = call()
    if status == _cpu.NEED_HEAP:
        # the first call that has to evict: from now on the table keeps its eviction order
        t.heap = huge_pages.empty_numpy((heap_capacity(t.capacity), 4), np.int64)
        t.heap.fill(0)
        _cpu.rebuild_heap(t.kernel(), eviction)
        status, n_reset, needed, protected = call()
    if status == _cpu.FULL:
        raise ValueError(
            f"{where}: full ({t.counter(_cpu.SIZE)} of {t.capacity} rows held) and {needed} new keys arrived with "
            "eviction NONE; raise the capacity (TableConfig.num_rows) or choose an eviction policy"
        )
    if status == _cpu.BATCH_TOO_LARGE:
        raise ValueError(
            f"{where}: step {step} needs {protected} rows already touched in it + {needed} new rows but the capacity "
            f"is {t.capacity}; keys of a step are never evicted for keys of the same step, so raise the capacity"
        )
    return rows, reset[:n_reset]


class TablePack:
    """Several hash tables' arrays as the side-by-side kernels take them: one tuple per field, built
    once and reused while the tables keep their arrays (`current`). Passing 26 tables' arrays anew
    costs a few hundred microseconds per call in Python; a pack costs one identity check per table.

    evictions, min_counts, ttls (-1: no expiry) and unknown (the row a key without one gets; -1: none)
    are per table; they form the group's policy array [T, 4] (columns `_cpu.POLICY_*`).
    """

    def __init__(
        self,
        tables: Sequence[HashTableArrays],
        evictions: Sequence[int],
        min_counts: Sequence[int],
        ttls: Sequence[int],
        unknown: Sequence[int],
    ) -> None:
        self.tables = tuple(tables)
        self._heaps = tuple(t.heap for t in self.tables)  # the one array a table replaces (`find_or_insert`)
        policy = np.zeros((len(self.tables), 4), dtype=np.int64)
        policy[:, _cpu.POLICY_EVICTION] = evictions
        policy[:, _cpu.POLICY_MIN_COUNT] = min_counts
        policy[:, _cpu.POLICY_TTL] = ttls
        policy[:, _cpu.POLICY_UNKNOWN] = unknown
        ts = self.tables
        self.group = _cpu.TableGroup(
            slots=tuple(t.slots for t in ts),
            info=tuple(t.info for t in ts),
            row_state=tuple(t.row_state for t in ts),
            free=tuple(t.free for t in ts),
            heap=tuple(t.heap for t in ts),
            sketch=tuple(t.sketch for t in ts),
            meta=tuple(t.meta for t in ts),
            policy=policy,
        )
        self.status = np.zeros((len(self.tables), 4), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tables)

    def current(self, tables: Sequence[HashTableArrays]) -> bool:
        """Whether the pack still holds exactly these tables' arrays."""
        return (
            len(tables) == len(self.tables)
            and all(a is b for a, b in zip(tables, self.tables, strict=True))
            and all(t.heap is h for t, h in zip(self.tables, self._heaps, strict=True))
        )


def lookup_tables(pack: TablePack, keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> None:
    """`lookup` of several tables in one parallel kernel: rows[a:b] = rows of keys[a:b] in table i,
    (a, b) = (starts[i], ends[i]) (keys: contiguous int64 [N]; int64 bounds; the spans do not
    overlap); a missing key gets the table's unknown row where it has one, else -1."""
    _cpu.lookup_tables(pack.group, keys, starts, ends, rows)


def find_or_insert_tables(
    pack: TablePack,
    keys: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    rows: np.ndarray,
    steps: np.ndarray,
    reset: np.ndarray,
) -> np.ndarray:
    """Training lookups of several tables in one parallel kernel (`find_or_insert`, after `expire` for
    the tables with a ttl).

    Table i maps keys[a:b] (keys: contiguous int64 [N]), (a, b) = (starts[i], ends[i]), into rows[a:b]
    at steps[i] (int64 [T]; a negative entry means the table's next step and is replaced by it); the
    spans do not overlap and no step goes back. A key without a row gets the table's unknown row or -1.
    Returns the status [T, 4] (a view of pack.status, valid until the next call): per table (code,
    E, needed, protected). Where code is OK, reset[a:a + E] are the rows to re-initialise; where it
    is not (the table must evict and has no heap yet, or the keys do not fit), the table is
    unchanged, its span of rows holds scratch, and `find_or_insert` alone handles it (or raises).
    """
    _cpu.find_or_insert_tables(pack.group, keys, starts, ends, rows, reset, steps, pack.status)
    return pack.status


def remove(t: HashTableArrays, keys: np.ndarray) -> np.ndarray:
    """Drop keys; returns the freed row per key (-1 where absent)."""
    out = np.empty(keys.shape[0], dtype=np.int64)
    _cpu.remove(t.kernel(), keys, out)
    return out


def rebuild_heap(t: HashTableArrays, eviction: int) -> None:
    """Recompute the eviction heap, if the table keeps one, from the rows (after loading a saved table)."""
    if t.heap.shape[0]:
        _cpu.rebuild_heap(t.kernel(), eviction)


def insert_mapping(t: HashTableArrays, keys: np.ndarray, rows: np.ndarray) -> None:
    """Put distinct keys that are not in the table into the slots, pointing at `rows` (no row bookkeeping)."""
    _cpu.insert_mapping(t.slots, keys, rows)


def sketch_estimate(t: HashTableArrays, key: int) -> int:
    return int(_cpu.sketch_estimate(t.sketch, key))


class DictHashTable:
    """The specification of the ops above on Python dicts and lists (slow, obviously right).

    Admission counts keys exactly (a Counter) where the kernels use a count-min sketch; with a wide
    sketch and few keys the two agree.
    """

    def __init__(self, capacity: int, eviction: int, min_count: int = 1) -> None:
        self.capacity = capacity
        self.eviction = eviction
        self.min_count = min_count
        self.row_of: dict[int, int] = {}
        self.key_of: list[int | None] = [None] * capacity
        self.used_before = [False] * capacity
        self.last_step = [0] * capacity
        self.count = [0] * capacity
        self.free = list(range(capacity - 1, -1, -1))
        self.seen: Counter[int] = Counter()
        self.step = -1
        self.stats = {"inserts": 0, "evictions": 0, "expired": 0, "refused": 0, "removed": 0}

    def lookup(self, keys: list[int]) -> list[int]:
        return [self.row_of.get(k, -1) for k in keys]

    def _score(self, r: int) -> tuple[int, ...]:
        if self.eviction == EVICT_LFU:
            return (self.count[r], self.last_step[r], r)
        return (self.last_step[r], r)

    def _free_row(self, r: int) -> None:
        key = self.key_of[r]
        assert key is not None
        del self.row_of[key]
        self.key_of[r] = None

    def expire(self, step: int, ttl: int) -> int:
        old = sorted((r for r in self.row_of.values() if step - self.last_step[r] > ttl), key=self._score)
        for r in old:
            self._free_row(r)
            self.free.append(r)
        self.stats["expired"] += len(old)
        return len(old)

    def find_or_insert(self, keys: list[int], step: int, admit_all: bool = False) -> tuple[list[int], list[int]]:
        if step < self.step:
            raise ValueError(f"step {step} is before the last step seen ({self.step})")
        occ: dict[int, int] = {}  # distinct missing keys, insertion-ordered
        for k in keys:
            if k not in self.row_of:
                occ[k] = occ.get(k, 0) + 1
        use_counts = self.min_count > 1 and not admit_all
        admitted = {k for k in occ if not use_counts or self.seen[k] + occ[k] >= self.min_count}
        protected = {self.row_of[k] for k in keys if k in self.row_of}
        if step == self.step:  # rows touched earlier at this step stay protected
            protected |= {r for r in self.row_of.values() if self.last_step[r] == step}
        if admitted:
            if self.eviction == EVICT_NONE and len(self.row_of) + len(admitted) > self.capacity:
                raise ValueError("full")
            if self.eviction != EVICT_NONE and len(protected) + len(admitted) > self.capacity:
                raise ValueError("batch too large")
        if use_counts:
            self.seen.update(occ)
        for k in keys:
            if k in self.row_of:
                r = self.row_of[k]
                self.count[r] += 1
                self.last_step[r] = step
        self.step = step
        reset = []
        for k in occ:
            if k not in admitted:
                self.stats["refused"] += 1
                continue
            if self.free:
                r = self.free.pop()
            else:
                r = min((r for r in self.row_of.values() if self.last_step[r] != step), key=self._score)
                self._free_row(r)
                self.stats["evictions"] += 1
            if self.used_before[r]:
                reset.append(r)
            self.used_before[r] = True
            self.row_of[k] = r
            self.key_of[r] = k
            self.last_step[r] = step
            self.count[r] = occ[k]
            self.stats["inserts"] += 1
        return [self.row_of.get(k, -1) for k in keys], reset

    def remove(self, keys: list[int]) -> list[int]:
        out = []
        for k in keys:
            r = self.row_of.get(k, -1)
            if r >= 0:
                self._free_row(r)
                self.free.append(r)
                self.stats["removed"] += 1
            out.append(r)
        return out
