"""kernel_threads: both pools set inside the block and restored after it, also when it raises."""

from __future__ import annotations

import numba
import pytest
import torch

from hugerec.ops.kernel_threads import kernel_threads


def test_kernel_threads_sets_and_restores_both_pools() -> None:
    before = numba.get_num_threads(), torch.get_num_threads()
    with kernel_threads(1):
        assert (numba.get_num_threads(), torch.get_num_threads()) == (1, 1)
    assert (numba.get_num_threads(), torch.get_num_threads()) == before
    with pytest.raises(RuntimeError, match="inside"), kernel_threads(1):
        raise RuntimeError("inside")
    assert (numba.get_num_threads(), torch.get_num_threads()) == before


def test_kernel_threads_refuses_zero() -> None:
    with pytest.raises(ValueError, match="n must be >= 1, got 0"), kernel_threads(0):
        pass
