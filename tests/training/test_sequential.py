"""The sequential family of the one trainer: the models learn a deterministic chain with every loss;
early stopping on recall@K; dynamic and disk-tier item tables with and without the pipeline, bit for
bit; recommend_next; errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hugerec.data.sessions import Sequences, last_n
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import DynamicConfig
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SequenceConfig, item_table
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.sequential import (
    BCE,
    FullSoftmax,
    NextItemValidation,
    SequentialFamily,
    next_item_metrics,
    recommend_next,
    window_batches,
    window_width,
)
from hugerec.training.trainer import TrainConfig, fit

NUM_ITEMS = 40


def _chains(n: int, length: int, seed: int) -> Sequences:
    """Sequences following item i -> i % NUM_ITEMS + 1: the next item is a function of the last one."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(1, NUM_ITEMS + 1, n)
    items = (starts[:, None] - 1 + np.arange(length)[None, :]) % NUM_ITEMS + 1
    return Sequences(np.arange(n), np.arange(0, n * length + 1, length), items.reshape(-1), np.zeros(n * length, np.int64))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_type", "loss"),
    [
        (SASRec, FullSoftmax()),
        (SASRec, SampledSoftmax(negatives=Negatives.MIXED, num_negatives=16, alpha=0.5)),
        (SASRec, BCE()),
        (GRU4Rec, FullSoftmax()),
        (MaskedTransformer, FullSoftmax()),
    ],
)
def test_models_learn_a_deterministic_chain(model_type: type[SASRec], loss: FullSoftmax | SampledSoftmax | BCE) -> None:
    torch.manual_seed(0)
    cfg = SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=32, num_layers=1, num_heads=1, dropout=0.0)
    model = model_type(cfg, optimizer=Adam(lr=0.02))
    train = _chains(120, 7, seed=0)
    counts = np.bincount(train.items, minlength=NUM_ITEMS + 1)
    family = SequentialFamily(loss, item_counts=counts)
    cfg = TrainConfig(epochs=12, lr=0.01, log_every=5, progress=False, tensorboard=False, plot=False)
    history = fit(model, window_batches(last_n(train, window_width(model)), 24), None, cfg, family=family)
    assert history.steps == 12 * 5 and history.train[-1]["loss"] < history.train[0]["loss"]
    test = _chains(50, 6, seed=1)
    hist = test.items.reshape(50, 6)[:, :5]
    targets = test.items.reshape(50, 6)[:, 5]
    m = next_item_metrics(model, np.pad(hist, ((0, 0), (1, 0))), targets, ks=(1, 10))
    assert m["recall@10"] > 0.9, m  # popularity would give 10 / 40


def test_recommend_next_truncates_and_rejects_empty_histories() -> None:
    torch.manual_seed(0)
    cfg = SequenceConfig(num_items=NUM_ITEMS, max_len=4, dim=8, num_layers=1, dropout=0.0)
    model = SASRec(cfg)
    long = np.arange(1, 11)  # 10 items, the model sees the last 4
    items, scores = recommend_next(model, [long, long[-4:]], k=5)
    assert items.shape == (2, 5) and (items[0] == items[1]).all()
    np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5)
    assert (np.diff(scores, axis=1) <= 0).all()
    excl, _ = recommend_next(model, [long], k=NUM_ITEMS - 10, exclude_history=True)
    assert not set(excl[0].tolist()) & set(long.tolist())
    with pytest.raises(ValueError, match="history 1 is empty"):
        recommend_next(model, [long, np.array([], dtype=np.int64)])
    with pytest.raises(ValueError, match=r"item ids must be in 1..40, got range 1..41"):
        recommend_next(model, [np.array([1, 41])])


def _validation(n: int, seed: int) -> NextItemValidation:
    test = _chains(n, 6, seed=seed)
    return NextItemValidation(np.pad(test.items.reshape(n, 6)[:, :5], ((0, 0), (1, 0))), test.items.reshape(n, 6)[:, 5])


def test_early_stopping_on_recall_restores_the_best(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Early stopping on recall@5 keeps the best epoch's weights; progress bar, metrics.jsonl, TensorBoard, curves.png."""
    torch.manual_seed(0)
    model = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=16, num_layers=1, dropout=0.0), optimizer=Adam(lr=0.5))
    es = EarlyStopping(patience=1, min_delta=0.0, restore_best=True)
    cfg = TrainConfig(epochs=10, lr=0.05, early_stopping=es, out_dir=str(tmp_path))
    valid = _validation(40, 1)
    history = fit(model, window_batches(last_n(_chains(60, 7, 0), 7), 20), valid, cfg, family=SequentialFamily(ks=(5,)))
    assert history.best_eval is not None and history.best_eval["recall@5"] == max(r["recall@5"] for r in history.evals)
    assert next_item_metrics(model, valid.histories, valid.targets, ks=(5,))["recall@5"] == history.best_eval["recall@5"]
    assert history.stopped_early == (len(history.evals) < 10) and (tmp_path / "curves.png").is_file()
    assert f"recall@5={history.evals[-1]['recall@5']:.4f}" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text().count('"recall@5"') == len(history.evals)
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def _sasrec(table: Any, seed: int) -> SASRec:
    torch.manual_seed(seed)
    model = SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8, num_layers=1, dropout=0.1), optimizer=Adam(lr=0.05))
    model.lookup.items = EmbeddingCollection([table], Adam(lr=0.05))
    return model


@pytest.mark.parametrize("pipeline", [False, True])
def test_dynamic_and_disk_item_tables_train_bit_for_bit(tmp_path: Path, pipeline: bool) -> None:
    """The item table on disk (a cache of about two batches' rows: evictions every step) or dynamic (raw
    keys through the hash map), staged a step ahead by the pipeline or not: the in-memory table's
    weights, with dropout drawing from the global stream in between."""
    memory = item_table(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8))
    disk = dataclasses.replace(memory, storage="disk", cache_rows=30, path=str(tmp_path / "items.rows"))
    dynamic = dataclasses.replace(memory, num_rows=64, dynamic=DynamicConfig())
    train = _chains(60, 7, seed=0)
    family = SequentialFamily(SampledSoftmax(Negatives.IN_BATCH), item_counts=np.ones(NUM_ITEMS + 1))
    cfg = TrainConfig(epochs=2, lr=0.01, log_every=3, progress=False, tensorboard=False, plot=False)
    no_pipeline = dataclasses.replace(cfg, pipeline=False)
    ref = _sasrec(memory, 0)
    fit(ref, window_batches(last_n(train, 7), 2), None, no_pipeline, family=family)
    got = _sasrec(disk, 0)
    history = fit(got, window_batches(last_n(train, 7), 2), None, dataclasses.replace(cfg, pipeline=pipeline), family=family)
    assert ("prefetch_hidden" in history.train[-1]) == pipeline and 0 < history.train[-1]["cache_hit_rate"] < 1
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), got.parameters(), strict=True))
    for ids in torch.arange(1, NUM_ITEMS + 1).split(10):
        assert torch.equal(ref.item_vectors(ids), got.item_vectors(ids))
    # a dynamic table hands rows out in first-seen order: compare it with itself without the pipeline
    plain, staged = _sasrec(dynamic, 0), _sasrec(dynamic, 0)
    fit(plain, window_batches(last_n(train, 7), 2), None, no_pipeline, family=family)
    fit(staged, window_batches(last_n(train, 7), 2), None, dataclasses.replace(cfg, pipeline=pipeline), family=family)
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), staged.state_dict().values(), strict=True))


def test_family_and_window_errors() -> None:
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        window_batches(np.ones((2, 3), dtype=np.int64), 0)
    with pytest.raises(ValueError, match="mask_prob"):
        SequentialFamily(mask_prob=1.0)
    with pytest.raises(ValueError, match="SampledSoftmax needs item_counts"):
        SequentialFamily(SampledSoftmax())
    model = SASRec(SequenceConfig(num_items=5, max_len=4, dim=8))
    one = Sequences(np.arange(1), np.array([0, 1]), np.array([3]), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="no training sequence has 2 or more items"):
        window_batches(last_n(one, window_width(model)), 8)
    two = Sequences(np.arange(1), np.array([0, 2]), np.array([3, 4]), np.zeros(2, np.int64))
    quiet = TrainConfig(progress=False, tensorboard=False, plot=False)
    with pytest.raises(ValueError, match=r"batches must be windows \[B, 5\], got shape \(1, 4\)"):
        fit(model, window_batches(last_n(two, 4), 8), None, quiet, family=SequentialFamily())
    with pytest.raises(ValueError, match=r"item ids must be in 1..5 \(0 = padding\), got 1..9"):
        fit(model, window_batches(last_n(two, 5) * 2 + 1, 8), None, quiet, family=SequentialFamily())
