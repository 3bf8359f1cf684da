"""Retrieval training loop: learns the synthetic data past popularity; recommend's fallbacks and errors;
evaluate_retrieval == evaluate_ranking on the model's own vectors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import hugerec as hr
from hugerec.data.interactions import held_out_csr, histories, iter_examples, last_items, leave_last_out
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.index.topk import matmul_block
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.losses import BPR, Negatives, SampledSoftmax
from hugerec.training.ranking_metrics import evaluate_ranking
from hugerec.training.retrieval import (
    RetrievalTrainConfig,
    all_item_vectors,
    evaluate_retrieval,
    fit_retrieval,
    recommend,
    user_vectors,
)


@pytest.fixture(scope="module")
def split() -> tuple[Any, Any, Any]:  # (train, held-out CSR, training CSR)
    synth = generate_interactions(InteractionConfig(num_users=200, num_items=40, rank=2, min_events=10, max_events=20, affinity=3.0, seed=0))
    train, test = leave_last_out(synth.data)
    return train, held_out_csr(test), histories(train)


@pytest.mark.slow  # a few seconds each on an idle machine; training loops
@pytest.mark.parametrize("loss", [SampledSoftmax(), SampledSoftmax(Negatives.IN_BATCH), BPR()])
def test_fit_beats_popularity(split: tuple[Any, Any, Any], loss: SampledSoftmax | BPR) -> None:
    train, held, excl = split
    torch.manual_seed(0)
    model = MatrixFactorization(train.num_users, train.num_items, 16, hr.Adam(lr=2e-2))
    losses = fit_retrieval(model, lambda e: iter_examples(train, 256, 0, seed=e), train.item_counts(),
                           RetrievalTrainConfig(epochs=5, loss=SampledSoftmax(num_negatives=32) if isinstance(loss, SampledSoftmax) and loss.negatives is Negatives.MIXED else loss))
    assert losses[-1] < losses[0]
    users = torch.arange(train.num_users)
    hist = last_items(*excl, users.numpy(), 10)
    got = evaluate_retrieval(model, users, hist, held, excl, (10,))
    pop = torch.from_numpy(train.item_counts().astype(np.float32))
    popular = evaluate_ranking(lambda u0, u1, i0, i1: pop[i0:i1].expand(u1 - u0, -1), held, excl, train.num_items, (10,))
    assert got["recall@10"] > popular["recall@10"]
    # the same numbers from the model's vectors through the generic scorer
    same = evaluate_ranking(matmul_block(user_vectors(model, users, hist), all_item_vectors(model)), held, excl, train.num_items, (10,))
    assert same == got


def test_recommend_cold_start_and_errors(split: tuple[Any, Any, Any]) -> None:
    train = split[0]
    model = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, user_layers=(), max_history=5, recent=(1,)), train.num_users, train.num_items)
    users = torch.tensor([0, 10**6])
    hist = JaggedTensor(torch.tensor([1, 2, 3]), torch.tensor([2, 1]))
    rec = recommend(model, users, hist, 5, item_counts=train.item_counts())
    assert rec.cold.tolist() == [False, True]
    assert rec.items[1].tolist() == np.argsort(-train.item_counts(), kind="stable")[:5].tolist()
    with pytest.raises(ValueError, match="user id 1000000 was never seen"):
        recommend(model, users, hist, 5)
    with pytest.raises(ValueError, match=r"k = 41 must be in 1\.\.40"):
        recommend(model, users, hist, 41, item_counts=train.item_counts())
    with pytest.raises(ValueError, match="history item id 99 is not in the catalogue"):
        recommend(model, users[:1], JaggedTensor(torch.tensor([99]), torch.tensor([1])), 5)
    no_id = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, use_user_id=False, max_history=5, recent=()), train.num_users, train.num_items)
    with pytest.raises(ValueError, match="user 0 has an empty history"):
        recommend(no_id, users[:1], JaggedTensor(torch.empty(0, dtype=torch.int64), torch.tensor([0])), 5)


def test_train_step_masks_history_items_out_of_the_negatives(split: tuple[Any, Any, Any]) -> None:
    """mask_history: train_step's loss is the sampled softmax with each row's history ids excluded
    (the plain formulation with a dense mask, the same negatives), and differs from the unmasked one."""
    from hugerec.training.losses import NegativeSampler, sampled_softmax_plain
    from hugerec.training.retrieval import train_step

    train = split[0]
    torch.manual_seed(0)
    model = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, max_history=10, recent=(1,)), train.num_users, train.num_items)
    batch = next(iter_examples(train, 64, 10, seed=0))
    users, items, history = batch
    losses = {}
    for mask in (False, True):
        sampler = NegativeSampler(SampledSoftmax(num_negatives=16, mask_history=mask), train.item_counts())
        losses[mask] = train_step(model, batch, sampler, torch.Generator().manual_seed(3))
    neg_ids = sampler.sample(64, torch.Generator().manual_seed(3))
    ids = torch.cat([items, neg_ids])
    with torch.no_grad():
        q, cand = model.user_vectors(users, history), model.item_vectors(ids)
        exclude = (torch.repeat_interleave(torch.arange(64), history.lengths.to(torch.int64)), history.values)
        want = sampled_softmax_plain(q, cand[:64], items, cand[64:], neg_ids, sampler.log_q(ids, 64), True, 1.0, exclude)
    torch.testing.assert_close(losses[True].detach(), want, rtol=1e-5, atol=1e-6)
    assert abs(float(losses[True].detach()) - float(losses[False].detach())) > 1e-3
