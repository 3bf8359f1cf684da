"""Retrieval and sequential data as views of the declared input: the [preprocess] InputSpec's roles say
which column is the user, the item, the session and the time; the same split keys hold out the test part.

    d = retrieval_view(spec, "ratings.dat", SplitSpec(SplitKind.LEAVE_LAST_OUT))   # user histories
    d.train, d.test        # Interactions (dense ids, sorted by user and time); d.users_raw / d.items_raw
    s = sequence_view(spec, "clicks.tsv", SequenceSpec(protocol=SequenceProtocol.EVERY_PREFIX), max_len=20,
                      test_paths="test.tsv")                                          # sessions
    s.train (Sequences of dense ids), s.histories [Q, max_len], s.targets [Q], s.exclude

Events: the input's rows (`prepare.read_rows`: parsed once, bad rows raised with file and line or skipped
and counted) reduced to the role columns, ids as int64 (user, item and session columns must be declared
type = "int": the model file keeps raw ids as integers), times as epoch seconds by the timestamp
column's format ("unix", "unix_ms" or a strptime format).

Retrieval (two_tower, mf): one history per user; the split is [preprocess]'s: "leave_last_out" (each user's
last `holdout` events; the default) or "time" (time_cutoff, last_days, or the latest eval_fraction of the
events). Sequential (sasrec, mlm, gru4rec): events grouped into sequences by the session column, or by the
user column when no column has role "session" (`SequenceSpec.group` chooses when both exist), then:
    protocol "leave_last_out"  each sequence's last item is its test target (user histories, MovieLens);
                               [preprocess] split unset or "leave_last_out" with holdout = 1
    protocol "every_prefix"    every prefix of every test sequence predicts its next item, test items
                               unseen in training removed first (sessions, YOOCHOOSE); the test sequences
                               are [preprocess] test_input's, or those ending after the time split's cutoff
                               (split = "time"; unset: the last day)
drop_repeats (drop an item equal to the one just before it) defaults to what the protocol expects:
leave_last_out ranks over every item but the history's, so a target repeating the item just before it
could never be hit (dropped: true); every_prefix is the session protocol of GRU4Rec's evaluation, which
scores every click as logged against the whole catalogue, repeats included (kept: false).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from hugerec.data.input_spec import ColumnType, InputSpec, Role
from hugerec.data.interactions import Interactions, Vocabulary, categorify, leave_last_out, time_split
from hugerec.data.prepare import SplitKind, SplitSpec, read_rows, time_cutoff
from hugerec.data.preprocess.errors import OnError, SkipReport
from hugerec.data.sessions import ItemVocabulary, Sequences, group_sequences, last_n, prefixes
from hugerec.data.sessions import leave_last_out as sequence_leave_last_out

_DAY = 86_400


class SequenceProtocol(enum.Enum):
    LEAVE_LAST_OUT = "leave_last_out"  # one query per sequence: all but its last item predict the last
    EVERY_PREFIX = "every_prefix"  # every prefix of every test sequence predicts its next item


def role_column(spec: InputSpec, *roles: Role) -> str | None:
    """The one declared column with one of `roles` (the first role that has one), None if none has;
    ValueError naming preprocess.columns when several share the role."""
    for role in roles:
        found = spec.names_with_role(role)
        if len(found) > 1:
            raise ValueError(f'preprocess.columns: {list(found)} all have role = "{role.value}"; one column may have it')
        if found:
            return found[0]
    return None


def read_events(
    spec: InputSpec, paths: str | Sequence[str], columns: dict[str, str], where: str, on_error: OnError | str = OnError.RAISE
) -> tuple[pl.DataFrame, SkipReport]:
    """The declared input's `columns` (output name -> input column) as Int64; ids must be declared ints,
    the time column a timestamp (or an int of epoch seconds). A row without one of them is an error."""
    for name, column in columns.items():
        c = spec.column(column)
        allowed = (ColumnType.TIMESTAMP, ColumnType.INT) if name == "timestamp" else (ColumnType.INT,)
        if c.type not in allowed:
            raise ValueError(
                f'preprocess.columns: column {column!r} (role {c.role_value}) must be type = "{allowed[0].value}" for this '
                f"model, got {c.type.value!r} (the model keeps raw ids as integers)"
            )
    frame, report = read_rows(spec, paths, where, on_error)
    out = frame.select(*(pl.col(column).cast(pl.Int64).alias(name) for name, column in columns.items()))
    for name, column in columns.items():
        missing = out[name].null_count()
        if missing:
            raise ValueError(f"{where}: {missing:,} row(s) have no value in column {column!r} ({name}); every event needs one")
    if out.height == 0:
        raise ValueError(f"{where}: {paths!r} holds no events")
    return out, report


# -- retrieval: user histories -------------------------------------------------------------------
@dataclass(frozen=True)
class RetrievalData:
    """data: every kept event (dense ids); users_raw [U] / items_raw [I]: the raw id of each dense one;
    train / test: the split, made by `split`."""

    data: Interactions
    users_raw: np.ndarray
    items_raw: np.ndarray
    train: Interactions
    test: Interactions
    split: SplitSpec

    def validation_split(self) -> tuple[Interactions, Interactions]:
        """The training part less a validation split, and that split, cut from `train` as the test split
        was cut from the whole: each user's last `holdout` training events, or by time (the latest
        eval_fraction of the training part's events; 0.1 when eval_fraction is 0). Either part empty is
        refused, naming the counts."""
        match self.split.kind:
            case SplitKind.TIME:
                fit_part, valid = time_split(self.train, fraction=1.0 - (self.split.eval_fraction or 0.1))
            case _:  # leave_last_out (retrieval_view refuses the other kinds)
                fit_part, valid = leave_last_out(self.train, self.split.holdout)
        if fit_part.num_events == 0 or valid.num_events == 0:
            raise ValueError(
                f'preprocess.split = "{self.split.kind.value}" leaves {fit_part.num_events} training and '
                f"{valid.num_events} validation events in the training part; both must be > 0"
            )
        return fit_part, valid


def interaction_log(
    spec: InputSpec,
    paths: str | Sequence[str],
    model: str,
    on_error: OnError | str = OnError.RAISE,
    max_users: int | None = None,
    min_item_count: int = 1,
) -> tuple[Interactions, Vocabulary]:
    """The declared input's events (its user, item and timestamp roles; ValueError naming preprocess.columns
    when `model`, what reads them, misses a role) with dense ids (sorted raw order: `categorify`).

    max_users: only the users with the max_users smallest raw ids (a quick look); min_item_count: items with
    fewer events are dropped with their events."""
    user, item, time = _required(spec, model, (Role.USER,), (Role.ITEM,), (Role.TIMESTAMP,))
    raw, _ = read_events(spec, paths, {"user": user, "item": item, "timestamp": time}, "preprocess.input", on_error)
    if max_users is not None:
        keep = raw["user"].unique().sort()[:max_users]
        raw = raw.filter(pl.col("user").is_in(keep.implode()))
    data, vocab = categorify(raw, min_item_count=min_item_count)
    if data.num_events == 0:
        raise ValueError(f"min_item_count = {min_item_count} leaves no events")
    return data, vocab


def retrieval_view(
    spec: InputSpec,
    paths: str | Sequence[str],
    split: SplitSpec | None = None,
    min_item_count: int = 1,
    max_users: int | None = None,
    on_error: OnError | str = OnError.RAISE,
) -> RetrievalData:
    """The declared input as one time-ordered history per user, split for retrieval.

    min_item_count: items with fewer events are dropped (with their events) before the split; max_users:
    only the users with the max_users smallest raw ids (a quick look)."""
    split = split or SplitSpec(SplitKind.LEAVE_LAST_OUT)
    refuse_test_split(split)
    data, vocab = interaction_log(spec, paths, "two_tower / mf", on_error, max_users, min_item_count)
    match split.kind:
        case SplitKind.LEAVE_LAST_OUT:
            train, test = leave_last_out(data, split.holdout)
        case SplitKind.TIME:
            train, test = time_split(data, cutoff=time_cutoff(split, data.frame["timestamp"].to_numpy()))
        case other:
            raise ValueError(
                f'preprocess.split = "{other.value}": retrieval holds out by user or by time: "leave_last_out" '
                '(each user\'s last holdout events) or "time" (time_cutoff, last_days or the latest eval_fraction)'
            )
    if train.num_events == 0 or test.num_events == 0:
        raise ValueError(
            f'preprocess.split = "{split.kind.value}" gives {train.num_events} training and {test.num_events} test events; both must be > 0'
        )
    return RetrievalData(data, vocab.users, vocab.items, train, test, split)


# -- sequential: sessions or user histories -------------------------------------------------------
@dataclass(frozen=True)
class SequenceSpec:
    """How events become sequences (see the module docstring).

    group           "session" | "user": the role whose column groups events (None: session if declared, else user)
    gap_seconds     also start a new sequence after this much inactivity (a user log cut into sessions)
    drop_repeats    drop an item equal to the one just before it (None: the protocol's default)
    min_length      drop sequences shorter than this (after repeats, rare and unknown test items are gone)
    min_item_count  items with fewer training events are dropped before grouping (test ones: unknown)
    protocol        "leave_last_out" | "every_prefix"
    max_sequences   keep only the first N training sequences (a quick look); None: all
    """

    group: Role | None = None
    gap_seconds: int | None = None
    drop_repeats: bool | None = None
    min_length: int = 2
    min_item_count: int = 1
    protocol: SequenceProtocol = SequenceProtocol.LEAVE_LAST_OUT
    max_sequences: int | None = None

    def __post_init__(self) -> None:
        if self.group is not None:
            object.__setattr__(self, "group", Role(self.group))
            if self.group not in (Role.SESSION, Role.USER):
                raise ValueError(f"group must be 'session' or 'user', got {self.group.value!r}")
        object.__setattr__(self, "protocol", SequenceProtocol(self.protocol))
        if self.gap_seconds is not None and self.gap_seconds < 1:
            raise ValueError(f"gap_seconds must be >= 1 or none, got {self.gap_seconds}")
        if self.min_length < 2:
            raise ValueError(f"min_length must be >= 2 (a sequence needs an input and a target), got {self.min_length}")
        if self.min_item_count < 1:
            raise ValueError(f"min_item_count must be >= 1, got {self.min_item_count}")
        if self.max_sequences is not None and self.max_sequences < 1:
            raise ValueError(f"max_sequences must be >= 1 or none, got {self.max_sequences}")

    @property
    def repeats_dropped(self) -> bool:
        """drop_repeats, or the protocol's default (module docstring: leave_last_out true, every_prefix false)."""
        if self.drop_repeats is not None:
            return self.drop_repeats
        return self.protocol is SequenceProtocol.LEAVE_LAST_OUT


@dataclass(frozen=True)
class SequenceData:
    """vocab: raw item ids -> 1..I; train: the training sequences (dense ids); histories [Q, max_len]:
    left-padded dense ids of the test queries, targets [Q]; exclude: what the ranking leaves out per query
    (leave_last_out: the history's items, as CSR), None for every_prefix; unknown_test_items: test items
    unseen in training, skipped; history_times [Q, max_len]: the histories' timestamps (0 at padding)."""

    vocab: ItemVocabulary
    train: Sequences
    histories: np.ndarray
    targets: np.ndarray
    exclude: tuple[np.ndarray, np.ndarray] | None
    unknown_test_items: int
    history_times: np.ndarray


def refuse_test_split(split: SplitSpec) -> None:
    """Retrieval and sequential data hold out one part (their test part): a second one has no reader."""
    if split.test_split:
        raise ValueError(
            "preprocess.test_split: retrieval and sequential models hold out one part, their test part, "
            "by the split alone; leave test_split unset"
        )


def sequence_view(
    spec: InputSpec,
    paths: str | Sequence[str],
    sequences: SequenceSpec,
    max_len: int,
    split: SplitSpec | None = None,
    test_paths: str | Sequence[str] | None = None,
    on_error: OnError | str = OnError.RAISE,
) -> SequenceData:
    """The declared input grouped into sequences, held out by `sequences.protocol` (see the module docstring)."""
    s = sequences
    if split is not None:
        refuse_test_split(split)
    roles = (s.group,) if s.group is not None else (Role.SESSION, Role.USER)
    key, item, time = _required(spec, "sasrec / mlm / gru4rec", roles, (Role.ITEM,), (Role.TIMESTAMP,))
    columns = {"key": key, "item": item, "timestamp": time}
    events, _ = read_events(spec, paths, columns, "preprocess.input", on_error)
    match s.protocol:
        case SequenceProtocol.LEAVE_LAST_OUT:
            if split is not None and (split.kind is not SplitKind.LEAVE_LAST_OUT or split.holdout != 1):
                raise ValueError(
                    'sequences.protocol = "leave_last_out" holds out each sequence\'s last item: preprocess.split must be '
                    f'unset or "leave_last_out" with holdout = 1, got "{split.kind.value}" (holdout {split.holdout})'
                )
            if test_paths is not None:
                raise ValueError('preprocess.test_input: the "leave_last_out" protocol tests on each sequence\'s last item; '
                                 'use sequences.protocol = "every_prefix" for test files')
            seqs = _group(_frequent(events, s.min_item_count), s, "preprocess.input")
            seqs = _first(seqs, s.max_sequences)
            vocab = ItemVocabulary.fit(seqs.items)
            encoded, _ = vocab.encode(seqs, min_length=2)
            train, targets = sequence_leave_last_out(encoded)
            times = last_n(train, max_len, values=train.timestamps)
            return SequenceData(vocab, train, last_n(train, max_len), targets, (train.offsets, train.items), 0, times)
        case SequenceProtocol.EVERY_PREFIX:
            if test_paths is not None:
                if split is not None:
                    raise ValueError(f'preprocess.split = "{split.kind.value}": the test sequences are preprocess.test_input\'s; leave split unset')
                test_events, _ = read_events(spec, test_paths, columns, "preprocess.test_input", on_error)
                train_raw = _first(_group(_frequent(events, s.min_item_count), s, "preprocess.input"), s.max_sequences)
                test_raw = _group(test_events, s, "preprocess.test_input")
            else:
                split = split or SplitSpec(SplitKind.TIME, last_days=1)
                if split.kind is not SplitKind.TIME:
                    raise ValueError(
                        'sequences.protocol = "every_prefix" tests on whole sequences: give preprocess.test_input, or '
                        f'preprocess.split = "time" (time_cutoff, last_days or eval_fraction), not "{split.kind.value}"'
                    )
                seqs = _first(_group(events, s, "preprocess.input"), s.max_sequences)
                ends = seqs.timestamps[seqs.offsets[1:] - 1]
                test = ends >= time_cutoff(split, ends)
                train_raw, test_raw = seqs.select(~test), seqs.select(test)
                if s.min_item_count > 1:  # rare items by their training events; the grouping again without them
                    rare = _rare_items(train_raw.items, s.min_item_count)
                    train_raw = _regroup(train_raw, rare, s)
            if not len(train_raw) or not len(test_raw):
                raise ValueError(f"sequences: the split leaves {len(train_raw)} training and {len(test_raw)} test sequences; both must be > 0")
            vocab = ItemVocabulary.fit(train_raw.items)
            train, _ = vocab.encode(train_raw, min_length=2)
            test_seqs, report = vocab.encode(test_raw, min_length=2)
            seq, end, targets = prefixes(test_seqs)
            if not len(targets):
                raise ValueError("sequences: no test sequence keeps 2 items the training data knows")
            histories = last_n(test_seqs, max_len, rows=seq, ends=end)
            times = last_n(test_seqs, max_len, rows=seq, ends=end, values=test_seqs.timestamps)
            return SequenceData(vocab, train, histories, targets, None, report.unknown_items, times)


def _required(spec: InputSpec, model: str, *needs: tuple[Role, ...]) -> tuple[str, ...]:
    """The column of each needed role (each a tuple of alternatives), or one line naming what is missing."""
    found = [role_column(spec, *alternatives) for alternatives in needs]
    missing = [" or ".join(f'"{r.value}"' for r in alternatives) for alternatives, c in zip(needs, found, strict=True) if c is None]
    if missing:
        declared = sorted({c.role_value for c in spec.columns})
        raise ValueError(
            f"preprocess.columns: {model} needs a column with role {', '.join(missing)}; the declared roles are {declared}"
        )
    return tuple(c for c in found if c is not None)


def _frequent(events: pl.DataFrame, min_item_count: int) -> pl.DataFrame:
    return events if min_item_count <= 1 else events.filter(pl.len().over("item") >= min_item_count)


def _rare_items(items: np.ndarray, min_item_count: int) -> np.ndarray:
    values, counts = np.unique(items, return_counts=True)
    return values[counts < min_item_count]


def _regroup(seqs: Sequences, rare: np.ndarray, s: SequenceSpec) -> Sequences:
    """`seqs` without the `rare` items, repeats and short sequences dropped again as `_group` does."""
    keep = ~np.isin(seqs.items, rare)
    frame = pl.DataFrame(
        {"key": seqs.sequence_ids()[keep], "item": seqs.items[keep], "timestamp": seqs.timestamps[keep]}
    )
    regrouped = group_sequences(frame, key="key", drop_repeats=s.repeats_dropped, min_length=s.min_length)
    return Sequences(seqs.keys[regrouped.keys], regrouped.offsets, regrouped.items, regrouped.timestamps)


def _group(events: pl.DataFrame, s: SequenceSpec, where: str) -> Sequences:
    seqs = group_sequences(events, key="key", gap_seconds=s.gap_seconds, drop_repeats=s.repeats_dropped, min_length=s.min_length)
    if not len(seqs):
        raise ValueError(f"{where}: no sequence has sequences.min_length = {s.min_length} items or more")
    return seqs


def _first(seqs: Sequences, n: int | None) -> Sequences:
    return seqs if n is None else seqs.select(np.arange(min(n, len(seqs))))
