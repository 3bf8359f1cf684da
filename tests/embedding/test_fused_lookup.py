"""The autograd plumbing of the fused lookups: when backward runs, what it updates, what it returns."""

from __future__ import annotations

import pytest
import torch

from hugerec.embedding.fused import FusedTables
from hugerec.embedding.fused_lookup import GroupPlan, pooled_lookup, sequence_lookup
from hugerec.embedding.optimizers import SGD
from hugerec.embedding.table_config import Pooling, TableConfig

# one table "t" of 6 rows, dim 3; one feature; B = 2 bags: [1, 4, 1] and [5]
VALUES = torch.tensor([1, 4, 1, 5])
OFFSETS = torch.tensor([0, 3, 4])


def setup(pooling: Pooling = Pooling.SUM) -> tuple[FusedTables, list[GroupPlan]]:
    fused = FusedTables([TableConfig("t", 6, 3, pooling=pooling)], SGD(lr=1.0))
    plan = torch.tensor([[0, 0, 0, 6, 0, int(pooling is Pooling.MEAN), 0]])
    return fused, [GroupPlan(0, plan, ("f",))]


def test_per_sample_weight_gradient_without_update() -> None:
    fused, plans = setup()
    w = torch.tensor([0.5, 2.0, 1.0, -1.0], requires_grad=True)
    before = fused.table_weight("t").clone()
    out = pooled_lookup(fused, plans, VALUES, OFFSETS, w, 2, 3, update=False)
    grad = torch.randn(2, 3)
    out.backward(grad)
    rows = before[VALUES]  # [N, D]
    bags = torch.tensor([0, 0, 0, 1])
    assert w.grad is not None
    torch.testing.assert_close(w.grad, (grad[bags] * rows).sum(dim=1))
    assert torch.equal(fused.table_weight("t"), before)
    assert fused.steps == {"t": 0}


def test_update_applies_sgd_once_per_backward() -> None:
    fused, plans = setup(Pooling.MEAN)
    before = fused.table_weight("t").clone()
    out = pooled_lookup(fused, plans, VALUES, OFFSETS, None, 2, 3, update=True)
    assert out.requires_grad
    out.backward(torch.ones(2, 3))
    expected = before.clone()
    expected[1] -= 2 / 3  # twice in a bag of three
    expected[4] -= 1 / 3
    expected[5] -= 1.0
    torch.testing.assert_close(fused.table_weight("t"), expected)
    assert fused.steps == {"t": 1}


def test_no_graph_without_grad() -> None:
    fused, plans = setup()
    with torch.no_grad():
        assert not pooled_lookup(fused, plans, VALUES, OFFSETS, None, 2, 3, update=True).requires_grad
    assert not pooled_lookup(fused, plans, VALUES, OFFSETS, None, 2, 3, update=False).requires_grad


def test_sequence_rows_and_their_update() -> None:
    fused, plans = setup(Pooling.NONE)
    before = fused.table_weight("t").clone()
    (out,) = sequence_lookup(fused, plans, VALUES, OFFSETS, 2, [4], update=True)
    torch.testing.assert_close(out, before[VALUES])
    out.sum().backward()
    torch.testing.assert_close(fused.table_weight("t")[1], before[1] - 2.0)


def test_invalid_ids_are_named() -> None:
    fused, plans = setup()
    with pytest.raises(ValueError, match=r"feature 'f' \(table 't', num_rows 6\): id 6 of example 1 is outside"):
        pooled_lookup(fused, plans, torch.tensor([1, 4, 1, 6]), OFFSETS, None, 2, 3, update=True)
