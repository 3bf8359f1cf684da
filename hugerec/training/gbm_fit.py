"""fit_trees: LightGBM / XGBoost on a FeatureMatrix, logged like `fit` logs a deep model.

    model, history = fit_trees(LightGBMConfig(), train, eval_, out_dir="runs/gbm", metric="auc")

The library trains (its own early stopping on the eval rows: `early_stopping_rounds` rounds without a
better `metric`); every round's train logloss and eval AUC / logloss go to metrics.jsonl and
TensorBoard like the trainer's steps (a round is a step), a progress line every `log_every` rounds,
curves.png at the end. The model keeps the best round's trees; its final evaluation uses the
trainer's exact metrics (AUC, logloss, calibration) on the eval rows.

A ranking objective (LightGBM "lambdarank", XGBoost "rank:ndcg" / "rank:pairwise") trains on the
queries of FeatureMatrix.groups; every round logs the library's NDCG@K (and LightGBM's MAP@K; XGBoost's takes only 0/1 labels) on the train and eval rows,
early stopping watches the eval NDCG@K (`metric` is then ignored), and the final evaluation is
hugerec.training.query_metrics (NDCG@K, MAP@K, MRR@K per query, averaged). No curves.png: the
curves are in metrics.jsonl and TensorBoard.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.models.gbm import (
    Categorical,
    FeatureMatrix,
    GBMConfig,
    Library,
    LightGBMConfig,
    TreeModel,
    XGBoostConfig,
    is_ranking,
    library_of,
    require,
)
from hugerec.training.metrics import BinaryMetrics
from hugerec.training.query_metrics import query_metrics
from hugerec.training.run_log import RunLog, plot_curves

RESERVED = ("objective", "sigmoid", "num_class", "booster", "boosting")  # set by the config; the rest of params is free


@dataclass
class TreeHistory:
    """What fit_trees did: rounds trained, the best round (1-based), and the final exact evaluation."""

    rounds: int
    best_round: int
    stopped_early: bool
    final_eval: dict[str, float] | None
    seconds: float
    plot: Path | None = None
    records: list[dict[str, float]] = field(default_factory=list)


def tree_metrics(model: TreeModel, data: FeatureMatrix, threads: int = 0, eval_at: int = 10) -> dict[str, float]:
    """The trainer's metrics (exact AUC, logloss, calibration, ctr, count) of `model` on `data`; for rows
    grouped into queries (data.groups), NDCG@K, MAP@K and MRR@K with K = eval_at."""
    margins = model.margin(data.x, threads)
    if data.groups.size:
        return query_metrics(margins, data.labels, data.groups, eval_at)
    metrics = BinaryMetrics()
    metrics.update(torch.from_numpy(margins.astype(np.float32)), torch.from_numpy(data.labels))
    return metrics.compute()


def fit_trees(
    config: GBMConfig,
    train: FeatureMatrix,
    eval_: FeatureMatrix | None,
    out_dir: str | Path | None = None,
    metric: str = "auc",
    log_every: int = 50,
    seed: int | None = 0,
) -> tuple[TreeModel, TreeHistory]:
    """Train `config`'s library on `train`, stop early on `eval_` by `metric` ("auc" or "logloss"; NDCG@K
    for a ranking objective)."""
    library = library_of(config)
    module = require(library)
    ranking = is_ranking(config)
    if metric not in ("auc", "logloss"):
        raise ValueError(f"fit_trees: metric must be 'auc' or 'logloss', got {metric!r}")
    if ranking:
        metric = f"ndcg@{config.eval_at}"
    reserved = sorted(set(config.params) & set(RESERVED))
    if reserved:
        raise ValueError(f"model.params: {reserved} are set by the config (model.objective); leave them out")
    if eval_ is not None and eval_.names != train.names:
        raise ValueError(f"fit_trees: eval columns {list(eval_.names)} differ from train columns {list(train.names)}")
    for data, where in ((train, "train"), (eval_, "eval")):
        if data is not None and ranking != bool(data.groups.size):
            need = "needs rows grouped into queries (model.group)" if ranking else "takes rows without queries"
            raise ValueError(f"fit_trees: objective {config.objective!r} {need}; the {where} rows do not match")
    t0 = time.perf_counter()
    records: list[dict[str, float]] = []
    with RunLog(out_dir) as log:

        def on_round(round_: int, values: dict[str, float]) -> None:
            record = {"round": float(round_), **values}
            records.append(record)
            if ranking:
                for split in ("train", "eval"):
                    logged = {k.removeprefix(f"{split}_"): v for k, v in values.items() if k.startswith(f"{split}_")}
                    if logged:
                        log.write(split, round_, logged)
            else:
                log.write("train", round_, {"loss": values["train_logloss"]})
                if "eval_auc" in values:
                    log.write("eval", round_, {"auc": values["eval_auc"], "logloss": values["eval_logloss"]})
            if log_every and (round_ % log_every == 0 or round_ == 1):
                shown = "  ".join(f"{k} {v:.4f}" for k, v in values.items())
                print(f"round {round_}/{config.num_trees}  {shown}", file=sys.stderr, flush=True)

        match config:
            case LightGBMConfig():
                booster, best = _fit_lightgbm(module, config, train, eval_, metric, seed, on_round)
            case XGBoostConfig():
                booster, best = _fit_xgboost(module, config, train, eval_, metric, seed, on_round)
        model = TreeModel(library, booster)
        final = None
        if eval_ is not None:
            final = tree_metrics(model, eval_, config.threads, config.eval_at)
            log.write("eval", best, {**final, "final": 1.0})
    rounds = len(records)
    plot = None
    if out_dir is not None and not ranking:
        train_curve = [{"step": r["round"], "loss": r["train_logloss"]} for r in records]
        eval_curve = [
            {"step": r["round"], "auc": r["eval_auc"], "logloss": r["eval_logloss"]} for r in records if "eval_auc" in r
        ]
        plot = plot_curves(train_curve, eval_curve, Path(out_dir) / "curves.png")
    stopped = rounds < config.num_trees
    return model, TreeHistory(rounds, best, stopped, final, time.perf_counter() - t0, plot, records)


def _categorical(config: GBMConfig, data: FeatureMatrix) -> list[int]:
    return list(data.categorical) if config.categorical is Categorical.NATIVE else []


def _fit_lightgbm(
    lgb: Any,
    config: LightGBMConfig,
    train: FeatureMatrix,
    eval_: FeatureMatrix | None,
    metric: str,
    seed: int | None,
    on_round: Any,
) -> tuple[Any, int]:
    if is_ranking(config):  # LightGBM names them ndcg@K, map@K in its results
        metrics: dict[str, Any] = {"metric": ["ndcg", "map"], "eval_at": [config.eval_at]}
    else:
        chosen, other = ("auc", "binary_logloss") if metric == "auc" else ("binary_logloss", "auc")
        metrics = {"metric": [chosen, other]}
    params: dict[str, Any] = {
        "objective": config.objective,
        "learning_rate": config.learning_rate,
        "num_leaves": config.num_leaves,
        "min_data_in_leaf": config.min_data_in_leaf,
        **metrics,
        "first_metric_only": True,
        "verbosity": -1,
        **({"num_threads": config.threads} if config.threads else {}),
        **({"seed": seed} if seed is not None else {}),
        **config.params,
    }
    cats = _categorical(config, train)
    names = list(train.names)
    def queries(m: FeatureMatrix) -> np.ndarray | None:
        return m.groups if m.groups.size else None

    dtrain = lgb.Dataset(
        train.x, train.labels, group=queries(train), feature_name=names, categorical_feature=cats, free_raw_data=False
    )
    sets, set_names = [dtrain], ["train"]
    if eval_ is not None:
        sets.append(lgb.Dataset(eval_.x, eval_.labels, group=queries(eval_), reference=dtrain, categorical_feature=cats))
        set_names.append("eval")

    def callback(env: Any) -> None:
        values = {}
        for data_name, metric_name, value, _ in env.evaluation_result_list:
            key = {"auc": "auc", "binary_logloss": "logloss"}.get(metric_name, metric_name)
            values[f"{data_name}_{key}"] = float(value)
        on_round(env.iteration + 1, values)

    callbacks = [callback]
    if eval_ is not None and config.early_stopping_rounds is not None:
        callbacks.append(lgb.early_stopping(config.early_stopping_rounds, first_metric_only=True, verbose=False))
    booster = lgb.train(params, dtrain, config.num_trees, valid_sets=sets, valid_names=set_names, callbacks=callbacks)
    best = booster.best_iteration if booster.best_iteration > 0 else booster.current_iteration()
    kept = lgb.Booster(model_str=booster.model_to_string(num_iteration=best))  # the best round's trees only
    return kept, int(best)


def _fit_xgboost(
    xgb: Any,
    config: XGBoostConfig,
    train: FeatureMatrix,
    eval_: FeatureMatrix | None,
    metric: str,
    seed: int | None,
    on_round: Any,
) -> tuple[Any, int]:
    native = config.categorical is Categorical.NATIVE
    types = ["q"] * train.num_dense + ["c" if native else "q"] * (len(train.names) - train.num_dense)
    names = list(train.names)
    # XGBoost's map@K takes only 0/1 labels: a ranking model logs its NDCG@K alone
    watched = [metric] if is_ranking(config) else ["logloss" if metric == "auc" else "auc", metric]
    params: dict[str, Any] = {
        "objective": config.objective,
        "tree_method": "hist",
        "eta": config.learning_rate,
        "max_depth": config.max_depth,
        "min_child_weight": config.min_child_weight,
        "eval_metric": watched,  # XGBoost stops early on the last one
        "max_cat_to_onehot": 1,
        **({"nthread": config.threads} if config.threads else {}),
        **({"seed": seed} if seed is not None else {}),
        **config.params,
    }

    def matrix(m: FeatureMatrix) -> Any:
        d = xgb.DMatrix(m.x, m.labels, feature_names=names, feature_types=types, enable_categorical=native)
        if m.groups.size:
            d.set_group(m.groups)
        return d

    dtrain = matrix(train)
    evals = [(dtrain, "train")] + ([(matrix(eval_), "eval")] if eval_ is not None else [])

    class Progress(xgb.callback.TrainingCallback):
        def after_iteration(self, model: Any, epoch: int, evals_log: dict[str, dict[str, list[float]]]) -> bool:
            values = {f"{data}_{name}": float(curve[-1]) for data, log in evals_log.items() for name, curve in log.items()}
            on_round(epoch + 1, values)
            return False

    callbacks: list[Any] = [Progress()]
    if eval_ is not None and config.early_stopping_rounds is not None:
        callbacks.append(
            xgb.callback.EarlyStopping(rounds=config.early_stopping_rounds, metric_name=metric, data_name="eval")
        )
    booster = xgb.train(params, dtrain, config.num_trees, evals=evals, callbacks=callbacks, verbose_eval=False)
    best = int(booster.best_iteration) + 1 if eval_ is not None and config.early_stopping_rounds else booster.num_boosted_rounds()
    kept = booster[:best]  # the best round's trees only
    return kept, best


def library_version(library: Library) -> str:
    return str(require(library).__version__)
