"""RunConfig: everything the `hugerec` commands read, one TOML section per step.

    [synth]       hugerec synth       a synthetic click log with a known best-possible AUC
    [preprocess]  hugerec preprocess  raw rows -> fitted Workflow -> train/eval Parquet shards + schema.json
    [data]        train, evaluate     which shards to read and how to batch them
    [embedding]   train               embedding width and the sparse optimizer of the tables
    [model]       train, evaluate, export, ...   type = any model type of hugerec.models.registry, then its
                                      fields: ranking "dlrm" | "dcn_v2" | "deepfm" | "wide_and_deep", retrieval
                                      "two_tower" | "mf", sequential "sasrec" | "mlm" | "gru4rec", trees
                                      "lightgbm" | "xgboost"; read into the registry's config, nothing else
    [train]       train               hugerec.training.TrainConfig (epochs, lr, precision, out_dir, ...)
    [predict]     predict             rows to score and where the Parquet of probabilities goes
    [interactions], [sequences], [index], [recommend]: the retrieval and sequential tasks, whose data are
                  views of [preprocess]'s declared input (see interactions_config)

The defaults are the quickstart (configs/quickstart.toml spells them out). Relative input paths
are looked up in the current directory, then next to the config file; outputs go under the
current directory.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hugerec.cli.config_file import INTERNAL, ConfigError, apply_overrides, from_dict, parse_value, read_toml, to_dict
from hugerec.cli.interactions_config import (
    IndexSection,
    InteractionsSection,
    RecommendSection,
    SequencesSection,
    resolve_task_inputs,
    upgrade_old_sections,
)
from hugerec.data.input_spec import ColumnSpec, InputFormat, InputSpec
from hugerec.data.prepare import Join, SplitKind, SplitSpec, with_joins
from hugerec.data.preprocess.errors import OnError
from hugerec.data.preprocess.workflow import Workflow
from hugerec.embedding.optimizers import Optimizer, RowWiseAdagrad, optimizer_from_dict, optimizer_to_dict
from hugerec.embedding.table_config import Storage, StorageDtype, TableConfig
from hugerec.models.model_config import DLRMConfig
from hugerec.models.registry import (
    Family,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    model_type,
    type_of,
)
from hugerec.training.trainer import TrainConfig

READERS = {Optimizer: optimizer_from_dict}


class RawFormat(enum.Enum):
    CSV = "csv"  # delimited text, plain or .gz, laid out by separator / header / encoding / columns
    PARQUET = "parquet"  # Parquet: columns declared, or from a schema.json beside it (`hugerec synth`), or guessed
    CRITEO = "criteo"  # the Criteo Kaggle / Terabyte TSV: label, I1..I13, C1..C26 (plain or .gz)


@dataclass(frozen=True)
class SynthSection:
    """preset: "criteo-like" (13 dense + 26 sparse, Criteo Kaggle cardinalities) or "seed-synthetic"."""

    preset: str = "criteo-like"
    rows: int = 300_000  # rows to generate
    out: str = "runs/quickstart/raw"  # the folder of the Parquet shards, schema.json and synthetic.json (the oracle AUC)
    seed: int = 0  # the generator's seed: the same seed, the same rows and labels

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")


@dataclass(frozen=True)
class JoinSection:
    """[[preprocess.join]]: a side table (user or item features) left-joined to every input row by `on`,
    a column both declare with the same type. Its other keys read its file as [preprocess]'s read the input."""

    input: str  # the side table's file (csv or parquet)
    on: str  # the column both the input and the side table declare, with the same type
    format: RawFormat = RawFormat.CSV  # "csv" or "parquet"
    separator: str = ","  # field separator of csv text (any length: "::" works)
    header: bool = True  # the csv file's first line names the columns
    encoding: str = "utf-8"  # text encoding of the csv file (utf-8, latin-1, ...)
    quote: str = '"'  # quote character of csv fields ("" for no quoting)
    null_values: tuple[str, ...] = ()  # field values read as missing
    columns: tuple[ColumnSpec, ...] = ()  # the side table's columns, `on` among them (as [preprocess] columns)

    def __post_init__(self) -> None:
        if self.format is RawFormat.CRITEO:
            raise ValueError('format: a side table is "csv" or "parquet"')
        if not self.columns:
            raise ValueError("columns: declare the side table's columns, `on` among them")
        self.join()

    def join(self) -> Join:
        spec = InputSpec(
            InputFormat(self.format.value),
            self.separator,
            self.header,
            self.encoding,
            self.quote or None,
            self.null_values,
            self.columns,
        )
        return Join(spec, self.input, self.on)


@dataclass(frozen=True)
class PreprocessSection:
    """Raw rows -> split -> Workflow fitted on the train part -> train/eval(/test) Parquet shards + schema.json.

    input          raw files: a file, a folder or a glob
    format         "csv" (any delimited text, plain or .gz), "parquet", or "criteo" (the Criteo TSV layout)
    separator, header, encoding, quote, null_values   how csv text is laid out (separator may be "::";
                   quote = "" for no quoting; encoding: utf-8, latin-1, ...)
    eval_header, test_header   whether eval_input's / test_input's files start with a header line
                   (default: as `header` says for the input; a headered train file beside headerless
                   dev / test files is header = true, eval_header = false, test_header = false)
    columns        [{name, type, role, separator, format, threshold}, ...]: see hugerec.data.input_spec
                   (`hugerec schema FILE` writes them); parquet without columns reads a schema.json beside
                   the files (preprocess.schema) or guesses roles from the column types
    ops            [[preprocess.ops]] tables {op = "Categorify", columns = [...], freq_threshold = 3, ...}:
                   the workflow after the columns' own parsing (none: FillMissing + LogOp (log_dense) +
                   Normalize on dense columns, Categorify (min_frequency, max_vocab) on categorical ones)
    split          "random" (eval_fraction), "time" (time_cutoff or last_days), "leave_last_out" (each
                   user's last `holdout` rows), "files" (eval_input); default: "files" when eval_input is
                   given, else "random". The workflow is fitted on the train part only.
    eval_input     raw files of the eval set (split = "files"; the default split when given)
    eval_fraction  split = "random": the share of rows that go to eval (each row drawn on its own, seeded)
    time_cutoff    split = "time": rows at or after this time are eval (a timestamp in the time column's
                   format, or seconds since the epoch)
    last_days      split = "time" without time_cutoff: the last this many days of the data are eval
    holdout        split = "leave_last_out": each user's last this many rows (by time) are eval
    time_column, user_column   the columns the time splits read (default: role timestamp / user)
    test_input     raw files for a test set, written to out/test (transformed, never fitted on)
    test_split     true: hold out a test part of the input too, written to out/test, by the split's rule
                   applied once more (random: eval_fraction of the rows each; time: the last `last_days`
                   days or latest eval_fraction are test, the same span before them eval; leave_last_out:
                   each user's last `holdout` rows test, the `holdout` before them eval)
    join           [[preprocess.join]] side tables (input, on, columns, ...: see JoinSection), left-joined
                   to every row before the split; their columns take part in the workflow like the input's
    out            writes out/train/, out/eval/, out/workflow/ (for serving and raw evaluation), out/schema.json
    schema         parquet input: the schema.json describing its columns (default: one beside the files,
                   as `hugerec synth` writes it)
    min_frequency  sparse values seen fewer times share one out-of-vocabulary id (default ops)
    max_vocab      keep at most this many values per sparse column, most frequent first (default ops)
    log_dense      log1p the dense features first (default ops; Criteo's counts)
    on_error       "raise": stop at the first bad row, naming file, line and column; "skip": drop bad rows,
                   count them and report the count with the first examples
    seed           the random split's seed
    """

    input: str = "runs/quickstart/raw"
    format: RawFormat = RawFormat.PARQUET
    schema: str | None = None
    separator: str = ","
    header: bool = True
    eval_header: bool | None = None
    test_header: bool | None = None
    encoding: str = "utf-8"
    quote: str = '"'
    null_values: tuple[str, ...] = ()
    columns: tuple[ColumnSpec, ...] = ()
    ops: tuple[dict[str, Any], ...] = ()
    join: tuple[JoinSection, ...] = ()
    split: SplitKind | None = None
    eval_input: str | None = None
    test_input: str | None = None
    test_split: bool = False
    eval_fraction: float = 0.1
    time_cutoff: str | int | None = None
    last_days: float | None = None
    holdout: int = 1
    time_column: str | None = None
    user_column: str | None = None
    out: str = "runs/quickstart/data"
    min_frequency: int = 1
    max_vocab: int | None = None
    log_dense: bool = False
    on_error: OnError = OnError.RAISE
    seed: int = 0

    def __post_init__(self) -> None:
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.max_vocab is not None and self.max_vocab < 1:
            raise ValueError(f"max_vocab must be >= 1 or none, got {self.max_vocab}")
        if self.format is RawFormat.CRITEO and self.columns:
            raise ValueError('columns: the criteo format has fixed columns; use format = "csv" to declare your own')
        if self.format is RawFormat.CSV and not self.columns:
            raise ValueError("columns: declare the columns of the csv input (`hugerec schema FILE` writes them)")
        with_joins(self.input_spec(), [j.join() for j in self.join])  # separators, columns, joins checked now
        self.split_spec()
        if self.ops:
            Workflow.from_spec(self.ops)  # every op and parameter checked now, naming ops[i].key

    def input_spec(self) -> InputSpec:
        """The declared input (unresolved: Parquet columns may still come from the files)."""
        match self.format:
            case RawFormat.CRITEO:
                return InputSpec.criteo()
            case RawFormat.CSV | RawFormat.PARQUET:
                return InputSpec(
                    InputFormat(self.format.value),
                    self.separator,
                    self.header,
                    self.encoding,
                    self.quote or None,
                    self.null_values,
                    self.columns,
                )

    def split_spec(self) -> SplitSpec:
        kind = self.split or (SplitKind.FILES if self.eval_input is not None else SplitKind.RANDOM)
        return SplitSpec(
            kind,
            self.eval_fraction,
            self.seed,
            self.time_cutoff,
            self.last_days,
            self.holdout,
            self.time_column,
            self.user_column,
            self.test_split,
        )


def declared_input(p: PreprocessSection) -> InputSpec:
    """[preprocess]'s input with its columns (Parquet: preprocess.schema, a schema.json beside the files,
    or guessed from the files' types); ConfigError naming the key."""
    from hugerec.data.schema import Schema

    spec = p.input_spec()
    if p.format is RawFormat.PARQUET and not spec.columns and p.schema is not None:
        if not Path(p.schema).is_file():
            raise ConfigError(f"preprocess.schema: no schema at {p.schema}")
        return InputSpec.from_schema(Schema.load(p.schema))
    try:
        return spec.resolved(p.input)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"preprocess.input: {e}") from None


@dataclass(frozen=True)
class DataSection:
    """Preprocessed Parquet shards; schema defaults to schema.json in the folder above `train`.

    train       the training shards: a folder, a file or a glob (preprocess.out/train)
    eval        the evaluation shards, or raw files read as [preprocess] reads its input and run through
                the fitted workflow (none: no evaluation)
    schema      the shards' schema.json (none: the one in the folder above `train`)
    batch_size  rows per batch, or "auto": the power of two nearest to 2 * sqrt(rows read), from 32 to
                2048 (hugerec.training.defaults.auto_batch_size: 128 for 8,000 rows, 2048 from ~1 M rows)
    shuffle     shuffle the training rows each epoch (a shuffle buffer over row groups)
    seed        the shuffle's seed
    """

    train: str = "runs/quickstart/data/train"
    eval: str | None = "runs/quickstart/data/eval"
    schema: str | None = None
    batch_size: int | str = "auto"
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, str):
            if self.batch_size != "auto":
                raise ValueError(f'batch_size must be an int >= 1 or "auto", got {self.batch_size!r}')
        elif self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def schema_path(self) -> str:
        return self.schema if self.schema is not None else str(Path(self.train).parent / "schema.json")


@dataclass(frozen=True)
class EmbeddingSection:
    """The ranking models' embedding tables.

    dim        width of every table, or "auto": each table's width from its cardinality C (the number of
               ids), 6 * C ** 0.25 rounded up to a multiple of 8, from 8 to 64 (10 ids -> 16, 1,000 -> 40,
               from ~10,000 ids -> 64; hugerec.training.defaults.auto_embedding_dim); DLRM and DeepFM need
               one width: the rule at the largest table, or the last width of model.bottom when the
               config sets it. `hugerec train` prints the widths it chose
    optimizer  the tables' sparse optimizer
    dtype      how the rows are stored, "fp32", "bf16" or "fp16" (half the memory)
    storage    "memory", or "disk": tables larger than memory live in files (rows and optimizer state),
               their hot rows in a RAM cache (hugerec.embedding.disk); `train.resume` continues a killed
               run from its last checkpoint, bit for bit
    path       with storage = "disk": the folder of the tables' files, one `<table>.rows` each (default
               <train.out_dir>/tables); relative to the current directory
    cache_rows, cache_bytes   with storage = "disk": each disk table's RAM cache, in rows or in bytes (one
               of the two; a table with fewer rows than cache_rows stays in memory unless disk_tables names it)
    disk_tables  with storage = "disk": the tables on disk (empty: every table larger than its cache)
    """

    dim: int | str = "auto"
    optimizer: Optimizer = field(default_factory=lambda: RowWiseAdagrad(lr=0.05))
    dtype: StorageDtype = StorageDtype.FP32
    storage: Storage = Storage.MEMORY
    path: str | None = None
    cache_rows: int | None = None
    cache_bytes: int | None = None
    disk_tables: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.dim, str):
            if self.dim != "auto":
                raise ValueError(f'dim must be an int >= 1 or "auto", got {self.dim!r}')
        elif self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.storage is Storage.MEMORY:
            for key in ("path", "cache_rows", "cache_bytes", "disk_tables"):
                if getattr(self, key) not in (None, ()):
                    raise ValueError(f"{key} = {getattr(self, key)!r} needs storage = \"disk\"")
            return
        if (self.cache_rows is None) == (self.cache_bytes is None):
            raise ValueError(
                f'storage = "disk" needs exactly one of cache_rows and cache_bytes, got cache_rows = '
                f"{self.cache_rows!r}, cache_bytes = {self.cache_bytes!r}"
            )
        for key in ("cache_rows", "cache_bytes"):
            v = getattr(self, key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{key} must be an integer >= 1, got {v!r}")
        if self.path is not None and not self.path.strip():
            raise ValueError(f"path must name a folder, got {self.path!r}")
        for name in self.disk_tables:
            if not isinstance(name, str) or not name:
                raise ValueError(f"disk_tables must be table names, got {name!r}")

    def tables(self, tables: Sequence[TableConfig], out_dir: Path) -> list[TableConfig]:
        """`tables` (from the schema) with this section's dtype, and with storage = "disk" those it puts on disk
        given their files and caches; ConfigError naming a disk_tables entry that is no table."""
        tables = [dataclasses.replace(t, dtype=self.dtype) for t in tables]
        if self.storage is Storage.MEMORY:
            return tables
        names = [t.name for t in tables]
        if unknown := [n for n in self.disk_tables if n not in names]:
            raise ConfigError(f"embedding.disk_tables: {unknown[0]!r} is not a table of the data; the tables are {names}")
        folder = Path(self.path) if self.path is not None else out_dir / "tables"
        out = []
        for t in tables:
            named = t.name in self.disk_tables
            if (self.disk_tables and not named) or (not named and self.cache_rows is not None and t.num_rows <= self.cache_rows):
                out.append(t)
                continue
            cache_rows = None if self.cache_rows is None else min(self.cache_rows, t.num_rows)
            path = str(folder.absolute() / f"{t.name}.rows")
            out.append(
                dataclasses.replace(t, storage=Storage.DISK, path=path, cache_rows=cache_rows, cache_bytes=self.cache_bytes)
            )
        return out


@dataclass(frozen=True)
class PredictSection:
    """input: Parquet shards like data.eval (default: data.eval); out: default <train.out_dir>/predictions.parquet."""

    input: str | None = None
    out: str | None = None


# The quickstart, as a config file would spell it (configs/quickstart.toml is this, and a test keeps them equal).
QUICKSTART: dict[str, Any] = {
    "synth": {"preset": "criteo-like", "rows": 1_000_000, "out": "runs/quickstart/raw", "seed": 0},
    "preprocess": {
        "input": "runs/quickstart/raw",
        "format": "parquet",
        "eval_fraction": 0.1,
        "out": "runs/quickstart/data",
        "log_dense": False,
        "min_frequency": 10,
    },
    "data": {"train": "runs/quickstart/data/train", "eval": "runs/quickstart/data/eval", "batch_size": 1024},
    "embedding": {"dim": 16, "optimizer": {"type": "rowwise_adagrad", "lr": 0.03}},
    "model": {"type": "dlrm", "bottom": [64, 16], "top": [64, 32, 1]},
    "train": {"epochs": 1, "lr": 0.005, "log_every": 20, "out_dir": "runs/quickstart"},
}


@dataclass(frozen=True)
class RunConfig:
    synth: SynthSection = field(default_factory=SynthSection)
    preprocess: PreprocessSection = field(default_factory=PreprocessSection)
    data: DataSection = field(default_factory=DataSection)
    embedding: EmbeddingSection = field(default_factory=EmbeddingSection)
    model: ModelConfig = field(default_factory=lambda: config_from_dict(QUICKSTART["model"]))
    train: TrainConfig = field(default_factory=TrainConfig)
    predict: PredictSection = field(default_factory=PredictSection)
    interactions: InteractionsSection = field(default_factory=InteractionsSection)
    sequences: SequencesSection = field(default_factory=SequencesSection)
    index: IndexSection = field(default_factory=IndexSection)
    recommend: RecommendSection = field(default_factory=RecommendSection)
    # the [model] keys the config and the overrides set (bookkeeping, not a config key): the others are
    # defaults, which `train` fits to the data (hugerec.training.defaults.fitted_to_data)
    model_keys: frozenset[str] = field(default=frozenset(), metadata=INTERNAL)

    @property
    def family(self) -> Family:
        return type_of(self.model).family

    @property
    def model_type(self) -> str:
        return type_of(self.model).name

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir or ".")


def read_model(d: Mapping[str, Any]) -> ModelConfig:
    """[model] -> the registry's config of model.type (default "dlrm"), typed by its fields (errors name model.KEY)."""
    try:
        cls = model_type(d.get("type", "dlrm")).config
    except ValueError as e:
        raise ConfigError(str(e)) from None
    config: ModelConfig = from_dict(cls, {k: v for k, v in d.items() if k != "type"}, "model", READERS)
    return config


def _check_model_fits_embedding(model: ModelConfig, dim: int) -> None:
    """DLRM's dense arch feeds the dot interaction beside the embeddings, so it must end at their width."""
    if isinstance(model, DLRMConfig) and model.bottom and model.bottom[-1] != dim:
        fixed = [*model.bottom[:-1], dim]
        raise ConfigError(
            f"model.bottom must end at embedding.dim = {dim} (DLRM's interaction takes the dense arch's output "
            f"beside the embeddings), got {list(model.bottom)}; e.g. model.bottom=[{','.join(map(str, fixed))}]"
        )


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read `path` (None: the quickstart), apply `key=value` overrides, check every key and type.

    Sections and keys left out take their defaults; train.out_dir defaults to runs/<config file name>.
    """
    if path is not None:
        path = find_config(path)
    data = read_toml(path) if path is not None else copy.deepcopy(QUICKSTART)
    # the [model] keys set by the file (or the built-in quickstart, which configs/quickstart.toml spells
    # out) and by the overrides; a file without [model] leaves every key to the defaults
    written = data.get("model")
    overridden = (o.split("=", 1)[0].removeprefix("model.").split(".")[0] for o in overrides if o.startswith("model."))
    given = {*(written if isinstance(written, dict) else ()), *overridden}
    given.discard("type")
    model = data.get("model")
    if isinstance(model, dict) and "type" not in model:  # [model] without a type: the default model, amended
        data["model"] = {**QUICKSTART["model"], **model}
    data = apply_overrides(switch_model_type(data, overrides), overrides)
    if path is not None:
        train = data.setdefault("train", {})
        if isinstance(train, dict):
            train.setdefault("out_dir", f"runs/{Path(path).stem}")
    model = data.pop("model", QUICKSTART["model"])
    if not isinstance(model, Mapping):
        raise ConfigError(f"model: expected a table of keys, got {model!r}")
    model = dict(model)
    try:
        family = model_type(model.get("type", "dlrm")).family.value
    except ValueError as e:
        raise ConfigError(str(e)) from None
    base = Path(path).resolve().parent if path is not None else Path.cwd()
    data = upgrade_old_sections(data, family, lambda p: find_input(p, base) or p)
    if path is not None and isinstance(model.get("vectors"), list):  # [[model.vectors]] side tables: found like the data
        config_dir = Path(path).resolve().parent
        model["vectors"] = [
            {**v, "path": find_input(v["path"], config_dir)} if isinstance(v, dict) and isinstance(v.get("path"), str) else v
            for v in model["vectors"]
        ]
    cfg = dataclasses.replace(from_dict(RunConfig, data, "", READERS), model=read_model(model), model_keys=frozenset(given))
    if cfg.train.out_dir is None:
        raise ConfigError("train.out_dir: give a folder for the model, the log and the plot")
    if "bottom" in given and isinstance(cfg.embedding.dim, int):  # a default bottom is fitted to the embedding dim by `train`
        _check_model_fits_embedding(cfg.model, cfg.embedding.dim)  # now, not after the data was read
    _check_roles(cfg)
    if path is not None:
        cfg = _resolve_inputs(cfg, Path(path).resolve().parent)
        cfg = resolve_task_inputs(cfg, lambda p: find_input(p, Path(path).resolve().parent))
    return cfg


def _check_roles(cfg: RunConfig) -> None:
    """The model type fits the declared input's roles (a two-tower needs a user, an item and a time column)."""
    p = cfg.preprocess
    if not p.columns and p.format is not RawFormat.CRITEO:
        return  # Parquet without declared columns: its roles come from the files, checked when they are read
    declared = [c.role_value for c in p.input_spec().columns]
    missing = model_type(cfg.model_type).missing_roles(declared)
    if missing:
        needs = ", ".join(f'"{m}"' for m in missing)
        raise ConfigError(
            f"model.type = {cfg.model_type!r} ({cfg.family.value}) needs a column with role {needs} in preprocess.columns; "
            f"the declared roles are {sorted(set(declared))}"
        )


# The checkout's configs/ folder: `hugerec train configs/quickstart.toml` works from any directory.
SHIPPED_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def find_config(path: str | Path) -> Path:
    """`path` itself when it exists, else a documented `configs/NAME.toml` from the checkout's configs/."""
    p = Path(path)
    if p.is_file() or p.is_absolute():
        return p
    shipped = SHIPPED_CONFIGS / p.relative_to("configs") if p.parts[:1] == ("configs",) else None
    if shipped is not None and shipped.is_file():
        return shipped
    raise ConfigError(f"config file not found: {p} (looked in the current directory and in {SHIPPED_CONFIGS})")


def switch_model_type(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """`model.type=X` on the command line starts [model] afresh from X's defaults.

    The file's [model] fields describe the file's model type (DLRM's `bottom`, say) and mean nothing
    to another type; keeping them would make every type switch fail on the first foreign key. Fields
    the new type also has are kept; the others are named on stderr, so nothing is dropped silently.
    """
    new_type = None
    for item in overrides:
        key, sep, raw = item.partition("=")
        if sep and key.strip() == "model.type":
            new_type = parse_value(raw.strip())
    model = data.get("model")
    if new_type is None or not isinstance(model, dict) or model.get("type", "dlrm") == new_type:
        return data
    try:
        fields = set(model_type(new_type).fields())
    except ValueError as e:
        raise ConfigError(str(e)) from None
    left_out = sorted(k for k in model if k != "type" and k not in fields)
    if left_out:
        names = ", ".join(f"model.{k}" for k in left_out)
        print(
            f"note: {names} from the config file do not apply to model.type={new_type} and are left out",
            file=sys.stderr,
        )
    out = dict(data)
    out["model"] = {k: v for k, v in model.items() if k not in left_out}
    return out


def resolved_dict(cfg: RunConfig) -> dict[str, Any]:
    """Every key of `cfg` with its value (None included), as `--print-config` shows it."""
    out: dict[str, Any] = to_dict(cfg, keep_none=True)
    out["embedding"]["optimizer"] = optimizer_to_dict(cfg.embedding.optimizer)
    out["model"] = config_to_dict(cfg.model)
    return out


def _resolve_inputs(cfg: RunConfig, config_dir: Path) -> RunConfig:
    """Relative input paths that do not exist here but do next to the config file point there."""

    def find(p: str | None) -> str | None:
        if p is not None and "HUGEREC_DATA" in p:
            p = p.replace("${HUGEREC_DATA}", "$HUGEREC_DATA").replace("$HUGEREC_DATA", str(data_root(config_dir)))
        if p is None or Path(p).is_absolute() or _exists(p):
            return p
        beside = config_dir / p
        return str(beside) if _exists(str(beside)) else p

    return dataclasses.replace(
        cfg,
        preprocess=dataclasses.replace(
            cfg.preprocess,
            input=find(cfg.preprocess.input) or cfg.preprocess.input,
            schema=find(cfg.preprocess.schema),
            eval_input=find(cfg.preprocess.eval_input),
            test_input=find(cfg.preprocess.test_input),
            join=tuple(dataclasses.replace(j, input=find(j.input) or j.input) for j in cfg.preprocess.join),
        ),
        data=dataclasses.replace(
            cfg.data,
            train=find(cfg.data.train) or cfg.data.train,
            eval=find(cfg.data.eval),
            schema=find(cfg.data.schema),
        ),
        predict=dataclasses.replace(cfg.predict, input=find(cfg.predict.input)),
    )


def find_input(p: str | None, config_dir: Path) -> str | None:
    """An input path with $HUGEREC_DATA expanded; relative and absent here: the one next to the config file."""
    if p is not None and "HUGEREC_DATA" in p:
        p = p.replace("${HUGEREC_DATA}", "$HUGEREC_DATA").replace("$HUGEREC_DATA", str(data_root(config_dir)))
    if p is None or Path(p).is_absolute() or _exists(p):
        return p
    beside = config_dir / p
    return str(beside) if _exists(str(beside)) else p


def data_root(config_dir: Path) -> Path:
    """What `$HUGEREC_DATA` in a config path stands for.

    The environment variable when set; otherwise the first `shared/data` folder found in the config
    file's folder or one of its parents, then the current directory or one of its parents (the
    layout where the repository's checkout has the real data samples beside it).
    """
    env = os.environ.get("HUGEREC_DATA")
    if env:
        return Path(env)
    for start in (config_dir.resolve(), Path.cwd().resolve()):
        for d in (start, *start.parents):
            if (d / "shared" / "data").is_dir():
                return d / "shared" / "data"
    raise ConfigError(
        f"a path in the config uses $HUGEREC_DATA, which is not set, and no shared/data folder was found "
        f"above {config_dir} or the current directory: set HUGEREC_DATA to the folder holding the data"
    )


def _exists(p: str) -> bool:
    if any(ch in p for ch in "*?["):
        import glob

        return bool(glob.glob(p))
    return Path(p).exists()
