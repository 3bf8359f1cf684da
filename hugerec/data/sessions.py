"""Sessions and user histories as item sequences: grouping, cleaning, id mapping, splits, padding.

    events = read_yoochoose("yoochoose-clicks-100k_train_full.txt.gz")    # session, item, timestamp
    seqs = group_sequences(events, key="session", min_length=2)           # time-ordered, repeats dropped
    vocab = ItemVocabulary.fit(seqs.items)                                # raw ids -> 1..I (0 = padding)
    train, report = vocab.encode(seqs)                                    # unknown items skipped, counted
    padded = last_n(train, max_len=50)                                    # [S, 50], left-padded with 0

A `Sequences` is a CSR of S sequences: sequence s is items[offsets[s]:offsets[s+1]] in time order,
with the timestamp of every item beside it. Everything is vectorised (polars / numpy); no Python loop
runs per event or per sequence.

Conventions:
  - dense item ids are 1..I; 0 is the padding id (and never an item);
  - sequences longer than a model's maximum keep their LAST max_len items (`last_n`);
  - a history with an item the vocabulary does not know keeps its other items; the unknown ones are
    counted in `EncodeReport`, never remapped to another item.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from hugerec.models.sequence import PAD  # the padding item id in dense sequences

_DAY = 86_400


@dataclass(frozen=True)
class Sequences:
    """S item sequences in CSR form.

    keys        [S] the session id (or user id) of each sequence
    offsets     [S + 1] int64, offsets[0] = 0, non-decreasing
    items       [N] int64 item ids (raw or dense), in time order within a sequence
    timestamps  [N] int64 seconds
    """

    keys: np.ndarray
    offsets: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray

    def __post_init__(self) -> None:
        off = self.offsets
        if off.ndim != 1 or len(off) != len(self.keys) + 1 or (len(off) and off[0] != 0):
            raise ValueError(f"Sequences: offsets must be [S + 1] from 0, got shape {off.shape} for {len(self.keys)} keys")
        if np.any(np.diff(off) < 0) or int(off[-1]) != len(self.items) or len(self.items) != len(self.timestamps):
            raise ValueError(
                f"Sequences: offsets end at {int(off[-1])} but there are {len(self.items)} items and {len(self.timestamps)} timestamps"
            )

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def sequence_ids(self) -> np.ndarray:
        """[N] the sequence index of every item."""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.lengths)

    def select(self, rows: np.ndarray) -> Sequences:
        """The sequences `rows` (a bool mask [S] or indices), in that order."""
        rows = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows.astype(np.int64)
        lengths = self.lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        pos = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        return Sequences(self.keys[rows], offsets, self.items[pos], self.timestamps[pos])

    def keep_items(self, keep: np.ndarray) -> Sequences:
        """Drop the items where keep [N] is False (sequences may become shorter or empty)."""
        counts = np.bincount(self.sequence_ids()[keep], minlength=len(self))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        return Sequences(self.keys, offsets, self.items[keep], self.timestamps[keep])

    def time_gaps(self) -> np.ndarray:
        """[N] seconds since the previous item of the same sequence (0 for the first): a list feature beside the items."""
        gaps = np.diff(self.timestamps, prepend=self.timestamps[:1])
        gaps[self.offsets[:-1][self.lengths > 0]] = 0
        return gaps


def group_sequences(
    events: pl.DataFrame,
    key: str = "session",
    item: str = "item",
    time: str = "timestamp",
    gap_seconds: int | None = None,
    drop_repeats: bool = True,
    min_length: int = 1,
) -> Sequences:
    """Events -> one time-ordered sequence per `key` value (events of equal time keep their file order).

    gap_seconds: also start a new sequence when the same key is inactive for more than this (a user log
    cut into sessions). drop_repeats: drop an item equal to the one just before it in the sequence.
    min_length: drop sequences shorter than this after the repeats are gone.
    """
    for c in (key, item, time):
        if c not in events.columns:
            raise ValueError(f"group_sequences: events have no column {c!r}; columns are {events.columns}")
        if events[c].null_count():
            raise ValueError(f"group_sequences: column {c!r} has {events[c].null_count()} missing values")
    if gap_seconds is not None and gap_seconds <= 0:
        raise ValueError(f"group_sequences: gap_seconds must be > 0, got {gap_seconds}")
    if min_length < 1:
        raise ValueError(f"group_sequences: min_length must be >= 1, got {min_length}")
    frame = events.select(
        pl.col(key).alias("key"), pl.col(item).cast(pl.Int64).alias("item"), pl.col(time).cast(pl.Int64).alias("t")
    ).sort(["key", "t"], maintain_order=True)
    new = pl.col("key") != pl.col("key").shift(1)
    if gap_seconds is not None:
        new = new | ((pl.col("t") - pl.col("t").shift(1)) > gap_seconds)
    frame = frame.with_columns(new.fill_null(True).cum_sum().alias("seq"))
    if drop_repeats:
        repeat = (pl.col("seq") == pl.col("seq").shift(1)) & (pl.col("item") == pl.col("item").shift(1))
        frame = frame.filter(~repeat.fill_null(False))
    frame = frame.filter(pl.len().over("seq") >= min_length)
    seq = frame["seq"].to_numpy()
    starts = np.flatnonzero(np.diff(seq, prepend=-1) != 0)
    offsets = np.append(starts, len(seq)).astype(np.int64)
    return Sequences(frame["key"].to_numpy()[starts], offsets, frame["item"].to_numpy(), frame["t"].to_numpy())


def filter_length(seqs: Sequences, min_length: int) -> Sequences:
    return seqs.select(seqs.lengths >= min_length)


@dataclass(frozen=True)
class EncodeReport:
    """What `ItemVocabulary.encode` left out: unknown items, and sequences left shorter than min_length."""

    unknown_items: int
    dropped_sequences: int


@dataclass(frozen=True)
class ItemVocabulary:
    """Raw item ids (sorted, unique) -> dense ids 1..I; raw[i - 1] is the raw id of dense id i."""

    raw: np.ndarray

    @staticmethod
    def fit(items: np.ndarray) -> ItemVocabulary:
        return ItemVocabulary(np.unique(items.astype(np.int64)))

    @property
    def num_items(self) -> int:
        return len(self.raw)

    def lookup(self, items: np.ndarray) -> np.ndarray:
        """[N] raw ids -> [N] dense ids, PAD where the id is unknown."""
        items = np.asarray(items, dtype=np.int64)
        if not len(self.raw):
            return np.zeros(len(items), dtype=np.int64)
        pos = np.clip(np.searchsorted(self.raw, items), 0, len(self.raw) - 1)
        return np.where(self.raw[pos] == items, pos + 1, PAD).astype(np.int64)

    def encode(self, seqs: Sequences, min_length: int = 1) -> tuple[Sequences, EncodeReport]:
        """Dense ids; unknown items are skipped (and counted), then sequences shorter than min_length dropped."""
        dense = self.lookup(seqs.items)
        known = dense != PAD
        out = Sequences(seqs.keys, seqs.offsets, dense, seqs.timestamps).keep_items(known)
        long_enough = out.lengths >= min_length
        return out.select(long_enough), EncodeReport(int((~known).sum()), int((~long_enough).sum()))


def split_by_day(seqs: Sequences, test_days: int = 1) -> tuple[Sequences, Sequences]:
    """(train, test): sequences ending in the last `test_days` days of the log are test, the rest train."""
    if test_days < 1:
        raise ValueError(f"split_by_day: test_days must be >= 1, got {test_days}")
    if not len(seqs) or not len(seqs.items):
        raise ValueError("split_by_day: no sequences to split")
    nonempty = seqs.lengths > 0
    ends = np.where(nonempty, seqs.timestamps[np.maximum(seqs.offsets[1:] - 1, 0)], np.iinfo(np.int64).min)
    cutoff = int(ends.max()) - test_days * _DAY
    test = ends > cutoff
    return seqs.select(~test & nonempty), seqs.select(test)


def leave_last_out(seqs: Sequences) -> tuple[Sequences, np.ndarray]:
    """(histories without their last item, [S] the last items). Every sequence needs >= 2 items."""
    lengths = seqs.lengths
    if np.any(lengths < 2):
        bad = int(np.flatnonzero(lengths < 2)[0])
        raise ValueError(f"leave_last_out: sequence {seqs.keys[bad]!r} has {int(lengths[bad])} item(s); needs >= 2")
    last = seqs.offsets[1:] - 1
    keep = np.ones(len(seqs.items), dtype=bool)
    keep[last] = False
    return seqs.keep_items(keep), seqs.items[last]


def prefixes(seqs: Sequences) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every prefix of every sequence with its next item: (sequence [P], prefix end [P], target [P]).

    Prefix p is items[offsets[sequence[p]] : end[p]]; target[p] = items[end[p]]; a sequence of n items
    gives n - 1 prefixes (the every-prefix protocol of GRU4Rec's evaluation).
    """
    n_prefix = np.maximum(seqs.lengths - 1, 0)
    seq = np.repeat(np.arange(len(seqs), dtype=np.int64), n_prefix)
    first_end = np.repeat(seqs.offsets[:-1] + 1, n_prefix)
    step = np.arange(len(seq)) - np.repeat(np.cumsum(n_prefix) - n_prefix, n_prefix)
    end = first_end + step
    return seq, end, seqs.items[end]


def last_n(
    seqs: Sequences, max_len: int, rows: np.ndarray | None = None, ends: np.ndarray | None = None, values: np.ndarray | None = None
) -> np.ndarray:
    """[R, max_len] int64: the last max_len items of each sequence before `ends` (default: its end), left-padded with PAD.

    rows [R] picks sequences (default all); ends [R] are absolute positions into `items`.
    Longer sequences are truncated to their most recent max_len items.
    values [N]: a list feature beside the items (`item_feature`, `Sequences.time_gaps`) to slice and pad
    the same way instead of the items, so its column t describes the item in column t.
    """
    if max_len < 1:
        raise ValueError(f"last_n: max_len must be >= 1, got {max_len}")
    source = seqs.items if values is None else np.asarray(values)
    if len(source) != len(seqs.items):
        raise ValueError(f"last_n: values has {len(source)} entries but the sequences have {len(seqs.items)} items")
    rows = np.arange(len(seqs), dtype=np.int64) if rows is None else rows
    starts = seqs.offsets[rows]
    ends = seqs.offsets[rows + 1] if ends is None else ends
    pos = ends[:, None] - max_len + np.arange(max_len)[None, :]  # [R, max_len] absolute positions
    valid = pos >= starts[:, None]
    return np.where(valid, source[np.where(valid, pos, 0)] if len(source) else PAD, PAD).astype(np.int64)


def item_feature(seqs: Sequences, table: np.ndarray, name: str = "item feature") -> np.ndarray:
    """[N] a per-item attribute (e.g. the category) as a list feature beside the items: table[items].

    table [I + 1] is indexed by the sequences' dense item id (row 0, the padding id, is never read for
    an item). An id outside the table is an error naming it, never a silent default.
    """
    table = np.asarray(table)
    if len(seqs.items) and (int(seqs.items.min()) < 0 or int(seqs.items.max()) >= len(table)):
        bad = int(seqs.items[(seqs.items < 0) | (seqs.items >= len(table))][0])
        raise ValueError(f"item_feature: {name} has {len(table)} rows but the sequences hold item id {bad}")
    return table[seqs.items]


def with_reversed(seqs: Sequences) -> Sequences:
    """Training augmentation: the sequences followed by a reversed copy of each (same keys, items and
    timestamps read backwards). A model then also learns which item came before a run of items. For
    training windows only: a reversed copy is not in time order, so never split or evaluate on it.
    """
    lengths = seqs.lengths
    starts = seqs.offsets[:-1]
    # position k of sequence s reversed: offsets[s + 1] - 1 - (k - offsets[s])
    back = np.repeat(starts + seqs.offsets[1:] - 1, lengths) - np.arange(len(seqs.items))
    offsets = np.concatenate([seqs.offsets, seqs.offsets[1:] + seqs.offsets[-1]]).astype(np.int64)
    return Sequences(
        np.concatenate([seqs.keys, seqs.keys]),
        offsets,
        np.concatenate([seqs.items, seqs.items[back]]),
        np.concatenate([seqs.timestamps, seqs.timestamps[back]]),
    )


def sliding_windows(seqs: Sequences, width: int, stride: int | None = None, values: np.ndarray | None = None) -> np.ndarray:
    """[W, width] training windows covering every sequence, not only its end: windows end at n, n - stride,
    n - 2 * stride, ... (while >= 2 items remain), each the last `width` items before its end, left-padded.

    stride defaults to width - 1 (consecutive windows share one item, so every transition is trained
    once). `last_n(seqs, width)` is the first window of each sequence; long histories add more.
    values [N]: a list feature beside the items (e.g. `seqs.timestamps`) cut into the same windows instead
    of the items, so row r column t is the value of window r's item in column t (padding: 0).
    """
    if width < 2:
        raise ValueError(f"sliding_windows: width must be >= 2, got {width}")
    stride = width - 1 if stride is None else stride
    if stride < 1:
        raise ValueError(f"sliding_windows: stride must be >= 1, got {stride}")
    n = seqs.lengths
    count = np.where(n >= 2, (np.maximum(n, 2) - 2) // stride + 1, 0)  # [S] windows per sequence
    rows = np.repeat(np.arange(len(seqs), dtype=np.int64), count)
    j = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)  # window index inside its sequence
    ends = seqs.offsets[rows] + n[rows] - j * stride
    return last_n(seqs, width, rows=rows, ends=ends, values=values)


def read_yoochoose(path: str | Path) -> pl.DataFrame:
    """A YOOCHOOSE clicks file as prepared for GRU4Rec (`SessionId \\t ItemId \\t Time`, header, optional .gz).

    Returns columns session, item, timestamp (Int64; fractional seconds are floored).
    """
    frame = _read_text(Path(path), separator="\t", has_header=True)
    expected = ["SessionId", "ItemId", "Time"]
    if frame.columns[:3] != expected:
        raise ValueError(f"{path}: header must start with {expected}, got {frame.columns}")
    return _typed(frame.select(session="SessionId", item="ItemId", timestamp="Time"), path, {"session": 1, "item": 2, "timestamp": 3})


def read_movielens(path: str | Path) -> pl.DataFrame:
    """A MovieLens `ratings.dat` (`UserID::MovieID::Rating::Timestamp`, optional .gz) -> user, item, rating, timestamp."""
    path = Path(path)
    raw = _open_bytes(path)
    if b"\t" in raw:
        raise ValueError(f"{path}: a MovieLens ratings file is '::'-separated, found a tab")
    frame = _read_text_bytes(raw.replace(b"::", b"\t"), path, separator="\t", has_header=False)
    if frame.width != 4:
        raise ValueError(f"{path}: expected 4 '::'-separated fields per line, got {frame.width}")
    frame = frame.rename(dict(zip(frame.columns, ["user", "item", "rating", "timestamp"], strict=True)))
    return _typed(frame, path, {"user": 1, "item": 2, "rating": 3, "timestamp": 4})


def _open_bytes(path: Path) -> bytes:
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
        return f.read()


def _read_text(path: Path, separator: str, has_header: bool) -> pl.DataFrame:
    return _read_text_bytes(_open_bytes(path), path, separator, has_header)


def _read_text_bytes(raw: bytes, path: Path, separator: str, has_header: bool) -> pl.DataFrame:
    try:
        return pl.read_csv(io.BytesIO(raw), separator=separator, has_header=has_header, infer_schema=False)
    except pl.exceptions.PolarsError as e:
        raise ValueError(f"{path}: cannot parse as {separator!r}-separated text: {str(e).splitlines()[0]}") from None


def _typed(frame: pl.DataFrame, path: str | Path, columns: dict[str, int]) -> pl.DataFrame:
    """Strings -> Int64 (timestamps through Float64); the first bad value is named with its line and column."""
    out = {}
    for name, col_no in columns.items():
        s = frame[name]
        parsed = s.cast(pl.Float64, strict=False) if name == "timestamp" else s.cast(pl.Int64, strict=False)
        bad = parsed.is_null() | s.is_null()
        if bool(bad.any()):
            row = int(np.flatnonzero(bad.to_numpy())[0])
            header = 1 if "session" in columns else 0  # YOOCHOOSE files have a header line
            raise ValueError(f"{path}:{row + 1 + header}: column {col_no} ({name}) is not a number: {s[row]!r}")
        out[name] = parsed.floor().cast(pl.Int64) if name == "timestamp" else parsed
    return pl.DataFrame(out)
