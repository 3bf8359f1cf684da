"""fit_trees: both libraries learn a separable-ish task, log every round (metrics.jsonl, curves.png) and stop early
on the eval rows keeping the best round; the final evaluation is tree_metrics, the trainer's exact metrics;
a ranking objective trains on queries and reports NDCG/MAP/MRR; mismatched data and reserved params refused.
Needs lightgbm and xgboost (skipped without)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from hugerec.models.gbm import FeatureMatrix, LightGBMConfig, XGBoostConfig
from hugerec.training.gbm_fit import RESERVED, fit_trees, tree_metrics

pytest.importorskip("lightgbm")
pytest.importorskip("xgboost")


def _matrix(n: int, seed: int, groups: bool = False) -> FeatureMatrix:
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.normal(size=n), rng.integers(0, 5, n)]).astype(np.float32)
    p = 1 / (1 + np.exp(-(2 * x[:, 0] + (x[:, 1] == 3))))
    y = (rng.random(n) < p).astype(np.float32)
    if groups:
        return FeatureMatrix(x, y, ("d0", "c0"), 1, np.full(n // 10, 10, np.int64))
    return FeatureMatrix(x, y, ("d0", "c0"), 1)


CONFIGS = [
    LightGBMConfig(num_trees=40, num_leaves=7, min_data_in_leaf=5, early_stopping_rounds=5, threads=1),
    XGBoostConfig(num_trees=40, max_depth=3, early_stopping_rounds=5, threads=1),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["lightgbm", "xgboost"])
def test_fit_logs_rounds_and_evaluates_exactly(config: LightGBMConfig | XGBoostConfig, tmp_path: Path) -> None:
    train, eval_ = _matrix(1500, 0), _matrix(500, 1)
    model, history = fit_trees(config, train, eval_, out_dir=tmp_path, log_every=0)
    assert 1 <= history.best_round <= history.rounds <= 40 and history.stopped_early == (history.rounds < 40)
    assert history.final_eval is not None and history.final_eval["auc"] > 0.75
    assert history.final_eval["auc"] == pytest.approx(roc_auc_score(eval_.labels, model.margin(eval_.x)), abs=1e-6)
    assert tree_metrics(model, eval_) == history.final_eval
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["split"] == "train" for r in lines) == history.rounds
    assert lines[-1]["final"] == 1.0 and lines[-1]["step"] == history.best_round
    assert history.plot == tmp_path / "curves.png" and history.plot.is_file()


def test_a_ranking_objective_trains_on_queries() -> None:
    config = LightGBMConfig(
        num_trees=10, num_leaves=7, min_data_in_leaf=5, objective="lambdarank", group="q", eval_at=5, threads=1
    )
    train, eval_ = _matrix(600, 0, groups=True), _matrix(200, 1, groups=True)
    _, history = fit_trees(config, train, eval_, log_every=0)
    assert history.final_eval is not None and set(history.final_eval) >= {"ndcg@5", "map@5", "mrr@5"}
    assert history.plot is None
    with pytest.raises(
        ValueError,
        match=r"objective 'lambdarank' needs rows grouped into queries \(model\.group\); the train rows do not match",
    ):
        fit_trees(config, _matrix(100, 0), None)
    with pytest.raises(ValueError, match="objective 'binary' takes rows without queries; the eval rows do not match"):
        fit_trees(CONFIGS[0], _matrix(100, 0), _matrix(100, 1, groups=True))


def test_bad_settings_are_refused() -> None:
    train = _matrix(100, 0)
    with pytest.raises(ValueError, match="metric must be 'auc' or 'logloss', got 'ndcg'"):
        fit_trees(CONFIGS[0], train, None, metric="ndcg")
    with pytest.raises(ValueError, match=r"model.params: \['objective'\] are set by the config"):
        fit_trees(LightGBMConfig(params={"objective": "regression"}), train, None)
    other = FeatureMatrix(train.x, train.labels, ("a", "b"), 1)
    with pytest.raises(ValueError, match=r"eval columns \['a', 'b'\] differ from train columns \['d0', 'c0'\]"):
        fit_trees(CONFIGS[0], train, other)
    assert "objective" in RESERVED
