"""The threads the CPU kernels use, set for a stretch of code and put back after it.

    with kernel_threads(1):          # Numba's parallel regions and torch's intra-op pool: one thread each
        for q in queries: answer(q)  # one row at a time, where waking a pool costs more than it saves

Numba's setting is the calling thread's own (other threads keep theirs); torch's is process-wide.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numba
import torch


@contextmanager
def kernel_threads(n: int) -> Iterator[None]:
    """Numba's and torch's CPU thread counts set to `n` inside the block, the previous ones restored after
    it (also when it raises); `n` beyond Numba's pool is refused by Numba, naming the limit."""
    if n < 1:
        raise ValueError(f"kernel_threads: n must be >= 1, got {n}")
    before = numba.get_num_threads(), torch.get_num_threads()
    numba.set_num_threads(n)
    torch.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before[0])
        torch.set_num_threads(before[1])
