"""The Criteo Display Advertising Challenge (Kaggle) format and its statistics.

label \t I1 .. I13 \t C1 .. C26      40 tab-separated fields, no header, empty field = missing
0     \t 1 \t 1 \t 5 ... \t 68fd1e64 \t 80e26c9b ...
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from hugerec.data import readers
from hugerec.data.preprocess.dataset import CsvOptions
from hugerec.data.preprocess.errors import OnError, SkipReport
from hugerec.data.schema import Schema

NUM_DENSE = 13
NUM_SPARSE = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
SPARSE_NAMES = tuple(f"C{i}" for i in range(1, NUM_SPARSE + 1))

# Distinct values per categorical column over the full Kaggle training set (as used by DLRM).
KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip

# Share of empty fields per column, measured on the first 10,000 Kaggle training rows.
DENSE_MISSING_RATES = (0.448, 0.0, 0.204, 0.198, 0.049, 0.251, 0.049, 0.001, 0.049, 0.448, 0.049, 0.773, 0.198)
SPARSE_MISSING_RATES = (
    0.0, 0.0, 0.036, 0.036, 0.0, 0.133, 0.0, 0.0, 0.0, 0.0, 0.0, 0.036, 0.0,
    0.0, 0.0, 0.036, 0.0, 0.0, 0.45, 0.45, 0.036, 0.818, 0.0, 0.036, 0.45, 0.45,
)  # fmt: skip

# Share of clicks in the Kaggle training set.
POSITIVE_RATE = 0.256

# Tab-separated, no header, no quoting: a quote character in a hash field is data, not a quote.
TSV = CsvOptions(separator="\t", has_header=False, quote_char=None)


def read_criteo(
    paths: str | Path | Sequence[str | Path], on_error: OnError | str = OnError.RAISE
) -> tuple[pl.DataFrame, SkipReport]:
    """Criteo TSV files (plain or .gz) -> frame (label, I1..I13 Int64, C1..C26 Int64 from hex; nulls kept).

    For inputs that fit in memory; `criteo_to_parquet` streams any size.
    """
    return readers.read(paths, Schema.criteo(), TSV, on_error)


def criteo_to_parquet(
    paths: str | Path | Sequence[str | Path],
    out_dir: str | Path,
    on_error: OnError | str = OnError.RAISE,
    rows_per_file: int = 1 << 22,
    row_group_rows: int = 1 << 16,
    compression: str = "snappy",
) -> readers.ConvertReport:
    """Criteo TSV files -> raw Parquet shards + schema.json, streaming (bounded memory)."""
    return readers.to_parquet(
        paths, Schema.criteo(), out_dir, TSV, on_error, rows_per_file, row_group_rows, compression
    )
