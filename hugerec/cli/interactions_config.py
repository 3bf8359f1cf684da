"""The config sections of the retrieval and sequential tasks (kept apart from run_config's CTR sections).

    [preprocess]    the declared input, as for every model: files, layout, columns with their roles (user,
                    item, session, timestamp with its format) and the split (leave_last_out / time /
                    test_input): retrieval and sequential data are views of it (hugerec.data.events)
    [interactions]  how a retrieval model reads it: user histories (min_item_count, max_users), batch, ks
    [sequences]     how a sequential model reads it: sessions or user histories, the protocol, windows
    [index]         hugerec index: the exact or HNSW index over a trained model's item vectors
    [recommend]     hugerec recommend: users (retrieval) or histories (sequential) -> top-K Parquet
    [model]         type = "two_tower" | "mf" (retrieval) or "sasrec" | "mlm" | "gru4rec" (sequential):
                    the registry's configs (hugerec.models.registry)

The [train] section's epochs, max_steps, lr (dense Adam), seed and out_dir apply to these models too;
[embedding].optimizer is the sparse optimizer of their tables (their widths are model.dim /
model.embedding_dim). Raw user, item and session ids are integers; they are mapped to dense ids in
training and back in every output.

The old dialect, where [interactions] and [sequences] read their own files (files, columns, separator,
header, user / item / sequence / timestamp, split, holdout, time_fraction, time_cutoff, test_files,
test_days), is read for one more release: `upgrade_old_sections` rewrites it into [preprocess] and says
so in one line; a config that also declares [preprocess]'s input is refused.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hugerec.cli.config_file import ConfigError
from hugerec.data.events import SequenceProtocol, SequenceSpec
from hugerec.data.input_spec import Role, infer_spec
from hugerec.data.shards import expand_paths
from hugerec.index.vector_index import IndexConfig, IndexKind


class SequenceWindows(enum.Enum):
    LAST = "last"  # each sequence's last max_len (+ 1) items
    SLIDING = "sliding"  # windows over the whole of each sequence


@dataclass(frozen=True)
class InteractionsSection:
    """How a retrieval model (model.type = "two_tower" | "mf") reads the declared input's user histories.

    min_item_count  items with fewer events are dropped (with their events) before the split
    max_users       keep only the users with the max_users smallest raw ids (a quick look); none: all
    batch_size      training examples (events) per step
    ks              the K of Recall/NDCG/MRR/HitRate/coverage@K in train's and evaluate's report
    The events, their roles (user, item, timestamp) and the split are [preprocess]'s.
    """

    min_item_count: int = 1
    max_users: int | None = None
    batch_size: int = 1024
    ks: tuple[int, ...] = (10, 50)

    def __post_init__(self) -> None:
        for name in ("min_item_count", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_users is not None and self.max_users < 1:
            raise ValueError(f"max_users must be >= 1 or none, got {self.max_users}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of K >= 1, got {list(self.ks)}")


@dataclass(frozen=True)
class SequencesSection:
    """How a sequential model (model.type = "sasrec" | "mlm" | "gru4rec") groups the declared input into
    sequences (hugerec.data.events.SequenceSpec) and trains on them.

    group           "session" | "user": the role whose column makes one sequence (none: the session
                    column when one is declared, else the user column)
    gap_seconds     also start a new sequence after this much inactivity (a user log cut into sessions)
    drop_repeats    drop an item equal to the one just before it; none: what the protocol expects
                    (leave_last_out: true, its ranking leaves out the history's items; every_prefix: false,
                    GRU4Rec's session protocol scores every click as logged)
    min_length      drop sequences shorter than this (after repeats, rare and unknown test items are gone)
    min_item_count  items with fewer training events are dropped before grouping
    protocol        "leave_last_out": each sequence's last item is its test target (user histories,
                    MovieLens); "every_prefix": every prefix of every test sequence predicts its next
                    item, items unseen in training removed first (sessions, YOOCHOOSE); the test sequences
                    are preprocess.test_input's, or those ending after preprocess.split = "time"'s cutoff
                    (time_cutoff, last_days; unset: the last day)
    max_sequences   keep only the first N training sequences (a quick look); none: all
    windows         "last": train on each sequence's last max_len items; "sliding": on windows covering
                    all of each sequence (consecutive windows share one item; long user histories give
                    several windows, so every transition is trained)
    augment_reversed  also train on a reversed copy of every training sequence (`with_reversed`; the
                    test side is never reversed)
    batch_size      training windows per step
    ks              the K of Recall/MRR/NDCG@K in train's and evaluate's report
    The events' item and timestamp columns (and its format) are [preprocess]'s roles.
    """

    group: str | None = None
    gap_seconds: int | None = None
    drop_repeats: bool | None = None
    min_length: int = 2
    min_item_count: int = 1
    protocol: SequenceProtocol = SequenceProtocol.LEAVE_LAST_OUT
    max_sequences: int | None = None
    windows: SequenceWindows = SequenceWindows.LAST
    augment_reversed: bool = False
    batch_size: int = 128
    ks: tuple[int, ...] = (10, 20)

    def __post_init__(self) -> None:
        self.spec()  # the grouping's own checks, now
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError(f"ks must be a non-empty list of K >= 1, got {list(self.ks)}")

    def spec(self) -> SequenceSpec:
        if self.group not in (None, "session", "user"):
            raise ValueError(f"group must be 'session' or 'user' (or none), got {self.group!r}")
        group = None if self.group is None else Role(self.group)
        return SequenceSpec(
            group, self.gap_seconds, self.drop_repeats, self.min_length, self.min_item_count, self.protocol, self.max_sequences
        )


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
    """What `hugerec recommend` answers (the command line's --users / --history / --history-times / --k / --out
    override these).

    users          retrieval: raw user ids; a user the model never saw gets the most popular items
    users_file     retrieval: a text file with one raw user id per line
    history        sequential: one history of raw item ids, oldest first (unknown items skipped, counted)
    history_file   sequential: a text file with one history per line, item ids separated by commas
    history_times  sequential, a model trained with times (HSTU, model.times = true): the time in seconds of
                   each item of `history` (the same length), as the data's timestamp column reads them
    k              items per user / history (at most the catalogue's size)
    exclude_seen   leave out the user's training items (retrieval) or the history's items (sequential)
    use_index      answer from the index `hugerec index` built (index.out) instead of exact scoring
    out            the Parquet file (none: <train.out_dir>/recommendations.parquet)
    """

    users: tuple[int, ...] = ()
    users_file: str | None = None
    history: tuple[int, ...] = ()
    history_file: str | None = None
    history_times: tuple[int, ...] = ()
    k: int = 10
    exclude_seen: bool = True
    use_index: bool = False
    out: str | None = None

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        for t in self.history_times:
            if isinstance(t, bool) or not isinstance(t, int) or not -(2**63) <= t < 2**63:
                raise ValueError(f"history_times: {str(t)[:30]!r} is not a time in int64 seconds")


# -- the old dialect -------------------------------------------------------------------------------
OLD_KEYS = {
    "interactions": ("files", "columns", "separator", "header", "user", "item", "timestamp", "split", "holdout", "time_fraction", "time_cutoff"),
    "sequences": ("files", "columns", "separator", "header", "sequence", "item", "timestamp", "test_files", "test_days"),
}
_OLD_DEFAULTS: dict[str, dict[str, Any]] = {
    "interactions": {"columns": ["user", "item", "timestamp"], "separator": ",", "header": False, "user": "user", "item": "item", "timestamp": "timestamp"},
    "sequences": {"columns": ["session", "item", "timestamp"], "separator": ",", "header": False, "sequence": "session", "item": "item", "timestamp": "timestamp"},
}
# what the [preprocess] declaration takes over; a config that sets one of these and an old reader key mixes dialects
DECLARATION_KEYS = ("input", "format", "columns", "separator", "header", "split", "holdout", "time_cutoff", "last_days", "eval_fraction", "test_input")


def upgrade_old_sections(data: dict[str, Any], family: str | None, find: Callable[[str], str] = str) -> dict[str, Any]:
    """`data` (a config's TOML, overrides applied) with an old-dialect [interactions] / [sequences] reader
    rewritten into [preprocess] (and [sequences].group), and a one-line note on stderr naming the new keys.

    Only the section of the model's `family` ("retrieval" | "sequential") is read; old reader keys in the
    other one are left out (named in the note). ConfigError when [preprocess] declares the input too.
    `find` resolves an input path (for the header line of text with a header: the old columns named the
    fields by position, the declared input names them as the header does)."""
    old = {section: [k for k in OLD_KEYS[section] if k in (data.get(section) or {})] for section in OLD_KEYS}
    if not any(old.values()):
        return data
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    declared = [k for k in DECLARATION_KEYS if k in (data.get("preprocess") or {})]
    section = {"retrieval": "interactions", "sequential": "sequences"}.get(family or "")
    if declared and section is not None and old[section]:
        raise ConfigError(
            f"{section}.{old[section][0]} and preprocess.{declared[0]}: the config mixes the old dialect ([{section}] reading "
            f"its own files) with the new one ([preprocess] declaring the input); declare the input once, in [preprocess]"
        )
    for other in OLD_KEYS:
        if other != section and old[other]:
            out[other] = {k: v for k, v in out[other].items() if k not in OLD_KEYS[other]}
    notes = [f"{other}.{k}" for other in OLD_KEYS if other != section for k in old[other]]
    moved = ""
    if section is not None and old[section]:
        given = out.pop(section)
        reader = {**_OLD_DEFAULTS[section], **{k: given[k] for k in OLD_KEYS[section] if k in given}}
        out[section] = {k: v for k, v in given.items() if k not in OLD_KEYS[section]}
        out["preprocess"] = {**(out.get("preprocess") or {}), **_declaration(section, reader, out[section], find)}
        moved = (
            f"[{section}] {', '.join(old[section])} are the old dialect (read for one more release): declare the input in "
            "[preprocess] (preprocess.input, preprocess.format, preprocess.separator, preprocess.header, preprocess.columns "
            "with role = \"user\" / \"item\" / \"session\" / \"timestamp\", preprocess.split, preprocess.holdout, "
            "preprocess.time_cutoff, preprocess.eval_fraction, preprocess.last_days, preprocess.test_input)"
        )
    ignored = f"{', '.join(notes)} do not apply to this model.type and are left out" if notes else ""
    print("note: " + "; ".join(x for x in (moved, ignored) if x), file=sys.stderr)
    return out


def _declaration(section: str, reader: dict[str, Any], view: dict[str, Any], find: Callable[[str], str]) -> dict[str, Any]:
    """An old reader's keys as [preprocess] keys (and, for [sequences], the view's group)."""
    files = reader.get("files")
    parquet = isinstance(files, str) and files.endswith(".parquet")
    key = "user" if section == "interactions" else "sequence"
    roles = {reader[key]: "user" if section == "interactions" else "session", reader["item"]: "item"}
    names = list(reader["columns"])
    header = _header(files, reader["separator"], find) if isinstance(files, str) and reader["header"] and not parquet else None
    columns = []
    for i, name in enumerate(names):
        field = header[i] if header is not None and i < len(header) else name  # the old names were positions
        if name == reader["timestamp"]:
            columns.append({"name": field, "type": "timestamp"})
        elif name in roles:
            columns.append({"name": field, "type": "int", "role": roles[name]})
        else:
            columns.append({"name": field, "type": "string", "role": "none"})
    out: dict[str, Any] = {"format": "parquet" if parquet else "csv", "columns": columns}
    if files is not None:
        out["input"] = files
    if not parquet:
        out |= {"separator": reader["separator"], "header": reader["header"]}
    if section == "interactions":
        split = reader.get("split", "leave_last_out")
        out["split"] = split
        if split == "leave_last_out":
            out["holdout"] = reader.get("holdout", 1)
        elif reader.get("time_cutoff") is not None:
            out["time_cutoff"] = reader["time_cutoff"]
        else:
            out["eval_fraction"] = 1.0 - float(reader.get("time_fraction", 0.9))
    else:
        view["group"] = "session"
        if reader.get("test_files") is not None:
            out["test_input"] = reader["test_files"]
        elif view.get("protocol") == "every_prefix":
            out |= {"split": "time", "last_days": float(reader.get("test_days", 1))}
    return out


def _header(files: str, separator: str, find: Callable[[str], str]) -> list[str] | None:
    """The header line's names of the first of `files`, None when it cannot be read now (reading the data
    later names the file)."""
    try:
        first = expand_paths(find(files))[0]
        return [c.name for c in infer_spec(first, separator=separator, header=True, sample_bytes=1 << 16).columns]
    except (OSError, ValueError, IndexError):
        return None


C = TypeVar("C")


def resolve_task_inputs(cfg: C, find: Callable[[str | None], str | None]) -> C:
    """`cfg` (a RunConfig) with the input paths of [recommend] passed through `find` ($HUGEREC_DATA,
    relative paths next to the config file)."""
    rec = cfg.recommend  # type: ignore[attr-defined]
    return dataclasses.replace(
        cfg,  # type: ignore[type-var]
        recommend=dataclasses.replace(rec, users_file=find(rec.users_file), history_file=find(rec.history_file)),
    )
