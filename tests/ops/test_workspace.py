from __future__ import annotations

import copy
import pickle
import threading

import numpy as np
import torch

from hugerec.ops.workspace import OutputPool, Workspace


def test_arrays_are_reused_and_grow() -> None:
    ws = Workspace()
    a = ws.array("x", 10, np.int64)
    a[:] = 3
    b = ws.array("x", 5, np.int64)
    assert b.shape == (5,) and np.shares_memory(a, b)
    c = ws.array("x", 100, np.int64)
    assert c.shape == (100,) and not np.shares_memory(a, c)
    d = ws.array("x", 120, np.int64)  # grows by 1.5x: room for 150
    assert np.shares_memory(d, ws.array("x", 150, np.int64))


def test_row_map_starts_at_minus_one() -> None:
    ws = Workspace()
    m = ws.row_map(7)
    assert m.dtype == np.int32 and (m == -1).all()
    assert ws.row_map(7) is m


def test_output_pool_recycles_only_unreferenced_storage() -> None:
    pool = OutputPool(capacity=2)
    a = pool.empty((4, 3), torch.float32, torch.device("cpu"))
    a_ptr = a.data_ptr()
    view = a[:, :1]
    del a
    b = pool.empty((4, 3), torch.float32, torch.device("cpu"))  # a's storage is still seen through `view`
    assert b.data_ptr() != a_ptr
    del view
    c = pool.empty((2, 5), torch.float32, torch.device("cpu"))  # free again, and large enough
    assert c.data_ptr() == a_ptr and c.shape == (2, 5) and c.is_contiguous()
    d = pool.empty((4, 3), torch.float32, torch.device("cpu"))  # both pooled storages busy: a plain tensor
    assert d.data_ptr() not in (a_ptr, b.data_ptr())
    assert not c._is_view()  # autograd sees an ordinary tensor


def test_output_pool_prefers_the_smallest_fit_and_replaces_free_misfits() -> None:
    cpu = torch.device("cpu")
    pool = OutputPool(capacity=2)
    big = pool.empty((100,), torch.float32, cpu)
    small = pool.empty((10,), torch.float32, cpu)
    big_ptr, small_ptr = big.data_ptr(), small.data_ptr()
    del big, small
    assert pool.empty((8,), torch.float32, cpu).data_ptr() == small_ptr
    ints = pool.empty((5,), torch.int64, cpu)  # no int64 storage: a free float one is replaced
    assert ints.dtype == torch.int64 and ints.data_ptr() not in (big_ptr, small_ptr)


def test_output_pool_gives_each_thread_its_own_storages_and_copies_start_empty() -> None:
    cpu = torch.device("cpu")
    pool = OutputPool(capacity=2)
    mine = pool.empty((4,), torch.float32, cpu)
    ptr = mine.data_ptr()
    del mine  # free in this thread's pool
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(pool.empty((4,), torch.float32, cpu).data_ptr()))
    worker.start()
    worker.join()
    assert seen[0] != ptr  # another thread never gets this thread's storage, free or not
    assert pool.empty((4,), torch.float32, cpu).data_ptr() == ptr
    for clone in (copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        assert clone.capacity == 2 and clone.empty((4,), torch.float32, cpu).data_ptr() != ptr
