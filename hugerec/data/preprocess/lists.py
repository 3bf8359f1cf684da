"""List ops: SplitList (a text field of several values, "Action|Comedy", -> a list column) and
ListSlice (keep part of each list, e.g. the last 50 items of a history)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from hugerec.data.preprocess.op import InPlaceOp, as_columns
from hugerec.data.preprocess.stats import Stats


@dataclass(frozen=True)
class SplitList(InPlaceOp):
    """String columns -> List(String) by `separator`; an empty or null field is an empty list / null.
    Categorify and HashBucket then map each element to an id (a multi-hot feature)."""

    columns: tuple[str, ...]
    separator: str = "|"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "SplitList"))
        if not isinstance(self.separator, str) or not self.separator:
            raise ValueError(f"SplitList: separator must be a non-empty string, got {self.separator!r}")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        for c in self.columns:
            if frame.schema[c] != pl.String:
                raise ValueError(f"SplitList: column {c!r} has dtype {frame.schema[c]}, expected a string column")
        return frame.with_columns(
            pl.when(pl.col(c) == "").then(pl.lit([], pl.List(pl.String))).otherwise(pl.col(c).str.split(self.separator)).alias(c)
            for c in self.columns
        )


@dataclass(frozen=True)
class ListSlice(InPlaceOp):
    """Keep `list[start:end]` of each list (Python slice rules; negative counts from the end):
    ListSlice(["history"], start=-50) keeps the last 50 items."""

    columns: tuple[str, ...]
    start: int = 0
    end: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "ListSlice"))
        if self.end is not None and self.start >= 0 and 0 <= self.end <= self.start:
            raise ValueError(f"ListSlice: end {self.end} must be after start {self.start} (every list would be empty)")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        exprs = []
        for c in self.columns:
            if not isinstance(frame.schema[c], pl.List):
                raise ValueError(f"ListSlice: column {c!r} has dtype {frame.schema[c]}, expected a list column")
            col = pl.col(c)
            n = col.list.len()
            start = pl.lit(self.start) if self.start >= 0 else pl.max_horizontal(n + self.start, pl.lit(0))
            if self.end is None:
                end: pl.Expr = n
            elif self.end >= 0:
                end = pl.min_horizontal(pl.lit(self.end), n)
            else:
                end = pl.max_horizontal(n + self.end, pl.lit(0))
            length = pl.max_horizontal(end - start, pl.lit(0))
            exprs.append(col.list.slice(start, length).alias(c))
        return frame.with_columns(exprs)
