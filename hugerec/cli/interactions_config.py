"""The config sections of the retrieval and sequential tasks (kept apart from run_config's CTR sections).

    [interactions]  retrieval data: an implicit-feedback log (user, item, timestamp) and its split
    [sequences]     sequential data: events grouped into sessions / user histories and the protocol
    [index]         hugerec index: the exact or HNSW index over a trained model's item vectors
    [recommend]     hugerec recommend: users (retrieval) or histories (sequential) -> top-K Parquet
    [model]         type = "two_tower" | "mf" (retrieval) or "sasrec" | "mlm" | "gru4rec" (sequential)

The [train] section's epochs, max_steps, lr (dense Adam), seed and out_dir apply to these models too;
[embedding].optimizer is the sparse optimizer of their tables (their widths are model.dim /
model.embedding_dim). Raw user and item ids are integers; they are mapped to dense ids in training
and back in every output.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hugerec.cli.config_file import ConfigError, from_dict, to_dict
from hugerec.index.vector_index import IndexConfig, IndexKind
from hugerec.models.sequence import SequenceConfig
from hugerec.models.two_tower import Similarity, TwoTowerConfig
from hugerec.training.losses import BPR, Negatives, RetrievalLoss, SampledSoftmax
from hugerec.training.sequential import BCE, FullSoftmax, SequenceLoss

RETRIEVAL_TYPES = ("two_tower", "mf")
SEQUENTIAL_TYPES = ("sasrec", "mlm", "gru4rec")


class Split(enum.Enum):
    LEAVE_LAST_OUT = "leave_last_out"  # each user's last `holdout` events (by time) are the test set
    TIME = "time"  # events at or after a global time cutoff are the test set


class SequenceWindows(enum.Enum):
    LAST = "last"  # each sequence's last max_len (+ 1) items
    SLIDING = "sliding"  # windows over the whole of each sequence


class Protocol(enum.Enum):
    LEAVE_LAST_OUT = "leave_last_out"  # one query per sequence: all but its last item predict the last
    EVERY_PREFIX = "every_prefix"  # every prefix of every test sequence predicts its next item


def _check_columns(columns: tuple[str, ...], needed: Mapping[str, str]) -> None:
    if len(set(columns)) != len(columns):
        raise ValueError(f"columns has duplicate names: {list(columns)}")
    for key, name in needed.items():
        if name not in columns:
            raise ValueError(f"{key} = {name!r} is not one of columns = {list(columns)}")


@dataclass(frozen=True)
class InteractionsSection:
    """An implicit-feedback log for retrieval (model.type = "two_tower" | "mf").

    files           Parquet or delimited text (plain or .gz): a file, a folder or a glob
    columns         the fields of each line in file order (text), or the columns to read (Parquet)
    separator       field separator of text files; multi-byte ones such as MovieLens' "::" work
    header          text files start with a header line
    user, item, timestamp   which columns hold them (integer ids; timestamps in seconds, fractions floored)
    split           "leave_last_out": each user's last `holdout` events are the test set (users with
                    <= holdout events keep all of them for training); "time": events with timestamp >=
                    time_cutoff (or, without it, the time_fraction quantile) are the test set
    min_item_count  items with fewer events are dropped (with their rows) before the split
    max_users       keep only the users with the max_users smallest raw ids (a quick look); none: all
    batch_size      training examples (events) per step
    ks              the K of Recall/NDCG/MRR/HitRate/coverage@K in train's and evaluate's report
    """

    files: str | None = None
    columns: tuple[str, ...] = ("user", "item", "timestamp")
    separator: str = ","
    header: bool = False
    user: str = "user"
    item: str = "item"
    timestamp: str = "timestamp"
    split: Split = Split.LEAVE_LAST_OUT
    holdout: int = 1
    time_fraction: float = 0.9
    time_cutoff: int | None = None
    min_item_count: int = 1
    max_users: int | None = None
    batch_size: int = 1024
    ks: tuple[int, ...] = (10, 50)

    def __post_init__(self) -> None:
        _check_columns(self.columns, {"user": self.user, "item": self.item, "timestamp": self.timestamp})
        if not self.separator:
            raise ValueError("separator must not be empty")
        for name in ("holdout", "min_item_count", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.time_fraction < 1.0:
            raise ValueError(f"time_fraction must be in (0, 1), got {self.time_fraction}")
        if self.max_users is not None and self.max_users < 1:
            raise ValueError(f"max_users must be >= 1 or none, got {self.max_users}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of K >= 1, got {list(self.ks)}")


@dataclass(frozen=True)
class SequencesSection:
    """Events grouped into item sequences for the sequential models (model.type = "sasrec" | "mlm" | "gru4rec").

    files, columns, separator, header, item, timestamp   as in [interactions]
    sequence        the column whose value groups events into one sequence: a session id, or a user id
    gap_seconds     also start a new sequence after this much inactivity (a user log cut into sessions)
    drop_repeats    drop an item equal to the one just before it
    min_length      drop sequences shorter than this (after repeats and unknown test items are gone)
    protocol        "leave_last_out": each sequence's last item is its test target (user histories,
                    MovieLens); "every_prefix": every prefix of every test sequence predicts its next
                    item, items unseen in training removed first (sessions, YOOCHOOSE)
    test_files      every_prefix: the test sequences' files (same format); none: the sequences ending
                    in the last `test_days` days of `files`
    max_sequences   keep only the first N training sequences (a quick look); none: all
    windows         "last": train on each sequence's last max_len items; "sliding": on windows covering
                    all of each sequence (consecutive windows share one item; long user histories give
                    several windows, so every transition is trained)
    augment_reversed  also train on a reversed copy of every training sequence (`with_reversed`; the
                    test side is never reversed)
    batch_size      training windows per step
    ks              the K of Recall/MRR/NDCG@K in train's and evaluate's report
    """

    files: str | None = None
    columns: tuple[str, ...] = ("session", "item", "timestamp")
    separator: str = ","
    header: bool = False
    sequence: str = "session"
    item: str = "item"
    timestamp: str = "timestamp"
    gap_seconds: int | None = None
    drop_repeats: bool = True
    min_length: int = 2
    protocol: Protocol = Protocol.LEAVE_LAST_OUT
    test_files: str | None = None
    test_days: int = 1
    max_sequences: int | None = None
    windows: SequenceWindows = SequenceWindows.LAST
    augment_reversed: bool = False
    batch_size: int = 128
    ks: tuple[int, ...] = (10, 20)

    def __post_init__(self) -> None:
        _check_columns(self.columns, {"sequence": self.sequence, "item": self.item, "timestamp": self.timestamp})
        if not self.separator:
            raise ValueError("separator must not be empty")
        if self.gap_seconds is not None and self.gap_seconds < 1:
            raise ValueError(f"gap_seconds must be >= 1 or none, got {self.gap_seconds}")
        if self.min_length < 2:
            raise ValueError(f"min_length must be >= 2 (a sequence needs an input and a target), got {self.min_length}")
        for name in ("test_days", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_sequences is not None and self.max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1 or none, got {self.max_sequences}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of K >= 1, got {list(self.ks)}")


@dataclass(frozen=True)
class IndexSection:
    """kind: "exact" (blocked matmul + top-k) or "hnsw" (usearch graph on the MIPS transform);
    out: the index folder (none: <train.out_dir>/index); connectivity, expansion_add, expansion_search: HNSW's;
    dtype: how HNSW stores the vectors, "f32" or "f16" (half the memory, a faster search)."""

    kind: IndexKind = IndexKind.EXACT
    out: str | None = None
    connectivity: int = 32
    expansion_add: int = 128
    expansion_search: int = 512
    dtype: str = "f32"

    def __post_init__(self) -> None:
        self.index_config()  # its own checks, now

    def index_config(self) -> IndexConfig:
        return IndexConfig(self.kind, self.connectivity, self.expansion_add, self.expansion_search, dtype=self.dtype)


@dataclass(frozen=True)
class RecommendSection:
    """What `hugerec recommend` answers (the command line's --users / --history / --k / --out override these).

    users         retrieval: raw user ids; a user the model never saw gets the most popular items
    users_file    retrieval: a text file with one raw user id per line
    history       sequential: one history of raw item ids, oldest first (unknown items skipped, counted)
    history_file  sequential: a text file with one history per line, item ids separated by commas
    k             items per user / history (at most the catalogue's size)
    exclude_seen  leave out the user's training items (retrieval) or the history's items (sequential)
    use_index     answer from the index `hugerec index` built (index.out) instead of exact scoring
    out           the Parquet file (none: <train.out_dir>/recommendations.parquet)
    """

    users: tuple[int, ...] = ()
    users_file: str | None = None
    history: tuple[int, ...] = ()
    history_file: str | None = None
    k: int = 10
    exclude_seen: bool = True
    use_index: bool = False
    out: str | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


# -- [model] of these tasks ----------------------------------------------------------------------
@dataclass(frozen=True)
class TwoTowerModel:
    """hugerec.models.TwoTowerConfig's fields (no side features from a config yet) and the loss:
    loss = "sampled_softmax" (negatives: "mixed" | "in_batch" | "uniform" | "popularity", num_negatives
    sampled per batch, alpha: popularity exponent, logq correction, mask_history: a row's history items
    are not its negatives) or "bpr"."""

    dim: int = 64
    embedding_dim: int = 64
    user_layers: tuple[int, ...] = (256,)
    item_layers: tuple[int, ...] = ()
    use_user_id: bool = True
    max_history: int = 50
    recent: tuple[int, ...] = (1, 5)
    similarity: Similarity = Similarity.DOT
    temperature: float = 1.0
    init_std: float = 0.05
    loss: str = "sampled_softmax"
    negatives: Negatives = Negatives.MIXED
    num_negatives: int = 1024
    alpha: float = 0.0
    logq: bool = True
    mask_history: bool = False

    def __post_init__(self) -> None:
        self.tower_config()
        self.loss_config()

    def tower_config(self) -> TwoTowerConfig:
        return TwoTowerConfig(
            dim=self.dim,
            embedding_dim=self.embedding_dim,
            user_layers=self.user_layers,
            item_layers=self.item_layers,
            use_user_id=self.use_user_id,
            max_history=self.max_history,
            recent=self.recent,
            similarity=self.similarity,
            temperature=self.temperature,
            init_std=self.init_std,
        )

    def loss_config(self) -> RetrievalLoss:
        loss = retrieval_loss(self.loss, self.negatives, self.num_negatives, self.alpha, self.logq)
        if not self.mask_history:
            return loss
        if not isinstance(loss, SampledSoftmax):
            raise ValueError(f"mask_history = true applies to loss = 'sampled_softmax', got loss = {self.loss!r}")
        return dataclasses.replace(loss, mask_history=True)


@dataclass(frozen=True)
class MFModel:
    """Matrix factorisation: dim, temperature, init_std, and the loss as for two_tower."""

    dim: int = 64
    temperature: float = 1.0
    init_std: float = 0.1
    loss: str = "sampled_softmax"
    negatives: Negatives = Negatives.MIXED
    num_negatives: int = 1024
    alpha: float = 0.0
    logq: bool = True

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if not self.temperature > 0 or not self.init_std > 0:
            raise ValueError(f"temperature and init_std must be > 0, got {self.temperature}, {self.init_std}")
        retrieval_loss(self.loss, self.negatives, self.num_negatives, self.alpha, self.logq)

    def loss_config(self) -> RetrievalLoss:
        return retrieval_loss(self.loss, self.negatives, self.num_negatives, self.alpha, self.logq)


@dataclass(frozen=True)
class SequentialModel:
    """SASRec ("sasrec"), the masked transformer ("mlm") or GRU4Rec ("gru4rec"): SequenceConfig's fields and
    loss = "full_softmax" (over the catalogue: small ones) | "sampled_softmax" (negatives, num_negatives,
    alpha, logq as for two_tower: huge catalogues) | "bce" (one negative, classic SASRec);
    mask_prob: the fraction of items the masked model hides. Histories longer than max_len keep their last max_len items."""

    max_len: int = 50
    dim: int = 64
    num_layers: int = 2
    num_heads: int = 1
    dropout: float = 0.2
    loss: str = "full_softmax"
    negatives: Negatives = Negatives.MIXED
    num_negatives: int = 1024
    alpha: float = 0.0
    logq: bool = True
    mask_prob: float = 0.2

    def __post_init__(self) -> None:
        self.sequence_config(1)
        self.loss_config()
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")

    def sequence_config(self, num_items: int) -> SequenceConfig:
        return SequenceConfig(num_items, self.max_len, self.dim, self.num_layers, self.num_heads, self.dropout)

    def loss_config(self) -> SequenceLoss:
        match self.loss:
            case "full_softmax":
                return FullSoftmax()
            case "bce":
                return BCE()
            case _:
                loss = retrieval_loss(self.loss, self.negatives, self.num_negatives, self.alpha, self.logq, ("full_softmax", "bce"))
                assert isinstance(loss, SampledSoftmax)  # "bpr" is refused above for sequences
                return loss


def retrieval_loss(
    name: str, negatives: Negatives, num_negatives: int, alpha: float, logq: bool, others: tuple[str, ...] = ("bpr",)
) -> RetrievalLoss:
    choices = ["sampled_softmax", *others]
    if name == "sampled_softmax":
        return SampledSoftmax(negatives, num_negatives, alpha, logq)
    if name == "bpr" and "bpr" in others:
        return BPR()
    raise ValueError(f"loss must be one of {choices}, got {name!r}")


TaskModel = TwoTowerModel | MFModel | SequentialModel
_MODEL_CLASSES: dict[str, type[TwoTowerModel] | type[MFModel] | type[SequentialModel]] = {
    "two_tower": TwoTowerModel,
    "mf": MFModel,
    "sasrec": SequentialModel,
    "mlm": SequentialModel,
    "gru4rec": SequentialModel,
}


def is_task_model(model: Mapping[str, Any]) -> bool:
    """[model] names a retrieval or sequential model (not a CTR ranking model)."""
    return model.get("type") in _MODEL_CLASSES


def task_model_fields(kind: str) -> set[str] | None:
    """The [model] keys of a retrieval/sequential type, None for any other type."""
    cls = _MODEL_CLASSES.get(kind)
    return None if cls is None else set(cls.__dataclass_fields__)


def read_task_model(model: Mapping[str, Any]) -> TaskModel:
    """[model] of a retrieval / sequential type -> its dataclass (errors name model.KEY)."""
    kind = model.get("type")
    cls = _MODEL_CLASSES.get(str(kind))
    if cls is None:
        raise ConfigError(f"model.type: {kind!r} is not one of {list(_MODEL_CLASSES)}")
    return from_dict(cls, {k: v for k, v in model.items() if k != "type"}, "model")


def task_model_to_dict(model: Mapping[str, Any]) -> dict[str, Any]:
    """Every key of the task model, defaults included (what --print-config shows)."""
    out: dict[str, Any] = {"type": model["type"], **to_dict(read_task_model(model), keep_none=True)}
    return out


C = TypeVar("C")


def resolve_task_inputs(cfg: C, find: Callable[[str | None], str | None]) -> C:
    """`cfg` (a RunConfig) with the input paths of these sections passed through `find` ($HUGEREC_DATA,
    relative paths next to the config file)."""
    inter, seqs, rec = cfg.interactions, cfg.sequences, cfg.recommend  # type: ignore[attr-defined]
    return dataclasses.replace(
        cfg,  # type: ignore[type-var]
        interactions=dataclasses.replace(inter, files=find(inter.files)),
        sequences=dataclasses.replace(seqs, files=find(seqs.files), test_files=find(seqs.test_files)),
        recommend=dataclasses.replace(rec, users_file=find(rec.users_file), history_file=find(rec.history_file)),
    )
