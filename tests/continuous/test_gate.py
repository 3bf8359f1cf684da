"""The gate's Recall@K check: thresholds as data, a worse retrieval candidate refused, bad figures named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hugerec as hr
from hugerec.continuous.gate import GateConfig, check
from hugerec.data.interactions import held_out_csr, histories, iter_examples, last_items, leave_last_out
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.models.mf import MatrixFactorization
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.losses import SampledSoftmax
from hugerec.training.retrieval import RetrievalFamily, retrieval_metrics
from hugerec.training.trainer import TrainConfig, fit


def test_recall_thresholds() -> None:
    cfg = GateConfig(recall_k=10, recall_margin=0.02, min_rows=50)
    serving = {"recall@10": 0.30, "users": 200.0}
    assert check({"recall@10": 0.29, "users": 200.0}, serving, cfg).passed  # within the margin
    worse = check({"recall@10": 0.25, "users": 200.0}, serving, cfg)
    assert not worse.passed and "Recall@10 0.2500 < serving 0.3000 - margin 0.02" in worse.reason
    assert worse.figures == {"candidate_recall@10": 0.25, "serving_recall@10": 0.30, "rows": 200.0}
    # sequential candidates count queries; NaN and a small holdout fail; nothing serving: no comparison
    nan = check({"recall@10": math.nan, "queries": 10.0}, None, cfg)
    assert not nan.passed and "recall@10 not finite" in nan.reason and "10 rows < min_rows 50" in nan.reason
    assert check({"recall@10": 0.01, "queries": 80.0}, None, cfg).passed


def test_bad_figures_and_thresholds_are_named() -> None:
    cfg = GateConfig(recall_k=20)
    with pytest.raises(ValueError, match=r"hold neither .* nor 'recall@20' \(gate.recall_k = 20\)"):
        check({"recall@10": 0.3, "users": 10.0}, None, cfg)
    with pytest.raises(ValueError, match="gated against a model of its own kind"):
        check({"recall@20": 0.3, "users": 10.0}, {"auc": 0.7, "logloss": 0.5, "calibration": 1.0, "count": 9}, cfg)
    with pytest.raises(ValueError, match="no row count"):
        check({"recall@20": 0.3}, None, cfg)
    with pytest.raises(ValueError, match="recall_k must be an integer >= 1, got 0"):
        GateConfig(recall_k=0)
    with pytest.raises(ValueError, match=r"recall_margin must be a number in \[0, 1\], got -0\.1"):
        GateConfig(recall_margin=-0.1)


@pytest.mark.slow  # three short retrieval trainings (about 2 s on an idle machine)
def test_gate_refuses_a_worse_retrieval_candidate() -> None:
    """A trained matrix factorisation serves; a candidate trained on shuffled items (the retrieval analogue of
    shuffled labels) is refused on the same leave-last-out holdout, a second trained one passes."""
    synth = generate_interactions(
        InteractionConfig(num_users=200, num_items=40, rank=2, min_events=10, max_events=20, affinity=3.0, seed=0)
    )
    train, test = leave_last_out(synth.data)
    held, excl = held_out_csr(test), histories(train)
    users = torch.arange(train.num_users)
    hist = last_items(*excl, users.numpy(), 10)
    items_shuffled = np.random.default_rng(1).permutation(train.num_items)

    def trained(seed: int, shuffle: bool) -> dict[str, float]:
        torch.manual_seed(seed)
        model = MatrixFactorization(train.num_users, train.num_items, 8, hr.Adam(lr=3e-2))

        def batches(epoch: int):  # type: ignore[no-untyped-def]
            for u, t, h in iter_examples(train, 256, 0, seed=epoch):
                yield u, (torch.from_numpy(items_shuffled)[t] if shuffle else t), h

        family = RetrievalFamily(train.item_counts(), SampledSoftmax(num_negatives=16))
        quiet = TrainConfig(epochs=4, progress=False, tensorboard=False, plot=False)
        fit(model, EpochBatches(batches), None, quiet, family=family)
        return retrieval_metrics(model, users, hist, held, excl, (10,))

    cfg = GateConfig(recall_k=10, recall_margin=0.02, min_rows=100)
    serving, broken, fresh = trained(0, False), trained(1, True), trained(2, False)
    refused = check(broken, serving, cfg)
    assert not refused.passed and "Recall@10" in refused.reason, (broken, serving)
    assert refused.figures["candidate_recall@10"] < serving["recall@10"] - 0.02
    assert check(fresh, serving, cfg).passed, (fresh, serving)
