"""The disk tier's cache contract on ReferenceCache, the plain-Python twin the kernels are tested against
(tests/ops/cpu/test_row_cache_kernels.py): a trace worked out by hand of hits, least-recently-used misses, a
dirty row written back when evicted, a batch larger than the cache refused while its slots are pinned, a
repeated id counted once, and bad or missing ids; the module's ops are the Numba kernels."""

from __future__ import annotations

import numpy as np

from hugerec.ops import row_cache
from hugerec.ops.cpu import row_cache_kernels
from hugerec.ops.row_cache import BAD_ID, CACHE_FULL, HITS, MISSES, READS, WRITES, ReferenceCache


def _file() -> np.ndarray:
    return np.arange(15, dtype=np.uint8).reshape(5, 3)  # 5 rows of 3 bytes: 2 weight bytes + 1 state byte


def test_a_hand_traced_sequence() -> None:
    file = _file()
    cache = ReferenceCache(file, slots=2, weight_bytes=2)
    assert cache.prepare(np.array([0, 1]), False, False, 0).tolist() == [0, 1]  # two misses fill the slots
    assert cache.counts[MISSES] == 2 and cache.counts[READS] == 2
    np.testing.assert_array_equal(cache.records, file[[0, 1]])
    assert cache.prepare(np.array([0, 0]), False, True, 0).tolist() == [0, 0]  # a hit, counted once; now dirty
    assert cache.counts[HITS] == 1
    cache.records[0] = 99  # the step's update of row 0 in its slot
    assert cache.prepare(np.array([2]), False, False, 0).tolist() == [1]  # slot 1 (row 1) is the least recent
    assert cache.counts[WRITES] == 0  # row 1 was clean: nothing written back
    assert cache.prepare(np.array([3]), False, False, 0).tolist() == [0]  # evicts row 0, dirty: written back
    assert cache.counts[WRITES] == 1 and file[0].tolist() == [99, 99, 99]
    np.testing.assert_array_equal(cache.records[0], file[3])
    assert (cache.counts[HITS], cache.counts[MISSES], cache.counts[READS]) == (1, 4, 4)


def test_pinned_slots_are_never_taken() -> None:
    cache = ReferenceCache(_file(), slots=2, weight_bytes=2)
    assert cache.prepare(np.array([0, 1, 2]), False, False, 1) == CACHE_FULL  # 3 rows, 2 slots, this batch pinned
    fresh = ReferenceCache(_file(), slots=2, weight_bytes=2)
    fresh.prepare(np.array([0, 1]), False, False, 2)
    assert fresh.prepare(np.array([2]), False, False, 2) == CACHE_FULL  # the previous batch's slots are pinned too
    assert fresh.prepare(np.array([2]), False, False, 1).tolist() == [0]  # only this batch pinned: row 0 goes


def test_bad_and_missing_ids() -> None:
    cache = ReferenceCache(_file(), slots=2, weight_bytes=2)
    assert cache.prepare(np.array([5]), False, False, 0) == BAD_ID
    assert cache.prepare(np.array([-1]), False, False, 0) == BAD_ID
    assert cache.prepare(np.array([-1, 4]), True, False, 0).tolist() == [-1, 0]
    assert cache.counts[MISSES] == 1


def test_the_ops_are_the_numba_kernels() -> None:
    assert row_cache.prepare is row_cache_kernels.prepare and row_cache.flush is row_cache_kernels.flush
    assert row_cache.gather is row_cache_kernels.gather and row_cache.scatter is row_cache_kernels.scatter
