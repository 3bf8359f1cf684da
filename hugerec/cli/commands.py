"""What each `hugerec` command does, on a RunConfig: synth -> preprocess -> train -> evaluate / predict.

runs/quickstart/raw/            synth: Parquet shards, schema.json, synthetic.json (oracle AUC)
runs/quickstart/data/           preprocess: train/, eval/, workflow/, schema.json (cardinalities)
runs/quickstart/                train: model.pt (last), best.pt (best eval), metrics.jsonl, curves.png,
                                tensorboard/, checkpoints/
runs/quickstart/predictions.parquet   predict: one probability per input row, in input order

`torchrun --nproc-per-node W -m hugerec train CONFIG.toml` trains the same config on W ranks: the
embedding tables sharded by the planner's plan, each rank reading its part of the data; rank 0 prints,
logs and writes model.pt (the whole model, gathered from the final sharded checkpoint).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from hugerec.cli.config_file import ConfigError, to_dict
from hugerec.cli.run_config import RawFormat, RunConfig
from hugerec.data.criteo import DENSE_NAMES, SPARSE_NAMES
from hugerec.data.loader import Loader, load
from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.dataset import Dataset
from hugerec.data.preprocess.errors import SkipReport
from hugerec.data.preprocess.numeric import FillMissing, LogOp, Normalize
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.data.shards import ShardWriter, expand_paths, iter_row_groups
from hugerec.data.synthetic import SyntheticReport, generate, preset
from hugerec.data.vector_tables import load_vectors
from hugerec.distributed.launch import init_from_env, launched_by_torchrun
from hugerec.distributed.planner import Workload, plan
from hugerec.distributed.shard import shard
from hugerec.embedding.table_config import TableConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import build_model
from hugerec.sparse.batch import Batch
from hugerec.training.checkpoint import load_checkpoint, read_weights
from hugerec.training.defaults import auto_batch_size
from hugerec.training.model_file import load_model as load_model_file
from hugerec.training.model_file import save_model as save_model_file
from hugerec.training.trainer import History, evaluate, fit, predict, resolve_device, seed_everything

BEST_MODEL = "best.pt"  # beside model.pt: the best evaluation's weights; evaluate / predict / export's default


@dataclass(frozen=True)
class PreprocessReport:
    train_rows: int
    eval_rows: int
    schema: Path
    workflow: Path
    skipped: SkipReport = field(default_factory=SkipReport)  # rows dropped as bad input (preprocess.on_error = "skip")


# -- synth --------------------------------------------------------------------------------------
def synth(cfg: RunConfig) -> SyntheticReport:
    s = cfg.synth
    out = Path(s.out)
    if (out / "synthetic.json").is_file():  # our own earlier output: replace it, leave nothing stale behind
        shutil.rmtree(out)
    return generate(preset(s.preset, s.rows, seed=s.seed), out)


# -- preprocess ---------------------------------------------------------------------------------
def preprocess(cfg: RunConfig) -> PreprocessReport:
    p = cfg.preprocess
    raw = _raw_schema(cfg)
    labels, dense, sparse = raw.label_names, raw.dense_names, raw.sparse_names
    train_raw = _dataset(p.input, "preprocess.input", p.format, labels)
    ops: list[Any] = [FillMissing(dense, 0.0)] if dense else []
    if dense and p.log_dense:
        ops.append(LogOp(dense))
    if dense:
        ops.append(Normalize(dense))
    ops.append(Categorify(sparse, freq_threshold=p.min_frequency, max_size=p.max_vocab))
    workflow = Workflow(ops, output_columns=(*labels, *dense, *sparse))
    workflow.fit(train_raw, on_error=p.on_error)
    fit_report = workflow.fit_report or SkipReport()
    if fit_report.rows_read - fit_report.rows_skipped == 0:
        raise ConfigError(f"preprocess.input: no rows to learn from in {p.input!r} ({fit_report.rows_read} read)")
    out = Path(p.out)
    if p.eval_input is not None:
        report = workflow.transform(train_raw, out / "train", overwrite=True, on_error=p.on_error).report
        eval_raw = _dataset(p.eval_input, "preprocess.eval_input", p.format, labels)
        report = report.merge(workflow.transform(eval_raw, out / "eval", overwrite=True, on_error=p.on_error).report)
    else:
        report = workflow.transform(train_raw, out / "_all", overwrite=True, on_error=p.on_error).report
        _split(out / "_all", out / "train", out / "eval", p.eval_fraction, p.seed)
        shutil.rmtree(out / "_all")
    cards = workflow.cardinalities()
    multi_hot = [c.name for c in raw.sparse if c.multi_hot]
    schema = Schema.build(labels, dense, {c: cards[c] for c in sparse}, multi_hot=multi_hot)
    schema.save(out / "schema.json")
    shutil.rmtree(out / "workflow", ignore_errors=True)
    workflow.save(out / "workflow")
    return PreprocessReport(_rows(out / "train"), _rows(out / "eval"), out / "schema.json", out / "workflow", report)


def _raw_schema(cfg: RunConfig) -> Schema:
    p = cfg.preprocess
    match p.format:
        case RawFormat.CRITEO:
            return Schema.build(dense=DENSE_NAMES, sparse=SPARSE_NAMES)
        case RawFormat.PARQUET:
            where = "preprocess.schema"
            if p.schema is None:
                where = "preprocess.input"
                folder = Path(p.input) if Path(p.input).is_dir() else Path(p.input).parent
                path = folder / "schema.json"
            else:
                path = Path(p.schema)
            if not path.is_file():
                raise ConfigError(f"{where}: no schema at {path}; set preprocess.schema to the raw data's schema.json")
            return Schema.load(path)


def _dataset(paths: str, where: str, fmt: RawFormat, labels: Sequence[str]) -> Dataset:
    """The raw input; its label columns must hold 0 or 1 (anything else is bad input, with its line)."""
    try:
        match fmt:
            case RawFormat.CRITEO:
                return Dataset.criteo(paths)
            case RawFormat.PARQUET:  # a folder: its Parquet files, not the schema.json beside them
                files = str(Path(paths) / "*.parquet") if Path(paths).is_dir() else paths
                return Dataset(files, format="parquet", binary=labels)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _split(src: Path, train: Path, eval_: Path, fraction: float, seed: int) -> None:
    """Rows of `src` -> train / eval shards, each row to eval with probability `fraction` (streaming)."""
    for d in (train, eval_):
        shutil.rmtree(d, ignore_errors=True)
    with ShardWriter(train) as train_writer, ShardWriter(eval_) as eval_writer:
        for k, table in enumerate(iter_row_groups(expand_paths(src))):
            held_out = np.random.default_rng([seed, k]).random(table.num_rows) < fraction
            train_writer.write(table.filter(pa.array(~held_out)))
            eval_writer.write(table.filter(pa.array(held_out)))


def _rows_in(paths: str, where: str) -> int:
    try:
        return sum(pq.read_metadata(f).num_rows for f in expand_paths(paths))
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _rows(folder: Path) -> int:
    return sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))


# -- train --------------------------------------------------------------------------------------
def train(cfg: RunConfig) -> History:
    schema = read_schema(cfg.data.schema_path, "data.schema")
    tables = [replace(t, dtype=cfg.embedding.dtype) for t in schema.table_configs(dim=cfg.embedding.dim)]
    if launched_by_torchrun():
        return _train_distributed(cfg, schema, tables)
    if cfg.train.seed is not None:  # the same seed, the same initial weights
        seed_everything(cfg.train.seed)
    model = build_model(cfg.model_config(), tables, len(schema.dense), cfg.embedding.optimizer)
    _load_vectors(cfg, model)
    train_data = open_shards(cfg.data.train, "data.train", schema, cfg, shuffle=cfg.data.shuffle)
    eval_data = None if cfg.data.eval is None else open_shards(cfg.data.eval, "data.eval", schema, cfg)
    history = fit(model, train_data, eval_data, cfg.train)
    save_model(cfg.out_dir / "model.pt", model, cfg, schema, tables)
    _save_best(cfg, history, model, schema, tables)
    (cfg.out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str) + "\n")
    return history


def _load_vectors(cfg: RunConfig, model: RecModel) -> None:
    """[[model.vectors]] side tables into the model's vector features, encoded by the data's workflow."""
    if not getattr(cfg.model_config(), "vectors", ()):
        return
    folder = Path(cfg.data.schema_path).parent / "workflow"
    workflow = Workflow.load(folder) if folder.is_dir() else None
    for line in load_vectors(model, workflow):
        print(line, file=sys.stderr, flush=True)


def _train_distributed(cfg: RunConfig, schema: Schema, tables: list[TableConfig]) -> History:
    """`train` on this rank of a torchrun job: the same model on every rank (same seed), sharded by the plan."""
    env = init_from_env()
    try:
        seed_everything(0 if cfg.train.seed is None else cfg.train.seed)  # every rank must build the same model
        model = build_model(cfg.model_config(), tables, len(schema.dense), cfg.embedding.optimizer)
        sharding = plan(
            tables,
            env.world_size,
            load=Workload(batch_size=batch_size(cfg, _rows_in(cfg.data.train, "data.train"))),
            optimizer=cfg.embedding.optimizer,
        )
        if env.rank == 0:
            print(sharding, flush=True)
        sharded = shard(model, sharding, device=env.device)
        rank, world = env.rank, env.world_size
        train_data = open_shards(cfg.data.train, "data.train", schema, cfg, cfg.data.shuffle, rank, world)
        eval_data = (
            None if cfg.data.eval is None else open_shards(cfg.data.eval, "data.eval", schema, cfg, False, rank, world)
        )
        history = fit(sharded, train_data, eval_data, cfg.train)
    finally:
        dist.destroy_process_group()
    if env.rank == 0:  # the final sharded checkpoint, read whole in this one process
        assert history.checkpoint is not None  # fit writes one at the end: the CLI always has an out_dir
        whole = build_model(cfg.model_config(), tables, len(schema.dense), cfg.embedding.optimizer)
        load_checkpoint(history.checkpoint, whole)
        save_model(cfg.out_dir / "model.pt", whole, cfg, schema, tables)
        (cfg.out_dir / BEST_MODEL).unlink(missing_ok=True)  # a sharded run keeps no best.pt yet: none stale
        (cfg.out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1, default=str) + "\n")
    return history


def _save_best(cfg: RunConfig, history: History, model: RecModel, schema: Schema, tables: list[TableConfig]) -> None:
    """best.pt beside model.pt: the weights of the best evaluation (train.early_stopping.metric), as a model file.

    Without an evaluation there is no best: a best.pt an earlier run left is removed, so that
    evaluate / predict / export (which prefer best.pt) never read a stale model."""
    path = cfg.out_dir / BEST_MODEL
    if history.best_checkpoint is None:
        path.unlink(missing_ok=True)
        return
    best = read_weights(history.best_checkpoint, "train", "best checkpoint")["model"]
    save_model(path, model, cfg, schema, tables, state=best)


def default_model(cfg: RunConfig) -> Path:
    """What evaluate / predict / export read without --model: best.pt when training left one, else model.pt."""
    best = cfg.out_dir / BEST_MODEL
    return best if best.is_file() else cfg.out_dir / "model.pt"


def batch_size(cfg: RunConfig, rows: int) -> int:
    """data.batch_size, with "auto" resolved from the number of rows read (auto_batch_size)."""
    return cfg.data.batch_size if isinstance(cfg.data.batch_size, int) else auto_batch_size(rows)


def read_schema(path: str, where: str) -> Schema:
    if not Path(path).is_file():
        raise ConfigError(f"{where}: no schema at {path}; run `hugerec preprocess` first or set {where}")
    return Schema.load(path)


def open_shards(
    paths: str, where: str, schema: Schema, cfg: RunConfig, shuffle: bool = False, rank: int = 0, world_size: int = 1
) -> Loader:
    """The loader over `paths` (rank's part of world_size), with dataset mistakes (no files, no rows, wrong
    columns) as one-line errors."""
    try:
        files = expand_paths(paths)
        rows = sum(pq.read_metadata(f).num_rows for f in files)
        if rows == 0:
            raise ValueError(f"{paths} holds no rows (empty dataset)")
        batch = batch_size(cfg, rows)
        return load(files, schema, batch, shuffle=shuffle, seed=cfg.data.seed, rank=rank, world_size=world_size)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


# -- the model file ---------------------------------------------------------------------------
def save_model(
    path: Path,
    model: RecModel,
    cfg: RunConfig,
    schema: Schema,
    tables: list[TableConfig],
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """model.pt in the library's model format (hugerec.training.save_model), with the data schema; `state`:
    weights to write instead of the model's own."""
    opt = cfg.embedding.optimizer
    return save_model_file(path, model, cfg.model_config(), tables, opt, schema.to_dict(), state=state)


def load_model(path: Path) -> tuple[RecModel, Schema]:
    if not path.is_file():
        raise ConfigError(f"no model at {path}; run `hugerec train` first (or check train.out_dir)")
    saved = load_model_file(path)
    if saved.schema is None:
        raise ConfigError(f"{path}: the model file holds no data schema (it was not written by `hugerec train`)")
    return saved.model, Schema.from_dict(saved.schema)


# -- evaluate / predict -------------------------------------------------------------------------
def evaluate_model(cfg: RunConfig, model_path: Path | None = None) -> dict[str, float]:
    model, schema = load_model(model_path or default_model(cfg))
    if cfg.data.eval is None:
        raise ConfigError("data.eval: no evaluation data set; give data.eval=PATH")
    data = open_shards(cfg.data.eval, "data.eval", schema, cfg)
    device = resolve_device(cfg.train.device)
    return evaluate(model.to(device), data, device=device, precision=cfg.train.precision)


def predict_to_parquet(cfg: RunConfig, model_path: Path | None = None) -> tuple[Path, int]:
    """Scores every row of predict.input (default data.eval) -> Parquet: label column(s) and `probability`."""
    model, schema = load_model(model_path or default_model(cfg))
    source, where = (cfg.predict.input, "predict.input") if cfg.predict.input else (cfg.data.eval, "data.eval")
    if source is None:
        raise ConfigError("predict.input: nothing to score; give predict.input=PATH")
    data = open_shards(source, where, schema, cfg)
    out = Path(cfg.predict.out) if cfg.predict.out else cfg.out_dir / "predictions.parquet"
    device = resolve_device(cfg.train.device)
    names = schema.label_names
    arrow_schema = pa.schema([*((n, pa.float32()) for n in names), ("probability", pa.float32())])
    labels: list[torch.Tensor] = []

    def tap() -> Iterator[Batch]:  # keeps each batch's labels to write beside its scores
        for batch in data:
            labels.append(batch.labels.reshape(batch.batch_size, -1))  # [B] or [B, T] -> [B, T]
            yield batch

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp"
    rows = 0
    with pq.ParquetWriter(tmp, arrow_schema) as writer:
        for probs in predict(model.to(device), tap(), device=device, precision=cfg.train.precision):
            y = labels.pop(0)
            columns = {n: y[:, t].numpy() for t, n in enumerate(names)}
            writer.write_table(pa.table({**columns, "probability": probs.numpy()}, schema=arrow_schema))
            rows += probs.numel()
    tmp.replace(out)  # no half-written predictions under the final name
    return out, rows


# -- export -------------------------------------------------------------------------------------
def export_model(cfg: RunConfig, model_path: Path | None = None, out: Path | None = None) -> Path:
    """model.pt (+ the fitted workflow next to the preprocessed data, when there is one) -> serving bundle."""
    from hugerec.serving.export import export_bundle  # the serving stack is only needed here

    model, schema = load_model(model_path or default_model(cfg))
    workflow_dir = Path(cfg.preprocess.out) / "workflow"
    workflow = Workflow.load(workflow_dir) if workflow_dir.is_dir() else None
    target = out or cfg.out_dir / "bundle"
    return export_bundle(model, target, schema=schema, workflow=workflow, overwrite=True)
