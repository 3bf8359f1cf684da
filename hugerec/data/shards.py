"""Parquet shards: streaming writer with fixed-size row groups, on-disk prebatching, a random train/eval split.

    ShardWriter(out_dir, rows_per_file=4, row_group_rows=2):
      write(3 rows), write(3 rows), close()
      -> part-00000.parquet  row groups [2, 2]
         part-00001.parquet  row groups [2]

    ShardWriter(out_dir, row_group_rows=65536, min_row_groups=8): write(1000 rows), close()
      -> part-00000.parquet  row groups [125] * 8   (smaller than one row group: split in 8)

Row groups are the loader's unit of shuffling and of per-rank sharding (a loader over W ranks needs
at least W of them); aligning them to a multiple of the batch size (`prebatch`) lets the loader cut
every batch out of one row group.
"""

from __future__ import annotations

import glob as globlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


class ShardWriter:
    """Writes a stream of Arrow tables as `{prefix}-NNNNN.parquet` files in `out_dir`.

    Holds at most one row group of rows in memory. Every row group has exactly `row_group_rows`
    rows except the last one of the dataset; every file has `rows_per_file` rows except the last.
    A dataset smaller than one row group is written as `min_row_groups` near-equal row groups
    instead (fewer if it has fewer rows), so that it can still be sharded over that many ranks.
    """

    def __init__(
        self,
        out_dir: str | Path,
        rows_per_file: int = 1 << 20,
        row_group_rows: int = 1 << 16,
        compression: str = "snappy",
        prefix: str = "part",
        min_row_groups: int = 8,
    ) -> None:
        if row_group_rows <= 0 or rows_per_file <= 0 or rows_per_file % row_group_rows:
            raise ValueError(
                f"ShardWriter: rows_per_file ({rows_per_file}) must be a positive multiple of "
                f"row_group_rows ({row_group_rows})"
            )
        if min_row_groups < 1:
            raise ValueError(f"ShardWriter: min_row_groups must be >= 1, got {min_row_groups}")
        self.min_row_groups = min_row_groups
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rows_per_file = rows_per_file
        self.row_group_rows = row_group_rows
        self.compression = compression
        self.prefix = prefix
        self.paths: list[Path] = []
        self.num_rows = 0
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._schema: pa.Schema | None = None

    def write(self, table: pa.Table) -> None:
        if self._schema is None:
            self._schema = table.schema
        elif not table.schema.equals(self._schema):
            raise ValueError(f"ShardWriter: table schema changed from\n{self._schema}\nto\n{table.schema}")
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self.row_group_rows:
            pending = pa.concat_tables(self._pending)
            self._write_group(pending.slice(0, self.row_group_rows))
            rest = pending.slice(self.row_group_rows)
            self._pending = [rest] if rest.num_rows else []
            self._pending_rows = rest.num_rows

    def _write_group(self, group: pa.Table) -> None:
        if self._writer is None:
            path = self.out_dir / f"{self.prefix}-{len(self.paths):05d}.parquet"
            self._writer = pq.ParquetWriter(path, group.schema, compression=self.compression)
            self.paths.append(path)
        self._writer.write_table(group, row_group_size=group.num_rows)
        self._file_rows += group.num_rows
        self.num_rows += group.num_rows
        if self._file_rows >= self.rows_per_file:
            self._writer.close()
            self._writer = None
            self._file_rows = 0

    def close(self) -> list[Path]:
        """Flushes the last (short) row group; returns the files written."""
        if self._pending_rows:
            rest = pa.concat_tables(self._pending)
            # nothing written yet: the whole dataset is this one short group, cut it for sharding
            pieces = min(self.min_row_groups, rest.num_rows) if self.num_rows == 0 else 1
            for k in range(pieces):
                start, end = k * rest.num_rows // pieces, (k + 1) * rest.num_rows // pieces
                self._write_group(rest.slice(start, end - start))
            self._pending, self._pending_rows = [], 0
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        return list(self.paths)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def expand_paths(paths: str | Path | Sequence[str | Path]) -> list[Path]:
    """A glob, a directory (its *.parquet files), a file, or a list of those -> sorted file list."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.parquet"))
        elif any(ch in str(item) for ch in "*?["):
            found = sorted(Path(f) for f in globlib.glob(str(item)))
        else:
            found = [p]
        if not found:
            raise ValueError(f"no Parquet files match {str(item)!r}")
        for f in found:
            if not f.is_file():
                raise ValueError(f"no such file: {f}")
        out.extend(found)
    if not out:
        raise ValueError("no input files given")
    return out


def iter_row_groups(paths: Iterable[Path], columns: Sequence[str] | None = None) -> Iterable[pa.Table]:
    for path in paths:
        pf = pq.ParquetFile(path)
        for i in range(pf.num_row_groups):
            yield pf.read_row_group(i, columns=None if columns is None else list(columns))


def prebatch(
    paths: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    batch_size: int,
    batches_per_row_group: int = 8,
    row_groups_per_file: int = 16,
    compression: str = "snappy",
) -> list[Path]:
    """Rewrites a dataset (streaming) with row groups of exactly `batches_per_row_group * batch_size` rows.

    The Parquet counterpart of TFRecord prebatching: with aligned row groups, an unshuffled loader
    serves every batch as a slice of a single decoded row group.
    """
    if batch_size <= 0 or batches_per_row_group <= 0 or row_groups_per_file <= 0:
        raise ValueError(
            f"prebatch: batch_size, batches_per_row_group, row_groups_per_file must be > 0, got "
            f"{batch_size}, {batches_per_row_group}, {row_groups_per_file}"
        )
    group = batch_size * batches_per_row_group
    with ShardWriter(out_dir, group * row_groups_per_file, group, compression) as writer:
        for table in iter_row_groups(expand_paths(paths)):
            writer.write(table)
    return writer.paths


def count_rows(paths: str | Path | Sequence[str | Path]) -> int:
    """Rows in the Parquet files `paths` names (as expand_paths), from their footers."""
    return sum(pq.read_metadata(f).num_rows for f in expand_paths(paths))


def split_shards(
    paths: str | Path | Sequence[str | Path],
    train_dir: str | Path,
    eval_dir: str | Path,
    eval_fraction: float,
    seed: int = 0,
) -> tuple[int, int]:
    """Stream the rows of `paths` into shards in `train_dir` and `eval_dir`, each row to eval with
    probability `eval_fraction` (independently, from (seed, row group)); returns (train rows, eval rows).
    The same input and seed give the same split."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"split_shards: eval_fraction must be in [0, 1), got {eval_fraction}")
    counts = [0, 0]
    with ShardWriter(train_dir) as train_writer, ShardWriter(eval_dir) as eval_writer:
        for k, table in enumerate(iter_row_groups(expand_paths(paths))):
            held_out = np.random.default_rng([seed, k]).random(table.num_rows) < eval_fraction
            train_writer.write(table.filter(pa.array(~held_out)))
            eval_writer.write(table.filter(pa.array(held_out)))
            counts[1] += int(held_out.sum())
            counts[0] += table.num_rows - int(held_out.sum())
    return counts[0], counts[1]
