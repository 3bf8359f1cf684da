"""MatrixFactorization: forward and an SGD step == nn.Embedding(sparse) + torch.optim.SGD."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hugerec as hr
from hugerec.models.mf import MatrixFactorization
from hugerec.training.losses import bpr


def test_forward_and_sgd_step_match_plain_torch() -> None:
    torch.manual_seed(0)
    model = MatrixFactorization(num_users=6, num_items=9, dim=4, optimizer=hr.SGD(lr=0.3))
    ref_u = nn.Embedding(6, 4, sparse=True)
    ref_i = nn.Embedding(9, 4, sparse=True)
    ref_u.weight.data.copy_(model.user_embedding.table_weight("user_id"))
    ref_i.weight.data.copy_(model.item_embedding.table_weight("item_id"))
    opt = torch.optim.SGD([ref_u.weight, ref_i.weight], lr=0.3)
    users, pos, neg = torch.tensor([0, 5, 0]), torch.tensor([1, 1, 8]), torch.tensor([2, 3, 1])
    q = model.user_vectors(users)
    v = model.item_vectors(torch.cat([pos, neg]))
    loss = bpr(q, v[:3], pos, v[3:], neg)
    loss.backward()
    ref_v = ref_i(torch.cat([pos, neg]))
    ref_loss = bpr(ref_u(users), ref_v[:3], pos, ref_v[3:], neg)
    torch.testing.assert_close(loss.detach(), ref_loss.detach())
    ref_loss.backward()
    opt.step()
    torch.testing.assert_close(model.user_embedding.table_weight("user_id"), ref_u.weight.detach())
    torch.testing.assert_close(model.item_embedding.table_weight("item_id"), ref_i.weight.detach())


def test_errors() -> None:
    with pytest.raises(ValueError, match="dim must be >= 1"):
        MatrixFactorization(3, 3, dim=0)
    with pytest.raises(ValueError, match="temperature"):
        MatrixFactorization(3, 3, temperature=-1.0)
