from __future__ import annotations

import numpy as np

from hugerec.ops.workspace import Workspace


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
