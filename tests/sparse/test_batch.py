from __future__ import annotations

import pytest
import torch

from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def test_batch() -> None:
    sparse = SparseFeatures.from_lists({"a": [[1], [2, 3]]})
    b = Batch(torch.zeros(2, 3), sparse, torch.ones(2))
    assert b.batch_size == 2
    moved = b.to("cpu")
    assert torch.equal(moved.sparse.values, sparse.values)


def test_errors() -> None:
    sparse = SparseFeatures.from_lists({"a": [[1], [2, 3]]})
    with pytest.raises(ValueError, match=r"dense must be \[B=2, Dd\]"):
        Batch(torch.zeros(3, 1), sparse, torch.ones(2))
    with pytest.raises(ValueError, match="sparse batch size 2 != 3 labels"):
        Batch(torch.zeros(3, 1), sparse, torch.ones(3))
    Batch(torch.zeros(2, 0), SparseFeatures.from_lists({}), torch.ones(2))  # no sparse features is fine
