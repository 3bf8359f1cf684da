"""What every preprocessing op provides, and the column-selection helpers their configs share.

An op is a frozen dataclass (its config, JSON-able); its fitted statistics are plain data (`Stats`,
named Polars frames) kept beside it by the Workflow, never inside it. Stateful ops gather partial
statistics per chunk (`fit`), combine them associatively (`merge`), and turn the merged whole into
what `transform` uses (`finalize`), so a fit is a map-reduce over partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import polars as pl

from hugerec.data.preprocess.stats import Stats

# Present only while fitting and in out-of-fold transforms of the training data: a stable id per row
# (partition << 40 | row in partition) from which TargetEncoding draws the row's fold.
ROW_ID = "__hugerec_row_id"


class Op(Protocol):
    @property
    def stateful(self) -> bool: ...

    def reads(self) -> tuple[str, ...]: ...

    def writes(self) -> tuple[str, ...]: ...

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame: ...


class FittableOp(Op, Protocol):
    def fit(self, frame: pl.DataFrame) -> Stats: ...

    def merge(self, parts: Sequence[Stats]) -> Stats: ...

    def finalize(self, stats: Stats) -> Stats: ...


class InPlaceOp:
    """Base of the stateless ops that rewrite their own `columns` in place: nothing to fit, and the
    columns read are the columns written (Clip, LogOp, HashBucket, SplitList, ParseTime, ...)."""

    columns: tuple[str, ...]

    @property
    def stateful(self) -> bool:
        return False

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return self.columns


def as_columns(value: str | Sequence[str], op: str, what: str = "columns") -> tuple[str, ...]:
    """Normalize a column selection (one name or several) to a non-empty tuple of distinct names."""
    columns = (value,) if isinstance(value, str) else tuple(value)
    if not columns:
        raise ValueError(f"{op}: {what} must name at least one column")
    if not all(isinstance(c, str) and c for c in columns):
        raise ValueError(f"{op}: {what} must be non-empty strings, got {columns!r}")
    if len(set(columns)) != len(columns):
        raise ValueError(f"{op}: {what} has duplicates: {columns!r}")
    return columns


def require_numeric(frame: pl.DataFrame, columns: Sequence[str], op: str) -> None:
    for c in columns:
        dtype = frame.schema[c]
        if not (dtype.is_numeric() or dtype == pl.Boolean):
            raise ValueError(f"{op}: column {c!r} has dtype {dtype}, expected a numeric column")


def require_scalar(frame: pl.DataFrame, columns: Sequence[str], op: str) -> None:
    for c in columns:
        if isinstance(frame.schema[c], pl.List | pl.Array):
            raise ValueError(f"{op}: column {c!r} is a list column ({frame.schema[c]}); {op} takes scalar columns")
