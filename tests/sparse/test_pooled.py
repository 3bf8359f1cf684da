from __future__ import annotations

import pytest
import torch

from hugerec.sparse.pooled import PooledEmbeddings


def test_views_and_stacking() -> None:
    p = PooledEmbeddings(("a", "b"), (2, 2), torch.arange(8.0).view(2, 4))
    assert p["b"].tolist() == [[2, 3], [6, 7]]
    assert p.column_offsets() == [0, 2] and p.batch_size == 2
    assert p.stacked().shape == (2, 2, 2) and p.stacked()[1, 0].tolist() == [4, 5]
    p["a"][0, 0] = 9  # a view into the concatenated values
    assert p.values[0, 0] == 9
    assert list(p.to_dict()) == ["a", "b"]


def test_errors() -> None:
    with pytest.raises(ValueError, match="does not match dims sum 5"):
        PooledEmbeddings(("a", "b"), (2, 3), torch.zeros(1, 4))
    with pytest.raises(ValueError, match="2 keys but 1 dims"):
        PooledEmbeddings(("a", "b"), (2,), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="different dims"):
        PooledEmbeddings(("a", "b"), (1, 3), torch.zeros(1, 4)).stacked()
    with pytest.raises(KeyError, match="unknown feature 'c'"):
        PooledEmbeddings(("a",), (1,), torch.zeros(1, 1))["c"]
