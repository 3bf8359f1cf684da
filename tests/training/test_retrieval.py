"""The retrieval family of the one trainer: learns the synthetic data past popularity and early-stops on
recall@K; pipeline on/off, dynamic and disk-tier tables bit for bit; recommend's fallbacks and errors;
retrieval_metrics == full_ranking_metrics on the model's own vectors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hugerec as hr
from hugerec.data.interactions import held_out_csr, histories, iter_examples, last_items, leave_last_out
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import DynamicConfig, Normal, TableConfig
from hugerec.index.topk import matmul_block
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.family import StepContext
from hugerec.training.losses import BPR, Negatives, SampledSoftmax
from hugerec.training.ranking_metrics import full_ranking_metrics
from hugerec.training.retrieval import (
    RetrievalFamily,
    RetrievalValidation,
    all_item_vectors,
    recommend,
    retrieval_metrics,
    user_vectors,
)
from hugerec.training.trainer import TrainConfig, evaluate, fit


def quiet(**kw: Any) -> TrainConfig:
    return TrainConfig(progress=False, tensorboard=False, plot=False, **kw)


def examples(train: Any, batch: int, max_history: int) -> EpochBatches[Any]:
    return EpochBatches(lambda e: iter_examples(train, batch, max_history, seed=e), length=-(-train.num_events // batch))


def validation(split: tuple[Any, Any, Any], max_history: int) -> RetrievalValidation:
    train, held, excl = split
    users = torch.arange(train.num_users)
    return RetrievalValidation(users, last_items(*excl, users.numpy(), max_history), held, excl)


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
    if isinstance(loss, SampledSoftmax) and loss.negatives is Negatives.MIXED:
        loss = SampledSoftmax(num_negatives=32)
    valid = validation(split, 10)
    history = fit(model, examples(train, 256, 0), valid, quiet(epochs=5, log_every=2), family=RetrievalFamily(train.item_counts(), loss, ks=(10,)))
    assert history.train[-1]["loss"] < history.train[0]["loss"]
    assert [r["step"] for r in history.evals] == [float(s) for s in range(history.steps // 5, history.steps + 1, history.steps // 5)]
    got = retrieval_metrics(model, valid.users, valid.history, held, excl, (10,))
    assert got["recall@10"] == history.evals[-1]["recall@10"]
    pop = torch.from_numpy(train.item_counts().astype(np.float32))
    popular = full_ranking_metrics(lambda u0, u1, i0, i1: pop[i0:i1].expand(u1 - u0, -1), held, excl, train.num_items, (10,))
    assert got["recall@10"] > popular["recall@10"]
    # the same numbers from the model's vectors through the generic scorer
    same = full_ranking_metrics(matmul_block(user_vectors(model, valid.users, valid.history), all_item_vectors(model)), held, excl, train.num_items, (10,))
    assert same == got


def test_early_stopping_on_recall_keeps_the_best(split: tuple[Any, Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A learning rate that overshoots: recall@10 peaks, the run stops after `patience` evaluations and
    the best evaluation's weights are restored (checkpoints/best/ too); the progress bar shows recall@10,
    metrics.jsonl and TensorBoard log it, curves.png plots it."""
    train = split[0]
    torch.manual_seed(0)
    model = MatrixFactorization(train.num_users, train.num_items, 16, hr.Adam(lr=0.3))
    es = hr.training.EarlyStopping(patience=1, min_delta=0.0, restore_best=True)
    cfg = TrainConfig(epochs=8, early_stopping=es, out_dir=str(tmp_path))
    history = fit(model, examples(train, 64, 0), validation(split, 0), cfg, family=RetrievalFamily(train.item_counts(), SampledSoftmax(num_negatives=16)))
    assert f"recall@10={history.evals[-1]['recall@10']:.4f}" in capsys.readouterr().err
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())
    assert history.stopped_early and history.best_eval is not None and len(history.evals) < 8
    assert history.best_eval["recall@10"] == max(r["recall@10"] for r in history.evals)
    valid = validation(split, 0)
    now = retrieval_metrics(model, valid.users, valid.history, valid.held_out, valid.exclude, (10, 50))
    assert now["recall@10"] == history.best_eval["recall@10"]
    assert history.best_checkpoint is not None and (tmp_path / "curves.png").is_file()
    assert (tmp_path / "metrics.jsonl").read_text().count('"recall@10"') == len(history.evals)


def _mf_with(user_table: TableConfig, seed: int, num_users: int, num_items: int) -> MatrixFactorization:
    """MF whose user table is `user_table` (memory or disk) and whose item table is dynamic (the item ids
    are its raw keys, in a hash map of more slots than items)."""
    torch.manual_seed(seed)
    model = MatrixFactorization(num_users, num_items, 8, hr.Adam(lr=0.05))
    model.user_embedding = EmbeddingCollection([user_table], hr.Adam(lr=0.05))
    dynamic = TableConfig("item_id", num_items + 24, 8, init=Normal(0.0, 0.1), dynamic=DynamicConfig())
    model.item_embedding = EmbeddingCollection([dynamic], hr.Adam(lr=0.05))
    return model


@pytest.mark.parametrize("pipeline", [False, True])
def test_dynamic_and_disk_tables_train_bit_for_bit_with_and_without_the_pipeline(
    split: tuple[Any, Any, Any], tmp_path: Path, pipeline: bool
) -> None:
    """A disk-tier user table with a cache of about two batches' rows and a dynamic item table (keys
    remapped): staged a step ahead by the pipeline, the same weights as the in-memory table without it."""
    train = split[0]
    n_users, n_items = train.num_users, train.num_items
    memory = TableConfig("user_id", n_users, 8, init=Normal(0.0, 0.1))
    disk = dataclasses.replace(memory, storage="disk", cache_rows=128, path=str(tmp_path / "users.rows"))
    family = RetrievalFamily(train.item_counts(), SampledSoftmax(num_negatives=8))
    ref = _mf_with(memory, 0, n_users, n_items)
    fit(ref, examples(train, 64, 0), None, quiet(epochs=2, pipeline=False), family=family)
    got = _mf_with(disk, 0, n_users, n_items)
    history = fit(got, examples(train, 64, 0), None, quiet(epochs=2, pipeline=pipeline, log_every=5), family=family)
    ids = torch.arange(n_items)
    assert torch.equal(ref.item_vectors(ids), got.item_vectors(ids))
    for users in torch.arange(n_users).split(50):  # the cache holds 128 rows
        assert torch.equal(ref.user_vectors(users), got.user_vectors(users))
    last = history.train[-1]
    assert 0 < last["cache_hit_rate"] < 1 and ("prefetch_hidden" in last) == pipeline


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


def test_the_step_masks_history_items_out_of_the_negatives(split: tuple[Any, Any, Any]) -> None:
    """mask_history: the family's step loss is the sampled softmax with each row's history ids excluded
    (the plain formulation with a dense mask, the same negatives), and differs from the unmasked one."""
    from hugerec.training.losses import NegativeSampler, sampled_softmax_plain

    train = split[0]
    torch.manual_seed(0)
    model = TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, max_history=10, recent=(1,)), train.num_users, train.num_items)
    batch = next(iter_examples(train, 64, 10, seed=0))
    users, items, history = batch
    losses = {}
    for mask in (False, True):
        family = RetrievalFamily(train.item_counts(), SampledSoftmax(num_negatives=16, mask_history=mask))
        ctx = StepContext(torch.device("cpu"), torch.Generator().manual_seed(3))
        losses[mask] = family.step_loss(model, family.prepare(model, batch, ctx), ctx)
    sampler = NegativeSampler(SampledSoftmax(num_negatives=16), train.item_counts())
    neg_ids = sampler.sample(64, torch.Generator().manual_seed(3))
    ids = torch.cat([items, neg_ids])
    with torch.no_grad():
        q, cand = model.user_vectors(users, history), model.item_vectors(ids)
        exclude = (torch.repeat_interleave(torch.arange(64), history.lengths.to(torch.int64)), history.values)
        want = sampled_softmax_plain(q, cand[:64], items, cand[64:], neg_ids, sampler.log_q(ids, 64), True, 1.0, exclude)
    torch.testing.assert_close(losses[True].detach(), want, rtol=1e-5, atol=1e-6)
    assert abs(float(losses[True].detach()) - float(losses[False].detach())) > 1e-3


def test_family_errors() -> None:
    with pytest.raises(ValueError, match="ks must be integers >= 1"):
        RetrievalFamily(np.ones(5), ks=(0,))
    with pytest.raises(ValueError, match="item_counts must be a non-empty"):
        RetrievalFamily(np.zeros(5))


def test_evaluate_of_a_retrieval_validation_is_the_full_ranking(split: tuple[Any, Any, Any]) -> None:
    """training.evaluate, the one evaluation of every family, gives a RetrievalValidation its full-ranking
    metrics (default ks 10 and 50) and refuses batches for a model without a batch forward's data."""
    train, _, _ = split
    torch.manual_seed(0)
    model = MatrixFactorization(train.num_users, train.num_items, 8, hr.Adam(lr=1e-2))
    valid = validation(split, 10)
    direct = retrieval_metrics(model, valid.users, valid.history, valid.held_out, valid.exclude, (10, 50))
    assert evaluate(model, valid) == direct
    assert evaluate(model, valid, ks=(5,)) == retrieval_metrics(model, valid.users, valid.history, valid.held_out, valid.exclude, (5,))


def test_the_step_does_not_depend_on_the_row_order_of_its_batch(split: tuple[Any, Any, Any]) -> None:
    """A batch's rows reversed (users, targets, histories): the same loss and dense gradients up to rounding, with
    in-batch and sampled negatives, logQ, history masking and cosine similarity at a low temperature. The
    float-order yardstick of benchmarks/torchrun_retrieval.py (--float-order) trains on such batches."""
    train = split[0]
    users, items, history = next(iter_examples(train, 64, 10, seed=0))
    offsets = np.concatenate([[0], np.cumsum(history.lengths.numpy())])
    flipped = JaggedTensor(
        torch.cat([history.values[offsets[i] : offsets[i + 1]] for i in range(63, -1, -1)]), history.lengths.flip(0)
    )
    config = TwoTowerConfig(dim=8, embedding_dim=8, max_history=10, recent=(1, 5), similarity="cosine", temperature=0.05)
    family = RetrievalFamily(train.item_counts(), SampledSoftmax(Negatives.MIXED, num_negatives=16, mask_history=True))
    results = []
    for batch in ((users, items, history), (users.flip(0), items.flip(0), flipped)):
        torch.manual_seed(0)
        model = TwoTower(config, train.num_users, train.num_items)
        ctx = StepContext(torch.device("cpu"), torch.Generator().manual_seed(3))
        loss = family.step_loss(model, family.prepare(model, batch, ctx), ctx)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-6, atol=1e-6)
    assert grads_a and len(grads_a) == len(grads_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
