"""Categorical ops: values -> contiguous integer ids (Categorify), hashed ids (HashBucket, HashedCross).

Every output id column is Int64 in [0, cardinality); id 0 is always "missing" (null). List columns
(multi-hot) are encoded element by element, keeping the lists' shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl
import pyarrow as pa

from hugerec.data.preprocess.hashing import combine_hashes, flatten, hash_flat, hash_series
from hugerec.data.preprocess.op import InPlaceOp, as_columns, require_scalar
from hugerec.data.preprocess.packed import count, pack, unpack
from hugerec.data.preprocess.stats import Stats, collect_by_name, merge_counts
from hugerec.data.preprocess.value_index import index_of

NULL_ID = 0
OOV_ID = 1
FIRST_VOCAB_ID = 2
PACKED = "packed"  # partial counts of short strings: their packed values (hugerec.data.preprocess.packed)


def map_elements(series: pl.Series, fn: Callable[[pl.Series], npt.NDArray[np.int64]]) -> pl.Series:
    """Apply an id mapping ([R] values -> [R] int64 ids) to a scalar column, or to each element of a
    list column (null lists stay null, empty lists stay empty)."""
    if not isinstance(series.dtype, pl.List):
        return pl.Series(series.name, fn(series), dtype=pl.Int64)
    lists = series.rechunk().to_arrow()
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lists = lists.cast(pa.large_list(lists.type.value_type))
    offsets = lists.offsets.to_numpy()  # [R + 1], relative to the unsliced child
    flat = lists.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    ids = fn(pl.Series(series.name, flat))  # [N]
    rebuilt = pa.LargeListArray.from_arrays(
        pa.array(offsets - offsets[0], type=pa.int64()), pa.array(ids, type=pa.int64()), mask=lists.is_null()
    )
    return pl.Series(series.name, rebuilt)


def flat_values(series: pl.Series) -> pl.Series:
    """The elements of a list column (the column itself when scalar)."""
    if isinstance(series.dtype, pl.List):
        return series.explode(empty_as_null=False, keep_nulls=False)
    return series


def value_counts(values: pl.Series) -> pl.DataFrame:
    """Partial counts of the non-null values, in no particular order: (packed UInt64, count) when they
    are strings of up to 8 bytes (Criteo's categoricals; counted by a hash-table kernel and kept as
    integers until `finalize`), else (value, count)."""
    if values.dtype == pl.String:
        flat = flatten(values)
        words = pack(flat)
        if words is not None:
            return _packed_frame(*count(words, flat.valid))
    frame = values.drop_nulls().alias("value").value_counts(name="count")
    return frame.with_columns(pl.col("count").cast(pl.Int64))


def _packed_frame(words: npt.NDArray[np.uint64], counts: npt.NDArray[np.int64]) -> pl.DataFrame:
    return pl.DataFrame([pl.Series(PACKED, words, dtype=pl.UInt64), pl.Series("count", counts, dtype=pl.Int64)])


def _as_values(part: pl.DataFrame) -> pl.DataFrame:
    """A partial count frame with its values as values (packed strings unpacked)."""
    if PACKED not in part.columns:
        return part
    return pl.DataFrame([unpack(part[PACKED].to_numpy(), "value"), part["count"]])


def merge_value_counts(parts: Sequence[pl.DataFrame]) -> pl.LazyFrame:
    """Plan summing partial counts per value: packed parts by the counting kernel, others by Polars."""
    frames = [p for p in parts if p.height] or list(parts[:1])
    if all(PACKED in f.columns for f in frames):
        if len(frames) == 1:
            return frames[0].lazy()
        whole = pl.concat(frames)
        words = whole[PACKED].to_numpy()
        return _packed_frame(*count(words, np.ones(len(words), np.bool_), whole["count"].to_numpy())).lazy()
    return merge_counts([_as_values(f) for f in frames], ["value"])


def vocabulary(counts: pl.DataFrame, freq_threshold: int, max_size: int | None) -> pl.LazyFrame:
    """Plan: the (value, count) rows counted at least `freq_threshold` times, most frequent first, ties by
    value (byte order, which for packed strings is the order of their byte-swapped words), at most
    `max_size` of them."""
    if PACKED in counts.columns:
        kept = counts.filter(pl.col("count") >= freq_threshold)
        words, n = kept[PACKED].to_numpy(), kept["count"].to_numpy()
        order = np.lexsort((words.byteswap(), -n))[:max_size]
        return pl.DataFrame([unpack(words[order], "value"), pl.Series("count", n[order], dtype=pl.Int64)]).lazy()
    vocab = counts.lazy().filter(pl.col("count") >= freq_threshold)
    vocab = vocab.sort(["count", "value"], descending=[True, False])
    return vocab.head(max_size) if max_size is not None else vocab


@dataclass(frozen=True)
class Categorify:
    """Values -> ids by frequency, fitted on the whole dataset. Id layout per column (V kept values,
    K = num_tail_buckets):

        0                 null
        1                 out of vocabulary: seen fewer than `freq_threshold` times, beyond `max_size`,
                          or never seen (only when K = 0)
        2 .. V+1          the vocabulary, most frequent first (ties by value)
        V+2 .. V+K+1      with K > 0, every out-of-vocabulary value hashes (stable hash, `seed`) into
                          one of K tail buckets instead of id 1, which then stays unused

    cardinality = 2 + V + K.
    """

    columns: tuple[str, ...]
    freq_threshold: int = 1
    max_size: int | None = None
    num_tail_buckets: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "Categorify"))
        if self.freq_threshold < 1:
            raise ValueError(f"Categorify: freq_threshold must be >= 1, got {self.freq_threshold}")
        if self.max_size is not None and self.max_size < 0:
            raise ValueError(f"Categorify: max_size must be >= 0 or None, got {self.max_size}")
        if self.num_tail_buckets < 0:
            raise ValueError(f"Categorify: num_tail_buckets must be >= 0, got {self.num_tail_buckets}")

    @property
    def stateful(self) -> bool:
        return True

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return self.columns

    def fit(self, frame: pl.DataFrame) -> Stats:
        """Per column: partial counts over list elements or scalar values, nulls dropped (`value_counts`)."""
        return {c: value_counts(flat_values(frame[c])) for c in self.columns}

    def merge(self, parts: Sequence[Stats]) -> Stats:
        return collect_by_name({c: merge_value_counts([p[c] for p in parts]) for c in self.columns})

    def finalize(self, stats: Stats) -> Stats:
        """Per column: the vocabulary (value, count), in id order (id = FIRST_VOCAB_ID + row)."""
        return collect_by_name({c: vocabulary(stats[c], self.freq_threshold, self.max_size) for c in self.columns})

    def cardinality(self, stats: Stats, column: str) -> int:
        return FIRST_VOCAB_ID + stats[column].height + self.num_tail_buckets

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        return frame.with_columns([map_elements(frame[c], self._encoder(stats[c])) for c in self.columns])

    def _encoder(self, vocab: pl.DataFrame) -> Callable[[pl.Series], npt.NDArray[np.int64]]:
        index = index_of(vocab)
        size = vocab.height

        def encode(values: pl.Series) -> npt.NDArray[np.int64]:
            rows = index.lookup(values, null_row=-2)  # [R] vocabulary row; -1 out of vocabulary, -2 null
            ids = np.where(rows >= 0, rows + FIRST_VOCAB_ID, np.where(rows == -2, NULL_ID, OOV_ID))
            if self.num_tail_buckets:
                oov = rows == -1
                tail = hash_series(values, self.seed)[oov] % np.uint64(self.num_tail_buckets)
                ids[oov] = FIRST_VOCAB_ID + size + tail.astype(np.int64)
            return ids

        return encode


@dataclass(frozen=True)
class HashBucket(InPlaceOp):
    """Values -> 1 + stable_hash(value, seed) % num_buckets; null -> 0. cardinality = num_buckets + 1."""

    columns: tuple[str, ...]
    num_buckets: int
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "HashBucket"))
        if self.num_buckets < 1:
            raise ValueError(f"HashBucket: num_buckets must be >= 1, got {self.num_buckets}")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        def encode(values: pl.Series) -> npt.NDArray[np.int64]:
            flat = flatten(values)
            ids = (hash_flat(flat, self.seed) % np.uint64(self.num_buckets)).astype(np.int64) + 1
            ids[~flat.valid] = NULL_ID
            return ids

        return frame.with_columns([map_elements(frame[c], encode) for c in self.columns])


@dataclass(frozen=True)
class HashedCross:
    """A feature cross: the combined stable hash of several columns' values -> [0, num_buckets).

    Nulls take part as their own value (a cross of (a, null) is a category of its own), so every id is
    a real combination. Output column `name` (default: the columns joined by "_x_").
    """

    columns: tuple[str, ...]
    num_buckets: int
    name: str = ""
    seed: int = 0

    def __post_init__(self) -> None:
        columns = as_columns(self.columns, "HashedCross")
        if len(columns) < 2:
            raise ValueError(f"HashedCross: needs at least two columns to cross, got {columns!r}")
        object.__setattr__(self, "columns", columns)
        if self.num_buckets < 1:
            raise ValueError(f"HashedCross: num_buckets must be >= 1, got {self.num_buckets}")
        if not self.name:
            object.__setattr__(self, "name", "_x_".join(columns))

    @property
    def stateful(self) -> bool:
        return False

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return (self.name,)

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_scalar(frame, self.columns, "HashedCross")
        hashes = [hash_series(frame[c], self.seed) for c in self.columns]
        combined = combine_hashes(hashes, self.seed) if frame.height else np.zeros(0, dtype=np.uint64)
        ids = (combined % np.uint64(self.num_buckets)).astype(np.int64)
        return frame.with_columns(pl.Series(self.name, ids, dtype=pl.Int64))
