"""train / evaluate / predict / export for model.type = "lightgbm" | "xgboost" (gradient-boosted trees).

The same shards, schema and run directory as the deep models:
    train.out_dir/model.txt (LightGBM text) or model.json (XGBoost JSON): the best round's trees
    train.out_dir/model.meta.json   library, [model] config, data schema, rounds, best round
    train.out_dir/metrics.jsonl, tensorboard/, curves.png, config.json

A ranking objective (model.objective = "lambdarank" | "rank:ndcg" | "rank:pairwise") reads the query
column model.group beside the features; `evaluate` reports NDCG@K, MAP@K and MRR@K (K = model.eval_at)
and `predict` writes the raw ranking `score` instead of a probability.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hugerec.cli.config_file import ConfigError, to_dict
from hugerec.cli.run_config import RunConfig
from hugerec.data.matrix import read_matrix
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.distributed.launch import launched_by_torchrun
from hugerec.models.gbm import FeatureMatrix, GBMConfig, Library, TreeModel, is_ranking, library_of, require
from hugerec.training.gbm import TreeHistory, evaluate_trees, fit_trees, library_version

META_SUFFIX = ".meta.json"


def _library(cfg: RunConfig) -> Library:
    return library_of(cfg.gbm_config())


def default_tree_model(cfg: RunConfig) -> Path:
    return cfg.out_dir / _library(cfg).model_file


def _matrix(
    paths: str, where: str, schema: Schema, group: str | None = None, grades: bool | None = None
) -> FeatureMatrix:
    try:
        return read_matrix(paths, schema, True, group, grades)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def train_trees(cfg: RunConfig) -> TreeHistory:
    """Train the [model] trees on data.train, stop early on data.eval; write the run directory."""
    from hugerec.cli.commands import read_schema

    kind = cfg.model.get("type")
    if launched_by_torchrun():
        raise ConfigError(
            f"model.type = {kind!r} trains in one process; sharded / distributed training (torchrun) is for the "
            "deep models: run `hugerec train` without torchrun (the library uses every core of the machine)"
        )
    config = cfg.gbm_config()
    try:
        require(library_of(config))  # before reading any data
    except ImportError as e:
        raise ConfigError(str(e)) from None
    schema = read_schema(cfg.data.schema_path, "data.schema")
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
    library = library_of(config)
    path = model.save(cfg.out_dir / library.model_file)
    meta = {
        "library": library.value,
        "library_version": library_version(library),
        "model": {"type": kind, **to_dict(config)},
        "schema": schema.to_dict(),
        "rounds": history.rounds,
        "best_round": history.best_round,
        "final_eval": history.final_eval,
    }
    path.with_suffix(META_SUFFIX).write_text(json.dumps(meta, indent=1, default=str) + "\n")
    (cfg.out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str) + "\n")
    return history


def load_tree_model(cfg: RunConfig, model_path: Path | None) -> tuple[TreeModel, Schema, Path]:
    """The trained trees (default: train.out_dir/model.txt or model.json) and the schema they were trained on."""
    model, schema, path, _ = _load(cfg, model_path)
    return model, schema, path


def _load(cfg: RunConfig, model_path: Path | None) -> tuple[TreeModel, Schema, Path, GBMConfig]:
    """load_tree_model and the [model] config the trees were trained with (from model.meta.json)."""
    from hugerec.cli.run_config import read_gbm_config

    path = model_path or default_tree_model(cfg)
    meta_path = path.with_suffix(META_SUFFIX)
    if not path.is_file() or not meta_path.is_file():
        raise ConfigError(f"no trained trees at {path} (with {meta_path.name}); run `hugerec train` first")
    try:
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        library = Library(meta["library"])
        schema = Schema.from_dict(meta["schema"])
        config = read_gbm_config(meta["model"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, ConfigError) as e:
        raise ConfigError(f"{meta_path}: not a hugerec tree-model description ({type(e).__name__}: {e})") from None
    try:
        return TreeModel.load(path, library, threads=0), schema, path, config
    except ImportError as e:
        raise ConfigError(str(e)) from None


def evaluate_trees_cmd(cfg: RunConfig, model_path: Path | None = None) -> dict[str, float]:
    """The trained trees on data.eval: the binary metrics, or the ranking ones over the queries of the
    group column the model was trained with."""
    model, schema, _, config = _load(cfg, model_path)
    if cfg.data.eval is None:
        raise ConfigError("data.eval: no evaluation data set; give data.eval=PATH")
    group = config.group if is_ranking(config) else None
    data = _matrix(cfg.data.eval, "data.eval", schema, group=group)
    return evaluate_trees(model, data, threads=0, eval_at=config.eval_at)


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


def export_trees(cfg: RunConfig, model_path: Path | None = None, out: Path | None = None) -> Path:
    """The trained trees + schema + the fitted workflow (when there is one) -> a GBM serving bundle."""
    from hugerec.serving.gbm import export_gbm_bundle  # the serving stack is only needed here

    model, schema, path, config = _load(cfg, model_path)
    workflow_dir = Path(cfg.preprocess.out) / "workflow"
    workflow = Workflow.load(workflow_dir) if workflow_dir.is_dir() else None
    target = out or cfg.out_dir / "bundle"
    info = {"objective": config.objective, **({"group": config.group} if is_ranking(config) else {})}
    return export_gbm_bundle(path, model.library, target, schema, workflow, info=info, overwrite=True)
