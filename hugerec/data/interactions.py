"""Implicit-feedback interaction logs: reading, id mapping, per-user histories, splits and training examples.

    raw = read_interactions("ratings.dat", separator="::", columns=("user", "item", "rating", "timestamp"))
    data, vocab = categorify(raw)                 # user/item ids -> 0..U-1 / 0..I-1, frame sorted by (user, time)
    train, test = leave_last_out(data)            # each user's last event (by timestamp) is held out
    for users, items, history in iter_examples(train, batch_size=1024, max_history=50, seed=0): ...

An `Interactions` frame always has int64 columns `user`, `item`, `timestamp` (any further columns ride
along) and is sorted by (user, timestamp, original row order): a user's rows are their history in time
order, so histories and splits are slices of one sorted array, all vectorised (polars / numpy).
"""

from __future__ import annotations

import gzip
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from hugerec.data.preprocess.dataset import CsvOptions, Dataset, read_partition
from hugerec.data.preprocess.errors import OnError
from hugerec.data.readers import polars_dtype
from hugerec.data.schema import Column, ColumnKind, ValueType
from hugerec.sparse.jagged import JaggedTensor

_REQUIRED = ("user", "item", "timestamp")


@dataclass(frozen=True)
class Interactions:
    """An interaction log with dense ids: `user` in 0..num_users-1, `item` in 0..num_items-1.

    frame      polars frame, int64 columns user, item, timestamp (+ extra columns), sorted by (user, timestamp)
    num_users  U: size of the user id space (users without rows are allowed)
    num_items  I: size of the item id space (the catalogue)
    """

    frame: pl.DataFrame
    num_users: int
    num_items: int

    def __post_init__(self) -> None:
        missing = [c for c in _REQUIRED if c not in self.frame.columns]
        if missing:
            raise ValueError(f"Interactions: frame lacks columns {missing}; has {self.frame.columns}")
        for c in _REQUIRED:
            if self.frame[c].dtype != pl.Int64:
                raise ValueError(f"Interactions: column {c!r} must be Int64, got {self.frame[c].dtype}")
            if self.frame[c].null_count():
                raise ValueError(f"Interactions: column {c!r} has {self.frame[c].null_count()} nulls")
        for c, n in (("user", self.num_users), ("item", self.num_items)):
            ids = self.frame[c].to_numpy()
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n):
                raise ValueError(f"Interactions: {c} ids must be in 0..{n - 1}, got range {int(ids.min())}..{int(ids.max())}")
        u, t = self.frame["user"].to_numpy(), self.frame["timestamp"].to_numpy()
        if np.any((u[1:] < u[:-1]) | ((u[1:] == u[:-1]) & (t[1:] < t[:-1]))):
            object.__setattr__(self, "frame", self.frame.sort(["user", "timestamp"], maintain_order=True))

    @property
    def num_events(self) -> int:
        return self.frame.height

    def users(self) -> np.ndarray:
        return self.frame["user"].to_numpy()

    def items(self) -> np.ndarray:
        return self.frame["item"].to_numpy()

    def user_offsets(self) -> np.ndarray:
        """[U + 1] int64: user u's rows are frame[offsets[u]:offsets[u+1]] (in time order)."""
        counts = np.bincount(self.users(), minlength=self.num_users)
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def item_counts(self) -> np.ndarray:
        """[I] int64 number of events per item."""
        return np.bincount(self.items(), minlength=self.num_items).astype(np.int64)

    def with_frame(self, frame: pl.DataFrame) -> Interactions:
        return Interactions(frame, self.num_users, self.num_items)


@dataclass(frozen=True)
class Vocabulary:
    """The raw ids behind the dense ones: users[u] is the raw id of user u (likewise items)."""

    users: np.ndarray
    items: np.ndarray


def read_interactions(
    paths: str | Path | Sequence[str | Path],
    columns: Sequence[str] = ("user", "item", "timestamp"),
    separator: str = ",",
    has_header: bool = False,
    types: dict[str, ValueType] | None = None,
) -> pl.DataFrame:
    """Raw interactions from Parquet or delimited text (plain or .gz); `columns` names the fields in file order.

    Single-byte separators go through the preprocessing Dataset (errors name file, line and column);
    multi-byte separators such as MovieLens' `::` are split in polars and checked the same way.
    Columns default to INT (user/item ids may be STRING, then `categorify` maps them).
    """
    types = types or {}
    cols = [Column(c, ColumnKind.SPARSE, types.get(c, ValueType.INT)) for c in columns]
    path_list = [paths] if isinstance(paths, str | Path) else list(paths)
    if len(separator.encode()) == 1 or str(path_list[0]).endswith(".parquet"):
        ds = Dataset(path_list, schema={c.name: polars_dtype(c) for c in cols}, csv=CsvOptions(separator=separator, has_header=has_header))
        frames = [read_partition(p, OnError.RAISE)[0] for p in ds.partitions()]
        return pl.concat(frames) if frames else pl.DataFrame(schema={c.name: polars_dtype(c) for c in cols})
    return pl.concat([_read_multibyte(Path(p), cols, separator, has_header) for p in path_list])


def _read_multibyte(path: Path, columns: list[Column], separator: str, has_header: bool) -> pl.DataFrame:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = pl.Series("line", f.read().splitlines())
    first = 1 if has_header else 0
    lines = lines[first:]
    parts = lines.str.split(separator)
    n_fields = parts.list.len()
    names = [c.name for c in columns]
    bad = (n_fields != len(names)).arg_true()
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"{path}: line {i + 1 + first}: {int(n_fields[i])} fields, expected {len(names)} ({names}) "
            f"separated by {separator!r}"
        )
    out = {}
    for j, col in enumerate(columns):
        raw = parts.list.get(j)
        dtype = pl.Int64 if col.dtype is ValueType.INT else pl.Float32 if col.dtype is ValueType.FLOAT else pl.String
        typed = raw.cast(dtype, strict=False)
        failed = (typed.is_null() & raw.is_not_null()).arg_true()
        if len(failed):
            i = int(failed[0])
            raise ValueError(
                f"{path}: line {i + 1 + first}, column {col.name!r}: {raw[i]!r} is not a valid {col.dtype.value}"  # type: ignore[union-attr]  # dtype set in Column.__post_init__
            )
        out[col.name] = typed
    return pl.DataFrame(out)


def categorify(raw: pl.DataFrame, min_item_count: int = 1) -> tuple[Interactions, Vocabulary]:
    """Dense ids for raw user/item ids (sorted raw order, so the mapping is deterministic) and the time order.

    Items seen fewer than `min_item_count` times are dropped (their rows counted out explicitly:
    the returned frame's height says how many rows remain). `timestamp` must be an integer column.
    """
    missing = [c for c in _REQUIRED if c not in raw.columns]
    if missing:
        raise ValueError(f"categorify: raw frame lacks columns {missing}; has {raw.columns}")
    if min_item_count > 1:
        raw = raw.filter(pl.len().over("item") >= min_item_count)
    users = raw["user"].unique().sort()
    items = raw["item"].unique().sort()
    frame = raw.with_columns(
        pl.col("user").replace_strict(users, pl.int_range(len(users), eager=True), return_dtype=pl.Int64),
        pl.col("item").replace_strict(items, pl.int_range(len(items), eager=True), return_dtype=pl.Int64),
        pl.col("timestamp").cast(pl.Int64, strict=True),
    ).sort(["user", "timestamp"], maintain_order=True)
    return Interactions(frame, len(users), len(items)), Vocabulary(users.to_numpy(), items.to_numpy())


def time_windows(data: Interactions, seconds: int) -> list[Interactions]:
    """The events in windows of `seconds` (aligned to the epoch, as data.windows.Windows), numbered from the one
    holding the earliest event: window k = [start + k * seconds, start + (k + 1) * seconds) with start =
    floor(earliest / seconds) * seconds, up to the one holding the latest event. Windows between them without
    events are empty; each keeps the log's id spaces. [] for a log without events."""
    if seconds < 1:
        raise ValueError(f"time_windows: seconds must be >= 1, got {seconds}")
    if data.num_events == 0:
        return []
    index = data.frame["timestamp"].to_numpy() // seconds  # [N] epoch window of each event
    index -= index.min()
    count = int(index.max()) + 1
    tagged = data.frame.with_columns(pl.Series("_window", index))
    parts = {int(k[0]): part.drop("_window") for k, part in tagged.partition_by("_window", as_dict=True, maintain_order=True).items()}
    empty = data.frame.clear()
    return [data.with_frame(parts.get(k, empty)) for k in range(count)]


def leave_last_out(data: Interactions, n: int = 1) -> tuple[Interactions, Interactions]:
    """Per user, the last `n` events by timestamp (ties: later row) go to the second part.

    Users with <= n events keep all of them in the first part (nothing to learn from otherwise).
    """
    if n < 1:
        raise ValueError(f"leave_last_out: n must be >= 1, got {n}")
    f = data.frame.with_columns(
        pl.int_range(pl.len()).over("user").alias("_pos"), pl.len().over("user").alias("_len")
    )
    held = (f["_len"] > n) & (f["_pos"] >= f["_len"] - n)
    drop = ["_pos", "_len"]
    return data.with_frame(f.filter(~held).drop(drop)), data.with_frame(f.filter(held).drop(drop))


def time_split(data: Interactions, cutoff: int | None = None, fraction: float | None = None) -> tuple[Interactions, Interactions]:
    """Global time split: events with timestamp < cutoff train, the rest test.

    Give `cutoff`, or `fraction` (the cutoff is the timestamp quantile so ~fraction of events train).
    """
    if (cutoff is None) == (fraction is None):
        raise ValueError("time_split: give exactly one of cutoff and fraction")
    if fraction is not None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"time_split: fraction must be in (0, 1), got {fraction}")
        cutoff = int(np.quantile(data.frame["timestamp"].to_numpy(), fraction, method="higher"))
    t = pl.col("timestamp")
    return data.with_frame(data.frame.filter(t < cutoff)), data.with_frame(data.frame.filter(t >= cutoff))


def histories(data: Interactions) -> tuple[np.ndarray, np.ndarray]:
    """Per-user time-ordered item lists as CSR: (offsets [U + 1], items [N]); user u: items[offsets[u]:offsets[u+1]]."""
    return data.user_offsets(), data.items().astype(np.int64)


def last_items(offsets: np.ndarray, items: np.ndarray, users: np.ndarray, max_len: int, end: np.ndarray | None = None) -> JaggedTensor:
    """For each of the B `users`, their last `max_len` items before position `end` (default: the whole history).

    offsets/items: CSR from `histories`; end [B]: absolute positions in `items` (exclusive).
    Returns JaggedTensor values [N] item ids, oldest first, lengths [B] (0 for an empty history).
    """
    start = offsets[users]
    stop = offsets[users + 1] if end is None else end
    begin = np.maximum(start, stop - max_len)
    lengths = (stop - begin).astype(np.int64)
    # [B] ranges -> [N] positions: begin repeated per id plus the id's index inside its range
    first = np.repeat(begin - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    pos = first + np.arange(int(lengths.sum()))
    return JaggedTensor(torch.from_numpy(items[pos].astype(np.int64)), torch.from_numpy(lengths))


def iter_examples(
    train: Interactions, batch_size: int, max_history: int, seed: int, drop_last: bool = False
) -> Iterator[tuple[torch.Tensor, torch.Tensor, JaggedTensor]]:
    """One epoch of (users [B], target items [B], history) in a seeded random order.

    Every event is a target; its history is the user's previous `max_history` events (the ListSlice of
    the time-ordered list ending just before it), so nothing from the future leaks into an example.
    """
    if batch_size < 1 or max_history < 0:
        raise ValueError(f"iter_examples: batch_size must be >= 1 and max_history >= 0, got {batch_size}, {max_history}")
    offsets, items = histories(train)
    users = train.users()
    order = np.random.default_rng(seed).permutation(train.num_events)
    n_batches = len(order) // batch_size if drop_last else -(-len(order) // batch_size)
    for b in range(n_batches):
        rows = order[b * batch_size : (b + 1) * batch_size]
        u = users[rows]
        hist = last_items(offsets, items, u, max_history, end=rows)
        yield torch.from_numpy(u), torch.from_numpy(items[rows]), hist


def held_out_csr(test: Interactions) -> tuple[np.ndarray, np.ndarray]:
    """The test part's items per user as CSR (offsets [U + 1], items [N]), each user's items deduplicated, in the
    order they first occur (the frame's, sorted by (user, timestamp))."""
    if test.num_users * test.num_items >= 1 << 63:  # the (user, item) key below would overflow int64
        f = test.frame.select("user", "item").unique(maintain_order=True).sort("user", maintain_order=True)
        users, items = f["user"].to_numpy(), f["item"].to_numpy()
    else:  # each pair's first row, by one integer key: a single-threaded sort instead of a polars hash and sort
        users, items = test.users(), test.items()
        _, first = np.unique(users * test.num_items + items, return_index=True)
        first.sort()  # the rows in frame order, so grouped by user with each user's items as they first occur
        users, items = users[first], items[first]
    counts = np.bincount(users, minlength=test.num_users)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), items.astype(np.int64)


def full_ranking(
    train: Interactions, held_out: Interactions, max_history: int
) -> tuple[torch.Tensor, JaggedTensor, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """What a retrieval model is validated or tested on, as `training.RetrievalValidation(*...)` takes it:
    every user [U], their last `max_history` events of `train` (the query), their `held_out` items to
    find (CSR) and their `train` items, which are never ranked (CSR)."""
    seen = histories(train)
    users = torch.arange(train.num_users)
    return users, last_items(*seen, users.numpy(), max_history), held_out_csr(held_out), seen


def epoch_examples(
    train: Interactions, batch_size: int, max_history: int, seed: int = 0, rank: int = 0, world: int = 1
) -> tuple[Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor, JaggedTensor]]], int]:
    """(make, length) for `training.EpochBatches(make, length)`: epoch e is `iter_examples` seeded by
    seed + e, `length` batches of `batch_size` events. Under torchrun, rank `rank` of `world` gets its
    contiguous rows of each global batch (the first ranks the larger parts, as the trainer gathers
    them), so W ranks train the batches one process would."""
    if not 0 <= rank < world:
        raise ValueError(f"epoch_examples: rank must be in 0..world - 1, got rank {rank} of {world}")

    def make(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, JaggedTensor]]:
        for users, items, history in iter_examples(train, batch_size, max_history, seed=seed + epoch):
            if world == 1:
                yield users, items, history
                continue
            n = users.numel()
            start, stop = n * rank // world, n * (rank + 1) // world
            offsets = history.offsets()
            values = history.values[int(offsets[start]) : int(offsets[stop])]
            yield users[start:stop], items[start:stop], JaggedTensor(values, history.lengths[start:stop])

    return make, -(-train.num_events // batch_size)
