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
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from hugerec.cli.config_file import ConfigError
from hugerec.cli.run_config import RunConfig, declared_input
from hugerec.data.input_spec import InputSpec
from hugerec.data.loader import Loader, load
from hugerec.data.prepare import PrepareReport, lacks_labels, prepare, transform_raw
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.data.shards import count_rows, expand_paths
from hugerec.data.synthetic import SyntheticReport, generate, preset
from hugerec.data.vector_tables import load_vectors
from hugerec.distributed.launch import init_from_env, launched_by_torchrun
from hugerec.distributed.planner import Workload, plan
from hugerec.distributed.shard import shard
from hugerec.embedding.table_config import Storage, TableConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.models.registry import Family, build_model
from hugerec.sparse.batch import Batch
from hugerec.training.checkpoint import list_checkpoints, load_checkpoint
from hugerec.training.defaults import auto_batch_size, auto_embedding_dims, fitted_to_data
from hugerec.training.model_file import load_model, save_model
from hugerec.training.trainer import History, evaluate, fit, predict, resolve_device, seed_everything

BEST_MODEL = "best.pt"  # beside model.pt: the best evaluation's weights; evaluate / predict / export's default


# -- synth --------------------------------------------------------------------------------------
def synth(cfg: RunConfig) -> SyntheticReport:
    s = cfg.synth
    out = Path(s.out)
    if (out / "synthetic.json").is_file():  # our own earlier output: replace it, leave nothing stale behind
        shutil.rmtree(out)
    return generate(preset(s.preset, s.rows, seed=s.seed), out)


# -- preprocess ---------------------------------------------------------------------------------
def input_spec(cfg: RunConfig) -> InputSpec:
    """[preprocess]'s input with its columns (Parquet: preprocess.schema, a schema.json beside the files,
    or guessed from the files' types)."""
    return declared_input(cfg.preprocess)


def preprocess(cfg: RunConfig) -> PrepareReport:
    """hugerec.data.prepare over [preprocess]: split, fit on train, write the shards, schema.json and workflow/."""
    p = cfg.preprocess
    ops = Workflow.from_spec(p.ops, where="preprocess.ops").ops if p.ops else None
    try:
        return prepare(
            input_spec(cfg),
            p.input,
            p.out,
            split=p.split_spec(),
            ops=ops,
            eval_paths=p.eval_input,
            test_paths=p.test_input,
            joins=[j.join() for j in p.join],
            on_error=p.on_error,
            log_dense=p.log_dense,
            min_frequency=p.min_frequency,
            max_vocab=p.max_vocab,
            eval_header=p.eval_header,
            test_header=p.test_header,
        )
    except FileNotFoundError as e:
        raise ConfigError(f"preprocess.input: {e}") from None


def _rows_in(paths: str, where: str) -> int:
    try:
        return count_rows(paths)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _rows(folder: Path) -> int:
    return sum(pq.read_metadata(f).num_rows for f in folder.glob("*.parquet"))


# -- train --------------------------------------------------------------------------------------
def train(cfg: RunConfig) -> History:
    """Trains the [model] on data.train; the model keys the config left out fitted to the data first
    (fitted_to_data), and a line saying what runs (model, parameters, rows, batch, steps) before it does."""
    schema = read_schema(cfg.data.schema_path, "data.schema")
    tables = cfg.embedding.tables(embedding_tables(cfg, schema), cfg.out_dir)
    rows = _rows_in(cfg.data.train, "data.train")
    cfg = with_data_defaults(cfg, rows, len(schema.dense), tables[0].dim if tables else 16)
    if launched_by_torchrun():
        return _train_distributed(cfg, schema, tables)
    _prepare_disk_tables(tables, fresh=_starts_afresh(cfg))
    if cfg.train.seed is not None:  # the same seed, the same initial weights
        seed_everything(cfg.train.seed)
    model = _build(cfg, tables, schema)
    _load_vectors(cfg, model)
    train_data = open_shards(cfg.data.train, "data.train", schema, cfg, shuffle=cfg.data.shuffle)
    eval_data = None if cfg.data.eval is None else open_shards(cfg.data.eval, "data.eval", schema, cfg)
    print(run_summary(cfg, model, tables, rows, len(train_data)), flush=True)
    history = fit(model, train_data, eval_data, cfg.train)
    write_model(cfg.out_dir / "model.pt", model, cfg, schema, tables)
    _save_best(cfg, history, schema, tables)
    write_config(cfg)
    return history


def _starts_afresh(cfg: RunConfig) -> bool:
    """Whether this run starts from nothing: not train.resume, or train.resume with no complete checkpoint in
    <out_dir>/checkpoints (a run killed before its first checkpoint was committed: `fit` starts afresh then)."""
    return not cfg.train.resume or not list_checkpoints(cfg.out_dir / "checkpoints")


def _prepare_disk_tables(tables: list[TableConfig], fresh: bool) -> None:
    """The folders of the disk tables' files; a run that starts afresh removes the files and snapshots an
    earlier run left there, as it replaces that run's checkpoints (a resumed one restores them). A run
    killed after a table's first snapshot but before its first checkpoint was committed left trained rows
    (and maybe a torn file) that no checkpoint describes: its restart starts afresh, so they go too."""
    for t in tables:
        if t.storage is not Storage.DISK:
            continue
        assert t.path is not None  # TableConfig checks
        path = Path(t.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            for old in path.parent.glob(f"{path.name}.shard*"):  # a torchrun run's files, one per shard
                old.unlink() if old.is_file() else shutil.rmtree(old)
            path.unlink(missing_ok=True)
            shutil.rmtree(path.parent / f"{path.name}.snapshots", ignore_errors=True)


def embedding_tables(cfg: RunConfig, schema: Schema, quiet: bool = False) -> list[TableConfig]:
    """The schema's embedding tables at embedding.dim; "auto": each table's width from its cardinality
    (hugerec.training.defaults.auto_embedding_dims), one width for DLRM and DeepFM (the last of
    model.bottom when the config sets it), printed on one line unless `quiet`."""
    dim = cfg.embedding.dim
    if isinstance(dim, int):
        tables = schema.table_configs(dim=dim)
    else:
        cards = {t.name: t.num_rows for t in schema.table_configs(dim=1)}
        model = cfg.model
        dims = auto_embedding_dims(cards, one_width=isinstance(model, DLRMConfig | DeepFMConfig))
        if isinstance(model, DLRMConfig) and "bottom" in cfg.model_keys and model.bottom:
            dims = dict.fromkeys(dims, model.bottom[-1])  # the config's dense arch ends at the width the tables need
        tables = schema.table_configs(dim=1, dims=dims)
        if tables and not quiet:
            print(f"train: {auto_dims_note(tables)}; set embedding.dim to choose", flush=True)
    return [replace(t, dtype=cfg.embedding.dtype) for t in tables]


def auto_values(cfg: RunConfig) -> list[str]:
    """What embedding.dim and data.batch_size = "auto" come to on the config's data (`--print-config`), or
    that `hugerec train` resolves them once `hugerec preprocess` has written the data."""
    lines: list[str] = []
    auto_dim, auto_batch = cfg.embedding.dim == "auto", cfg.data.batch_size == "auto"
    if not (auto_dim or auto_batch):
        return lines
    schema_path = Path(cfg.data.schema_path)
    try:
        if auto_dim and schema_path.is_file():
            lines.append(auto_dims_note(embedding_tables(cfg, Schema.load(schema_path), quiet=True)))
        if auto_batch:
            rows = count_rows(cfg.data.train)
            lines.append(f"data.batch_size auto (the power of two nearest 2 x sqrt(rows), 32..2048): {auto_batch_size(rows)} for {rows:,} rows")
    except (FileNotFoundError, ValueError):
        pass  # no data yet: said below
    if len(lines) < auto_dim + auto_batch:
        keys = " and ".join(k for k, on in (("embedding.dim", auto_dim), ("data.batch_size", auto_batch)) if on)
        lines.append(f'{keys} "auto": `hugerec train` fits them to the data (no preprocessed data at {cfg.data.train} yet)')
    return lines


def auto_dims_note(tables: list[TableConfig]) -> str:
    """One line: the widths embedding.dim = "auto" gave each table, with its cardinality."""
    shown = ", ".join(f"{t.name} {t.dim} ({t.num_rows:,} ids)" for t in tables)
    return f"embedding.dim auto (6 x ids^0.25 up to a multiple of 8, 8..64): {shown}"


def with_data_defaults(cfg: RunConfig, rows: int, num_dense: int, dim: int) -> RunConfig:
    """`cfg` with the ranking model's MLP widths it left out fitted to `rows` training rows, `num_dense`
    dense features and the embedding width `dim` (hugerec.training.fitted_to_data), each change printed
    on one line."""
    if not isinstance(cfg.model, DLRMConfig | DCNv2Config | DeepFMConfig | WideAndDeepConfig) or rows < 1:
        return cfg  # no rows: opening the data names the problem
    model, notes = fitted_to_data(cfg.model, cfg.model_keys, rows, num_dense, dim)
    for note in notes:
        print(f"train: {note}; set the key to choose", flush=True)
    return replace(cfg, model=model)


def run_summary(cfg: RunConfig, model: torch.nn.Module, tables: list[TableConfig], rows: int, steps_per_epoch: int) -> str:
    """One line before training: the model and its size, the data, the batch and the steps."""
    dense = sum(p.numel() for p in model.parameters())  # the embedding rows are buffers, counted below
    embedding = sum(t.num_rows * t.dim for t in tables)
    batch = batch_size(cfg, rows)
    epochs = f"{cfg.train.epochs} epoch{'s' if cfg.train.epochs != 1 else ''}"
    stop = "" if cfg.train.max_steps is None else f", at most {cfg.train.max_steps:,} steps"
    widths = sorted({t.dim for t in tables})
    dims = f"dim {widths[0]}" if len(widths) == 1 else f"dims {widths[0]}-{widths[-1]}" if widths else "dim -"
    auto = " (auto)" if cfg.embedding.dim == "auto" else ""
    return (
        f"train: {cfg.model_type}, {dense + embedding:,} parameters ({dense:,} dense, {embedding:,} in {len(tables)} "
        f"embedding tables of {dims}{auto}); {rows:,} rows, batch {batch}"
        f"{' (auto)' if cfg.data.batch_size == 'auto' else ''}, {steps_per_epoch:,} steps per epoch x {epochs}{stop}"
    )


def _build(cfg: RunConfig, tables: list[TableConfig], schema: Schema) -> RecModel:
    """The [model] ranking model over the schema's tables (the registry's builder)."""
    model = build_model(cfg.model, tables, len(schema.dense), cfg.embedding.optimizer)
    assert isinstance(model, RecModel)  # a ranking config: train dispatches the other families elsewhere
    return model


def _load_vectors(cfg: RunConfig, model: RecModel) -> None:
    """[[model.vectors]] side tables into the model's vector features, encoded by the data's workflow."""
    if not getattr(cfg.model, "vectors", ()):
        return
    folder = Path(cfg.data.schema_path).parent / "workflow"
    workflow = Workflow.load(folder) if folder.is_dir() else None
    for line in load_vectors(model, workflow):
        print(line, file=sys.stderr, flush=True)


def _train_distributed(cfg: RunConfig, schema: Schema, tables: list[TableConfig]) -> History:
    """`train` on this rank of a torchrun job: the same model on every rank (same seed), sharded by the plan."""
    env = init_from_env()
    try:
        if env.rank == 0:
            _prepare_disk_tables(tables, fresh=_starts_afresh(cfg))
        dist.barrier()  # no rank builds its disk tables before rank 0 has removed an earlier run's files
        seed_everything(0 if cfg.train.seed is None else cfg.train.seed)  # every rank must build the same model
        model = _build(cfg, tables, schema)
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
        assert history.model_checkpoint is not None  # fit writes one at the end: the CLI always has an out_dir
        whole = _build(cfg, tables, schema)
        load_checkpoint(history.model_checkpoint, whole)  # the weights fit returned (averaged: train.average_epochs)
        write_model(cfg.out_dir / "model.pt", whole, cfg, schema, tables)
        _save_best(cfg, history, schema, tables)
        write_config(cfg)
    return history


def write_config(cfg: RunConfig) -> None:
    """<train.out_dir>/config.json: every key of the run's config (what --print-config shows)."""
    from hugerec.cli.run_config import resolved_dict

    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    (cfg.out_dir / "config.json").write_text(json.dumps(resolved_dict(cfg), indent=1, default=str) + "\n")


def _save_best(cfg: RunConfig, history: History, schema: Schema, tables: list[TableConfig]) -> None:
    """best.pt beside model.pt: the best evaluation's checkpoint (train.early_stopping.metric, sharded
    or not) read whole in this process, as a model file.

    Without an evaluation there is no best: a best.pt an earlier run left is removed, so that
    evaluate / predict / export (which prefer best.pt) never read a stale model."""
    path = cfg.out_dir / BEST_MODEL
    if history.best_checkpoint is None:
        path.unlink(missing_ok=True)
        return
    best = _build(cfg, tables, schema)
    load_checkpoint(history.best_checkpoint, best)
    write_model(path, best, cfg, schema, tables)


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
        rows = count_rows(files)
        if rows == 0:
            raise ValueError(f"{paths} holds no rows (empty dataset)")
        batch = batch_size(cfg, rows)
        return load(files, schema, batch, shuffle=shuffle, seed=cfg.data.seed, rank=rank, world_size=world_size)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


# -- the model file ---------------------------------------------------------------------------
def write_model(path: Path, model: RecModel, cfg: RunConfig, schema: Schema, tables: list[TableConfig]) -> Path:
    """model.pt in the library's model format (hugerec.training.save_model), with the data schema."""
    return save_model(path, model, cfg.model, cfg.embedding.optimizer, tables=tables, schema=schema.to_dict())


def read_model(path: Path) -> tuple[RecModel, Schema]:
    """A ranking model file `hugerec train` wrote (hugerec.training.load_model) and the schema of its data."""
    if not path.is_file():
        raise ConfigError(f"no model at {path}; run `hugerec train` first (or check train.out_dir)")
    saved = load_model(path, Family.RANKING)
    if saved.schema is None:
        raise ConfigError(f"{path}: the model file holds no data schema (it was not written by `hugerec train`)")
    assert isinstance(saved.model, RecModel)  # load_model checked the family
    return saved.model, Schema.from_dict(saved.schema)


# -- evaluate / predict -------------------------------------------------------------------------
def is_shards(paths: str, schema: Schema) -> bool:
    """Whether `paths` are preprocessed shards of this model's data rather than raw input for the fitted
    workflow. Parquet files with a schema.json in their folder or the one above (where `hugerec
    preprocess` writes it) are shards exactly when it is the model's; without one (shards copied
    elsewhere), when they have every column of the schema, sparse ones as integer ids inside the
    vocabularies (checked on the first row group). Text is always raw; a missing file is left to
    open_shards to name."""
    try:
        files = expand_paths(paths)
    except (FileNotFoundError, ValueError):
        return True
    if not files or any(f.suffix not in (".parquet", ".parq", ".pq") for f in files):
        return False
    for candidate in (files[0].parent / "schema.json", files[0].parent.parent / "schema.json"):
        if candidate.is_file():
            try:
                return Schema.load(candidate).to_dict() == schema.to_dict()
            except (ValueError, KeyError, OSError):
                return False
    try:
        parquet = pq.ParquetFile(files[0])
        if parquet.metadata.num_row_groups == 0 or any(c.name not in parquet.schema_arrow.names for c in schema.columns):
            return False
        first = pl.DataFrame(pl.from_arrow(parquet.read_row_group(0, columns=[c.name for c in schema.sparse])))
    except (OSError, pa.ArrowInvalid):
        return False
    for column in schema.sparse:
        values = first[column.name].explode() if isinstance(first.schema[column.name], pl.List) else first[column.name]
        if not values.dtype.is_integer():
            return False
        ids = values.drop_nulls().to_numpy()
        if ids.size and (ids.min() < 0 or (column.cardinality is not None and ids.max() >= column.cardinality)):
            return False
    return True


def open_rows(paths: str, where: str, schema: Schema, cfg: RunConfig, *, unlabelled_ok: bool = False) -> tuple[Loader, bool]:
    """(loader, labelled): shards as they are; raw files (as [preprocess] describes the input) through the
    fitted workflow (<preprocess.out>/workflow) first, into <train.out_dir>/_<where>/. unlabelled_ok: raw
    files may lack the label columns (traffic to score: labelled is then False, the batches' labels 0)."""
    if is_shards(paths, schema):
        return open_shards(paths, where, schema, cfg), True
    folder = Path(cfg.data.schema_path).parent / "workflow"
    if not folder.is_dir():
        folder = Path(cfg.preprocess.out) / "workflow"
    if not folder.is_dir():
        raise ConfigError(
            f"{where}: {paths} holds raw rows, and there is no fitted workflow to run them through "
            f"(looked in {folder}); run `hugerec preprocess` first"
        )
    out = cfg.out_dir / f"_{where.replace('.', '_')}"
    joins = [j.join() for j in cfg.preprocess.join]
    spec = input_spec(cfg)
    labelled = not (unlabelled_ok and lacks_labels(spec, paths))
    workflow = Workflow.load(folder)
    report = transform_raw(spec, paths, workflow, out, where, cfg.preprocess.on_error, joins, labelled=labelled)
    if report.rows_skipped:
        print(f"{where}: {report}", file=sys.stderr)
    return open_shards(str(out), where, schema, cfg), labelled


def evaluate_model(cfg: RunConfig, model_path: Path | None = None) -> dict[str, float]:
    model, schema = read_model(model_path or default_model(cfg))
    if cfg.data.eval is None:
        raise ConfigError("data.eval: no evaluation data set; give data.eval=PATH")
    data, _ = open_rows(cfg.data.eval, "data.eval", schema, cfg)
    device = resolve_device(cfg.train.device)
    return evaluate(model.to(device), data, device=device, precision=cfg.train.precision)


def predict_to_parquet(cfg: RunConfig, model_path: Path | None = None) -> tuple[Path, int]:
    """Scores every row of predict.input (default data.eval) -> Parquet: label column(s) and `probability`;
    raw files without the label columns (unlabelled traffic) -> `probability` alone."""
    model, schema = read_model(model_path or default_model(cfg))
    source, where = (cfg.predict.input, "predict.input") if cfg.predict.input else (cfg.data.eval, "data.eval")
    if source is None:
        raise ConfigError("predict.input: nothing to score; give predict.input=PATH")
    data, labelled = open_rows(source, where, schema, cfg, unlabelled_ok=True)
    out = Path(cfg.predict.out) if cfg.predict.out else cfg.out_dir / "predictions.parquet"
    device = resolve_device(cfg.train.device)
    names = schema.label_names if labelled else []
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
    """The model file of any family (default: what `hugerec train` left) -> the bundle that serves it
    (default <train.out_dir>/bundle), through hugerec.serving.export: a ranking model's or the trees' with
    the fitted workflow next to the preprocessed data when there is one, a sequential model's next-items
    bundle of recommend.k items, named after model.type."""
    from hugerec.serving.bundles.export import export  # the serving stack is only needed here

    if cfg.family is Family.RETRIEVAL:
        raise ConfigError(
            f"export: model.type = {cfg.model_type!r}: serving bundles of retrieval models are not built yet; "
            "use `hugerec index` and `hugerec recommend`"
        )
    match cfg.family:
        case Family.TREES:
            from hugerec.cli.gbm_commands import default_tree_model

            path = model_path or default_tree_model(cfg)
        case Family.SEQUENTIAL:
            path = model_path or cfg.out_dir / "model.pt"
        case _:
            path = model_path or default_model(cfg)
    if not path.is_file():
        raise ConfigError(f"no model at {path}; run `hugerec train` first (or check train.out_dir)")
    workflow_dir = Path(cfg.preprocess.out) / "workflow"
    workflow = Workflow.load(workflow_dir) if cfg.family is not Family.SEQUENTIAL and workflow_dir.is_dir() else None
    try:
        return export(
            path,
            out or cfg.out_dir / "bundle",
            workflow=workflow,
            k=cfg.recommend.k,
            exclude_seen=cfg.recommend.exclude_seen,
            overwrite=True,
        )
    except ImportError as e:  # the trees' library is an optional extra
        raise ConfigError(str(e)) from None
