"""train / evaluate / predict / export for model.type = "lightgbm" | "xgboost" (gradient-boosted trees).

The same shards, schema and run directory as the deep models:
    train.out_dir/model.txt (LightGBM text) or model.json (XGBoost JSON): the best round's trees, and
    train.out_dir/model.meta.json   the [model] config, data schema, rounds, best round
    (hugerec.training.save_model / load_model: the model file of every family)
    train.out_dir/metrics.jsonl, tensorboard/, curves.png, config.json

A ranking objective (model.objective = "lambdarank" | "rank:ndcg" | "rank:pairwise") reads the query
column model.group beside the features; `evaluate` reports NDCG@K, MAP@K and MRR@K (K = model.eval_at)
and `predict` writes the raw ranking `score` instead of a probability.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hugerec.cli.config_file import ConfigError
from hugerec.cli.run_config import RunConfig
from hugerec.data.matrix import read_matrix
from hugerec.data.schema import Schema
from hugerec.distributed.launch import launched_by_torchrun
from hugerec.models.gbm import FeatureMatrix, GBMConfig, Library, TreeModel, is_ranking, library_of, require
from hugerec.models.registry import Family
from hugerec.training.gbm_fit import TreeHistory, fit_trees
from hugerec.training.model_file import load_model, save_model
from hugerec.training.trainer import evaluate


def _config(cfg: RunConfig) -> GBMConfig:
    assert isinstance(cfg.model, GBMConfig)  # the CLI sends only trees here
    return cfg.model


def _library(cfg: RunConfig) -> Library:
    return library_of(_config(cfg))


def default_tree_model(cfg: RunConfig) -> Path:
    return cfg.out_dir / _library(cfg).model_file


def _matrix(
    paths: str, where: str, schema: Schema, group: str | None = None, grades: bool | None = None
) -> FeatureMatrix:
    try:
        return read_matrix(paths, schema, True, group, grades)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def tree_schema(schema: Schema) -> Schema:
    """The data schema the trees train on: the shards' schema less its multi-hot columns (trees take one
    value per feature and example), said on one line. The model file keeps this schema, so evaluate,
    predict and export read the same features; the deep models of the same config keep every column."""
    multi = [c.name for c in schema.sparse if c.multi_hot]
    if not multi:
        return schema
    print(f"train: trees take one id per feature; they leave out the multi-hot column(s) {multi}", flush=True)
    return schema.select(n for n in schema.names if n not in multi)


def train_trees(cfg: RunConfig) -> TreeHistory:
    """Train the [model] trees on data.train, stop early on data.eval; write the run directory."""
    from hugerec.cli.commands import read_schema, write_config

    kind = cfg.model_type
    if launched_by_torchrun():
        raise ConfigError(
            f"model.type = {kind!r} trains in one process; sharded / distributed training (torchrun) is for the "
            "deep models: run `hugerec train` without torchrun (the library uses every core of the machine)"
        )
    config = _config(cfg)
    try:
        require(library_of(config))  # before reading any data
    except ImportError as e:
        raise ConfigError(str(e)) from None
    schema = tree_schema(read_schema(cfg.data.schema_path, "data.schema"))
    group = config.group if is_ranking(config) else None
    train = _matrix(cfg.data.train, "data.train", schema, group=group)
    eval_ = None if cfg.data.eval is None else _matrix(cfg.data.eval, "data.eval", schema, group=group)
    model, history = fit_trees(
        config,
        train,
        eval_,
        cfg.out_dir,
        metric=cfg.train.early_stopping.metric or "auc",
        log_every=cfg.train.log_every,
        seed=cfg.train.seed,
    )
    path = cfg.out_dir / library_of(config).model_file
    extra = {"rounds": history.rounds, "best_round": history.best_round, "final_eval": history.final_eval}
    save_model(path, model, config, schema=schema.to_dict(), extra=extra)
    write_config(cfg)
    return history


def load_tree_model(cfg: RunConfig, model_path: Path | None) -> tuple[TreeModel, Schema, Path]:
    """The trained trees (default: train.out_dir/model.txt or model.json) and the schema they were trained on."""
    model, schema, path, _ = _load(cfg, model_path)
    return model, schema, path


def _load(cfg: RunConfig, model_path: Path | None) -> tuple[TreeModel, Schema, Path, GBMConfig]:
    """load_tree_model and the [model] config the trees were trained with (hugerec.training.load_model)."""
    path = model_path or default_tree_model(cfg)
    if not path.is_file():
        raise ConfigError(f"no trained trees at {path}; run `hugerec train` first")
    try:
        saved = load_model(path, Family.TREES)
    except ImportError as e:
        raise ConfigError(str(e)) from None
    if saved.schema is None:
        raise ConfigError(f"{path}: the model file holds no data schema (it was not written by `hugerec train`)")
    assert isinstance(saved.model, TreeModel) and isinstance(saved.config, GBMConfig)  # trees
    return saved.model, Schema.from_dict(saved.schema), path, saved.config


def evaluate_trees_cmd(cfg: RunConfig, model_path: Path | None = None) -> dict[str, float]:
    """The trained trees on data.eval: the binary metrics, or the ranking ones over the queries of the
    group column the model was trained with."""
    model, schema, _, config = _load(cfg, model_path)
    if cfg.data.eval is None:
        raise ConfigError("data.eval: no evaluation data set; give data.eval=PATH")
    group = config.group if is_ranking(config) else None
    data = _matrix(cfg.data.eval, "data.eval", schema, group=group)
    return evaluate(model, data, ks=(config.eval_at,))


def predict_trees(cfg: RunConfig, model_path: Path | None = None) -> tuple[Path, int]:
    """Scores predict.input (default data.eval) -> Parquet: the label column and `probability` (a ranking
    model: the raw `score`), in the input's row order."""
    import numpy as np

    model, schema, _, config = _load(cfg, model_path)
    source, where = (cfg.predict.input, "predict.input") if cfg.predict.input else (cfg.data.eval, "data.eval")
    if source is None:
        raise ConfigError("predict.input: nothing to score; give predict.input=PATH")
    data = _matrix(source, where, schema, grades=is_ranking(config))  # no group: the rows stay in order
    margin = model.margin(data.x, threads=0)
    out = Path(cfg.predict.out) if cfg.predict.out else cfg.out_dir / "predictions.parquet"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    label = schema.label_names[0]
    if is_ranking(config):
        table = pa.table({label: data.labels, "score": margin.astype(np.float32)})
    else:
        table = pa.table({label: data.labels, "probability": (1.0 / (1.0 + np.exp(-margin))).astype(np.float32)})
    pq.write_table(table, tmp)
    tmp.replace(out)  # no half-written predictions under the final name
    return out, data.x.shape[0]
