"""DeviceCopy: batches arrive on the device equal to the host batch; off CUDA it is Batch.to."""

from __future__ import annotations

import pytest
import torch

from hugerec.sparse.batch import Batch
from hugerec.sparse.device_copy import DeviceCopy, batch_tensors, pin_batch
from hugerec.sparse.features import SparseFeatures


def _batch() -> Batch:
    sparse = SparseFeatures.from_lists(
        {"a": [[1, 2], [], [3]], "b": [[4], [5], [6]]}, {"a": [[0.5, 1], [], [2]], "b": [[1], [1], [1]]}
    )
    return Batch(torch.randn(3, 2), sparse, torch.tensor([0.0, 1.0, 1.0]))


def _same(a: Batch, b: Batch) -> None:
    assert a.sparse.keys == b.sparse.keys
    for x, y in zip(batch_tensors(a), batch_tensors(b), strict=True):
        assert torch.equal(x.cpu(), y.cpu())


def test_off_cuda_it_is_a_plain_move() -> None:
    copy = DeviceCopy("cpu")
    assert copy.stream is None
    batch = _batch()
    _same(copy(batch), batch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_copies_are_pinned_asynchronous_and_equal() -> None:
    batch = _batch()
    pinned = pin_batch(batch)
    assert all(t.is_pinned() for t in batch_tensors(pinned))
    copy = DeviceCopy("cuda")
    moved = [copy(batch) for _ in range(3)]
    torch.cuda.current_stream().synchronize()
    for m in moved:
        assert all(t.device.type == "cuda" for t in batch_tensors(m))
        _same(m, batch)
