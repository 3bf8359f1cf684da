"""Time windows over a time column: which rows belong to day (hour, minute) k, read as tables or batches.

A window is [k * length, (k + 1) * length) seconds of the time column (int64 epoch seconds); window k
of days is day k. Reading a window filters Parquet by the column (row groups whose statistics miss
the window are skipped) and orders its rows by time. A window's holdout is a fixed, seeded share of
its rows (the same rows every time it is read): the loop trains on the rest of window k and gates the
candidate on window k + 1's holdout. Preprocessing per window: fit a Workflow on
`polars.from_arrow(windows.select(table, k))` and transform window k + 1 with it (ids born since
then map to Categorify's out-of-vocabulary id).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from hugerec.data.columns import assemble, decode
from hugerec.data.schema import Schema
from hugerec.data.shards import expand_paths
from hugerec.sparse.batch import Batch


class WindowUnit(enum.Enum):
    DAY = "day"
    HOUR = "hour"
    MINUTE = "minute"  # e.g. size 15: a loop that reacts within a quarter of an hour of a concept drift

    @property
    def seconds(self) -> int:
        match self:
            case WindowUnit.DAY:
                return 86400
            case WindowUnit.HOUR:
                return 3600
            case WindowUnit.MINUTE:
                return 60


@dataclass(frozen=True)
class Windows:
    """Windows of `size` units over the int64 seconds column `time_column`."""

    time_column: str = "ts"  # the int64 column of seconds since the epoch
    unit: WindowUnit = WindowUnit.DAY  # "day", "hour" or "minute"
    size: int = 1  # units per window (unit = "minute", size = 15: quarter-hour windows)

    def __post_init__(self) -> None:
        if isinstance(self.unit, str):
            try:
                object.__setattr__(self, "unit", WindowUnit(self.unit))
            except ValueError:
                raise ValueError(f"Windows: unit must be 'day', 'hour' or 'minute', got {self.unit!r}") from None
        if not self.time_column:
            raise ValueError("Windows: time_column must be a column name, got an empty string")
        if self.size < 1:
            raise ValueError(f"Windows: size must be >= 1, got {self.size}")

    @property
    def seconds(self) -> int:
        return self.unit.seconds * self.size

    def index(self, ts: np.ndarray) -> np.ndarray:
        """[n] seconds -> [n] window index."""
        return np.floor_divide(ts, self.seconds)

    def bounds(self, k: int) -> tuple[int, int]:
        """[start, end) seconds of window k."""
        return k * self.seconds, (k + 1) * self.seconds

    def _check(self, table: pa.Table, where: str) -> None:
        if self.time_column not in table.column_names:
            raise ValueError(f"{where}: no time column {self.time_column!r}; columns are {table.column_names}")
        if not pa.types.is_integer(table.schema.field(self.time_column).type):
            raise ValueError(
                f"{where}: time column {self.time_column!r} must hold integer seconds, "
                f"got {table.schema.field(self.time_column).type}"
            )

    def select(self, table: pa.Table, k: int, count: int = 1) -> pa.Table:
        """Rows of windows k..k+count-1 of an in-memory table, ordered by time."""
        self._check(table, "Windows.select")
        lo, hi = self.bounds(k)[0], self.bounds(k + count - 1)[1]
        ts = table[self.time_column]
        picked = table.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
        return picked.sort_by(self.time_column)

    def read(self, paths: str | Path | Sequence[str | Path], k: int, count: int = 1) -> pa.Table:
        """Rows of windows k..k+count-1 from Parquet files (a glob, a directory, files), ordered by time.

        Each file is read with its own columns: a window holds the columns of the files its rows come
        from (a column added in later files is there from the first window of those files on; rows of
        a file without it hold nulls where one window spans both), so a schema change between windows
        reaches the loop (one dataset over all files would keep the first file's columns only)."""
        files = expand_paths(paths)
        lo, hi = self.bounds(k)[0], self.bounds(k + count - 1)[1]
        col = ds.field(self.time_column)
        parts, empty = [], None
        for path in files:
            dataset = ds.dataset(str(path), format="parquet")
            if self.time_column not in dataset.schema.names:
                raise ValueError(f"Windows.read: {path} has no time column {self.time_column!r}")
            part = dataset.to_table(filter=(col >= lo) & (col < hi))
            if part.num_rows:
                parts.append(part)
            elif empty is None:
                empty = part
        if not parts:
            assert empty is not None  # expand_paths gives at least one file
            return empty
        return pa.concat_tables(parts, promote_options="permissive").sort_by(self.time_column)

    def present(self, paths: str | Path | Sequence[str | Path]) -> list[int]:
        """The indices of the windows that hold at least one row, ascending."""
        dataset = ds.dataset([str(p) for p in expand_paths(paths)], format="parquet")
        ts = dataset.to_table(columns=[self.time_column])[self.time_column].to_numpy()
        return [int(k) for k in np.unique(self.index(ts))]


def holdout_mask(n: int, share: float, seed: int) -> np.ndarray:
    """[n] bool: a fixed `share` of the rows (seeded), the window's holdout."""
    if not 0 < share < 1:
        raise ValueError(f"holdout_mask: share must be in (0, 1), got {share}")
    return np.random.default_rng([seed, n, 0x401D]).random(n) < share


def split_holdout(table: pa.Table, share: float, seed: int) -> tuple[pa.Table, pa.Table]:
    """(training rows, holdout rows) of a window."""
    mask = holdout_mask(table.num_rows, share, seed)
    return table.filter(pa.array(~mask)), table.filter(pa.array(mask))


def table_batches(
    table: pa.Table, schema: Schema, batch_size: int, shuffle: bool = False, seed: int = 0
) -> list[Batch]:
    """An in-memory table (one window) as Batches of `schema`'s columns (shuffled rows when asked)."""
    if batch_size < 1:
        raise ValueError(f"table_batches: batch_size must be >= 1, got {batch_size}")
    missing = [c for c in schema.names if c not in table.column_names]
    if missing:
        raise ValueError(f"table_batches: the window lacks columns {missing} of the schema")
    order = np.random.default_rng(seed).permutation(table.num_rows) if shuffle else None
    cols = decode(table.select(list(schema.names)), schema, order)
    keys = schema.sparse_names
    return [
        assemble([(cols, s, min(s + batch_size, table.num_rows))], keys) for s in range(0, table.num_rows, batch_size)
    ]
