from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.data.sessions import Sequences, last_n
from hugerec.embedding.optimizers import Adam
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SequenceConfig
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.sequential import (
    BCE,
    FullSoftmax,
    SequentialTrainConfig,
    evaluate_next_item,
    fit_sequential,
    recommend_next,
    window_width,
)

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
    report = fit_sequential(model, last_n(train, window_width(model)), SequentialTrainConfig(loss=loss, epochs=12, batch_size=24, lr=0.01, seed=0))
    assert report.steps == 12 * 5 and report.samples == 12 * 120
    assert report.losses[-1] < report.losses[0]
    test = _chains(50, 6, seed=1)
    hist = test.items.reshape(50, 6)[:, :5]
    targets = test.items.reshape(50, 6)[:, 5]
    m = evaluate_next_item(model, np.pad(hist, ((0, 0), (1, 0))), targets, ks=(1, 10))
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


def test_train_config_errors() -> None:
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        SequentialTrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="mask_prob"):
        SequentialTrainConfig(mask_prob=1.0)
    model = SASRec(SequenceConfig(num_items=5, max_len=4, dim=8))
    one = Sequences(np.arange(1), np.array([0, 1]), np.array([3]), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="no training sequence has 2 or more items"):
        fit_sequential(model, last_n(one, window_width(model)), SequentialTrainConfig())
    with pytest.raises(ValueError, match=r"windows must be \[S, 5\], got shape \(1, 4\)"):
        fit_sequential(model, last_n(one, 4), SequentialTrainConfig())
