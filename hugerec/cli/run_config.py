"""RunConfig: everything the `hugerec` commands read, one TOML section per step.

    [synth]       hugerec synth       a synthetic click log with a known best-possible AUC
    [preprocess]  hugerec preprocess  raw rows -> fitted Workflow -> train/eval Parquet shards + schema.json
    [data]        train, evaluate     which shards to read and how to batch them
    [embedding]   train               embedding width and the sparse optimizer of the tables
    [model]       train               type = "dlrm" | "dcn_v2" | "deepfm" | "wide_and_deep", then its fields
    [train]       train               hugerec.training.TrainConfig (epochs, lr, precision, out_dir, ...)
    [predict]     predict             rows to score and where the Parquet of probabilities goes
    [interactions], [sequences], [index], [recommend]: the retrieval and sequential tasks
                  (model.type = "two_tower" | "mf" | "sasrec" | "mlm" | "gru4rec"; see interactions_config)

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

from hugerec.cli.config_file import ConfigError, apply_overrides, from_dict, parse_value, read_toml, to_dict
from hugerec.cli.interactions_config import (
    IndexSection,
    InteractionsSection,
    RecommendSection,
    SequencesSection,
    is_task_model,
    read_task_model,
    resolve_task_inputs,
    task_model_fields,
    task_model_to_dict,
)
from hugerec.data.preprocess.errors import OnError
from hugerec.embedding.optimizers import Optimizer, RowWiseAdagrad, optimizer_from_dict, optimizer_to_dict
from hugerec.embedding.table_config import StorageDtype
from hugerec.models.model_config import DLRMConfig, ModelConfig, model_config_from_dict, model_config_to_dict
from hugerec.training.trainer import TrainConfig

READERS = {Optimizer: optimizer_from_dict}


class RawFormat(enum.Enum):
    CRITEO = "criteo"  # the Criteo Kaggle / Terabyte TSV: label, I1..I13, C1..C26 (plain or .gz)
    PARQUET = "parquet"  # Parquet with a schema.json beside it (what `hugerec synth` writes) or preprocess.schema


@dataclass(frozen=True)
class SynthSection:
    """preset: "criteo-like" (13 dense + 26 sparse, Criteo Kaggle cardinalities) or "seed-synthetic"."""

    preset: str = "criteo-like"
    rows: int = 300_000
    out: str = "runs/quickstart/raw"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")


@dataclass(frozen=True)
class PreprocessSection:
    """Raw rows -> FillMissing + (LogOp) + Normalize on dense, Categorify on sparse -> Parquet shards.

    input          raw files: a file, a folder or a glob
    eval_input     raw files held out for evaluation; without it, eval_fraction of the rows (at random)
    out            writes out/train/, out/eval/, out/workflow/ (for serving) and out/schema.json
    min_frequency  sparse values seen fewer times share one out-of-vocabulary id
    max_vocab      keep at most this many values per sparse column (most frequent first)
    log_dense      log1p the dense features first (Criteo's counts; synthetic ones are already logs)
    on_error       "raise": stop at the first bad row, naming file, line and column; "skip": drop bad rows,
                   count them and report the count with the first examples
    """

    input: str = "runs/quickstart/raw"
    format: RawFormat = RawFormat.PARQUET
    schema: str | None = None
    eval_input: str | None = None
    eval_fraction: float = 0.1
    out: str = "runs/quickstart/data"
    min_frequency: int = 1
    max_vocab: int | None = None
    log_dense: bool = False
    on_error: OnError = OnError.RAISE
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.max_vocab is not None and self.max_vocab < 1:
            raise ValueError(f"max_vocab must be >= 1 or none, got {self.max_vocab}")


@dataclass(frozen=True)
class DataSection:
    """Preprocessed Parquet shards; schema defaults to schema.json in the folder above `train`.

    batch_size  rows per batch, or "auto": the power of two nearest to 2 * sqrt(rows read), from 32 to
                2048 (hugerec.training.defaults.auto_batch_size: 128 for 8,000 rows, 2048 from ~1 M rows)
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
    """dim: width of every table (DLRM and DeepFM need one width); optimizer: the tables' sparse optimizer."""

    dim: int = 16
    optimizer: Optimizer = field(default_factory=lambda: RowWiseAdagrad(lr=0.05))
    dtype: StorageDtype = StorageDtype.FP32

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")


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
    model: dict[str, Any] = field(default_factory=lambda: dict(QUICKSTART["model"]))
    train: TrainConfig = field(default_factory=TrainConfig)
    predict: PredictSection = field(default_factory=PredictSection)
    interactions: InteractionsSection = field(default_factory=InteractionsSection)
    sequences: SequencesSection = field(default_factory=SequencesSection)
    index: IndexSection = field(default_factory=IndexSection)
    recommend: RecommendSection = field(default_factory=RecommendSection)

    def model_config(self) -> ModelConfig:
        return read_model_config(self.model)

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir or ".")


def read_model_config(d: Mapping[str, Any]) -> ModelConfig:
    """[model] -> DLRMConfig | DCNv2Config | ..., typed by the chosen model's fields (with suggestions)."""
    kind = d.get("type", "dlrm")
    try:
        cls = type(model_config_from_dict({"type": kind}))
    except ValueError as e:
        raise ConfigError(f"model.type: {e}") from None
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
    model = data.get("model")
    if isinstance(model, dict) and "type" not in model:  # [model] without a type: the default model, amended
        data["model"] = {**QUICKSTART["model"], **model}
    data = apply_overrides(_switch_model_type(data, overrides), overrides)
    if path is not None:
        train = data.setdefault("train", {})
        if isinstance(train, dict):
            train.setdefault("out_dir", f"runs/{Path(path).stem}")
    cfg = from_dict(RunConfig, data, "", READERS)
    if cfg.train.out_dir is None:
        raise ConfigError("train.out_dir: give a folder for the model, the log and the plot")
    if is_task_model(cfg.model):  # a retrieval / sequential model: its own fields, checked now
        read_task_model(cfg.model)
    else:
        _check_model_fits_embedding(cfg.model_config(), cfg.embedding.dim)  # now, not after the data was read
    if path is not None:
        cfg = _resolve_inputs(cfg, Path(path).resolve().parent)
        cfg = resolve_task_inputs(cfg, lambda p: _find_input(p, Path(path).resolve().parent))
    return cfg


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


def _switch_model_type(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
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
        task_fields = task_model_fields(str(new_type))
        fields = task_fields or {f.name for f in dataclasses.fields(type(model_config_from_dict({"type": new_type})))}
    except ValueError as e:
        raise ConfigError(f"model.type: {e}") from None
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
    out["model"] = task_model_to_dict(cfg.model) if is_task_model(cfg.model) else model_config_to_dict(cfg.model_config())
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

    model = cfg.model
    if isinstance(model.get("vectors"), list):  # [[model.vectors]] side tables: path resolved like the data's
        model = dict(model)
        model["vectors"] = [
            {**v, "path": find(v["path"])} if isinstance(v, dict) and isinstance(v.get("path"), str) else v
            for v in cfg.model["vectors"]
        ]
    return dataclasses.replace(
        cfg,
        model=model,
        preprocess=dataclasses.replace(
            cfg.preprocess,
            input=find(cfg.preprocess.input) or cfg.preprocess.input,
            schema=find(cfg.preprocess.schema),
            eval_input=find(cfg.preprocess.eval_input),
        ),
        data=dataclasses.replace(
            cfg.data,
            train=find(cfg.data.train) or cfg.data.train,
            eval=find(cfg.data.eval),
            schema=find(cfg.data.schema),
        ),
        predict=dataclasses.replace(cfg.predict, input=find(cfg.predict.input)),
    )


def _find_input(p: str | None, config_dir: Path) -> str | None:
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
