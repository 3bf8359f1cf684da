"""The worker processes of these tests run Numba's workqueue threading layer.

Numba's default OpenMP layer shares libgomp with torch; after each parallel Numba kernel its waiting
threads slow torch's own CPU ops down by orders of magnitude on a busy machine (see the report in
benchmarks/sharding.py). The single-threaded worker processes that spawn() starts get the
workqueue layer through the environment. This pytest process must keep its thread-safe layer
(workqueue aborts when two threads launch kernels at once, as the serving tests do), so it picks
its layer with a first parallel launch *before* the variable is set, and the variable is set only
while a test of this folder runs.
"""

from collections.abc import Iterator

import numba
import numpy as np
import pytest


@numba.njit(parallel=True, cache=True)
def _first_parallel_launch(x: np.ndarray) -> float:
    total = 0.0
    for i in numba.prange(x.shape[0]):
        total += x[i]
    return total


@pytest.fixture(autouse=True)
def _workqueue_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _first_parallel_launch(np.ones(4))  # fixes this process's threading layer before the variable exists
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "workqueue")
    yield
