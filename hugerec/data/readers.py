"""Readers: raw CSV/TSV (plain or gzip) and Parquet files typed by a `Schema`, streamed or converted to shards.

    read("clicks.csv", schema)                          -> (polars frame typed by the schema, SkipReport)
    to_parquet("day_*.tsv.gz", schema, "shards/", csv=CsvOptions(separator="\\t", has_header=False))

Parsing, partitioning and bad-row detection (wrong number of fields, a value that does not parse as
the column's type, a schema column missing from a file) are the preprocessing `Dataset`'s; this
module maps a `Schema` onto it and adds what the schema says beyond Polars types: a CSV header must
name the schema's columns, and HEX columns are parsed to int64. Errors name the file, the line (or
row group and row) and the column; `on_error="skip"` drops bad rows and counts them in the report.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from hugerec.data.preprocess.dataset import CsvOptions, Dataset, Format, read_chunks, read_header
from hugerec.data.preprocess.errors import BadInputError, OnError, RowError, SkipReport
from hugerec.data.schema import Column, Schema, ValueType
from hugerec.data.shards import ShardWriter


def polars_dtype(column: Column) -> pl.DataType:
    """The type a column is read as (HEX is read as text, then parsed)."""
    match column.dtype:
        case ValueType.INT:
            base: pl.DataType = pl.Int64()
        case ValueType.FLOAT:
            base = pl.Float32()
        case ValueType.STRING | ValueType.HEX:
            base = pl.String()
        case None:
            raise AssertionError("Column.dtype is set in __post_init__")
    return pl.List(base) if column.multi_hot else base


def dataset(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    csv: CsvOptions | None = None,
    format: Format | None = None,
) -> Dataset:
    """A preprocessing Dataset reading exactly the schema's columns with the schema's types."""
    multi = [c.name for c in schema.sparse if c.multi_hot]
    ds = Dataset(paths, format=format, schema={c.name: polars_dtype(c) for c in schema.columns}, csv=csv)
    if ds.format is Format.CSV:
        if multi:
            raise ValueError(f"readers: multi-hot columns {multi} cannot be read from CSV; store them in Parquet")
        if ds.csv.has_header:
            for path in ds.paths:
                _check_header(path, ds.csv, schema)
    return ds


def _check_header(path: str, csv: CsvOptions, schema: Schema) -> None:
    header = read_header(path, csv)
    if list(header) != list(schema.names):
        unknown = [n for n in schema.names if n not in header]
        detail = (
            f"schema columns {unknown} are not in it"
            if unknown
            else f"the order differs from the schema's {list(schema.names)}"
        )
        raise ValueError(f"{path}: header {header} does not match the schema: {detail}")


def _parse_hex(
    frame: pl.DataFrame, schema: Schema, path: str, first_row: int, line_base: int | None, on_error: OnError
) -> tuple[pl.DataFrame, SkipReport]:
    """HEX columns -> int64; a non-hex value is a bad row (raised, or dropped and counted)."""
    hex_cols = [c.name for c in schema.columns if c.dtype is ValueType.HEX]
    if not hex_cols or frame.height == 0:
        return frame, SkipReport()
    parsed = frame.with_columns(pl.col(hex_cols).str.to_integer(base=16, strict=False))
    bad = np.zeros(frame.height, bool)
    examples: list[RowError] = []
    for name in hex_cols:
        failed = (parsed[name].is_null() & frame[name].is_not_null()).to_numpy()
        if not failed.any():
            continue
        for row in np.flatnonzero(failed)[:3]:
            at = first_row + int(row)
            examples.append(
                RowError(
                    path,
                    "not a hexadecimal number",
                    line=None if line_base is None else line_base + at,
                    row=None if line_base is not None else at,
                    column=name,
                    value=str(frame[name][int(row)]),
                )
            )
            if on_error is OnError.RAISE:
                raise BadInputError(examples[0])
        bad |= failed
    if not bad.any():
        return parsed, SkipReport()
    return parsed.filter(pl.Series(~bad)), SkipReport(0, int(bad.sum()), tuple(examples))


def iter_frames(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    csv: CsvOptions | None = None,
    on_error: OnError | str = OnError.RAISE,
    block_bytes: int = 32 << 20,
) -> Iterator[tuple[pl.DataFrame, SkipReport]]:
    """Streams (frame, report of this frame's skipped rows) with bounded memory (one block or row group)."""
    mode = OnError(on_error)
    ds = dataset(paths, schema, csv)
    for partition in ds.partitions():
        # Line numbers for HEX errors are exact when the partition starts a file and no row before was dropped.
        line_base = partition.first_line if ds.format is Format.CSV else None
        for chunk in read_chunks(partition, mode, block_bytes):
            base = line_base if chunk.report.rows_skipped == 0 else None
            frame, hex_report = _parse_hex(chunk.frame, schema, partition.path, chunk.row_offset, base, mode)
            yield frame, chunk.report.merge(hex_report)
            if chunk.report.rows_skipped or hex_report.rows_skipped:
                line_base = None


def read(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    csv: CsvOptions | None = None,
    on_error: OnError | str = OnError.RAISE,
) -> tuple[pl.DataFrame, SkipReport]:
    """The whole input as one frame (for inputs that fit in memory) and what was skipped."""
    frames, report = [], SkipReport()
    for frame, part in iter_frames(paths, schema, csv, on_error):
        frames.append(frame)
        report = report.merge(part)
    return pl.concat(frames) if frames else pl.DataFrame(
        schema={c.name: polars_dtype(c) for c in schema.columns}
    ), report


@dataclass(frozen=True)
class ConvertReport:
    paths: list[Path]
    num_rows: int
    skipped: SkipReport


def to_parquet(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    out_dir: str | Path,
    csv: CsvOptions | None = None,
    on_error: OnError | str = OnError.RAISE,
    rows_per_file: int = 1 << 20,
    row_group_rows: int = 1 << 16,
    compression: str = "snappy",
) -> ConvertReport:
    """Streams the input into Parquet shards (ShardWriter layout) and writes `schema.json` beside them.

    The shards keep raw values (nulls included, HEX parsed to int64); fit a preprocessing Workflow on
    them to get trainable ids and dense values.
    """
    report = SkipReport()
    with ShardWriter(out_dir, rows_per_file, row_group_rows, compression) as writer:
        for frame, part in iter_frames(paths, schema, csv, on_error):
            report = report.merge(part)
            if frame.height:
                writer.write(frame.to_arrow())
    stored = Schema(
        tuple(
            Column(c.name, c.kind, ValueType.INT, c.cardinality, c.multi_hot, c.table)
            if c.dtype is ValueType.HEX
            else c
            for c in schema.columns
        )
    )
    stored.save(Path(out_dir) / "schema.json")
    return ConvertReport(writer.paths, writer.num_rows, report)
