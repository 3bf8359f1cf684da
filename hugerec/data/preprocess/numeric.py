"""Numeric ops: FillMissing, Clip, LogOp, Normalize, Bucketize (each on the columns it names, in place).

Nulls pass through every op except FillMissing (which removes them) and Bucketize (which gives them
id 0), so a chain like FillMissing -> LogOp -> Normalize decides explicitly what missing means.
For float columns NaN counts as missing wherever null does.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from hugerec.data.preprocess.op import InPlaceOp, as_columns, require_numeric, require_scalar
from hugerec.data.preprocess.stats import Stats, merge_moments, moments, moments_of


def _missing(c: str, dtype: pl.DataType) -> pl.Expr:
    return pl.col(c).is_null() | pl.col(c).is_nan() if dtype.is_float() else pl.col(c).is_null()


class FillStrategy(enum.Enum):
    CONSTANT = "constant"  # `value`
    MEAN = "mean"  # the column's mean over the whole dataset (fitted)


@dataclass(frozen=True)
class FillMissing:
    """Replace null (and NaN) with a constant or the fitted mean; optionally add `<column>_missing`
    (Boolean) recording where values were missing. Integer columns stay integer when the fill value
    is integral, and become Float64 otherwise (always for MEAN)."""

    columns: tuple[str, ...]
    value: float = 0.0
    strategy: FillStrategy = FillStrategy.CONSTANT
    add_indicator: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "FillMissing"))
        object.__setattr__(self, "strategy", FillStrategy(self.strategy))
        if not math.isfinite(self.value):
            raise ValueError(f"FillMissing: value must be finite, got {self.value}")

    @property
    def stateful(self) -> bool:
        return self.strategy is FillStrategy.MEAN

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        indicators = tuple(f"{c}_missing" for c in self.columns) if self.add_indicator else ()
        return self.columns + indicators

    def fit(self, frame: pl.DataFrame) -> Stats:
        require_numeric(frame, self.columns, "FillMissing")
        return {"moments": moments(frame, self.columns)}

    def merge(self, parts: Sequence[Stats]) -> Stats:
        return {"moments": merge_moments([p["moments"] for p in parts])}

    def finalize(self, stats: Stats) -> Stats:
        return stats

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "FillMissing")
        exprs = []
        for c in self.columns:
            dtype = frame.schema[c]
            fill = moments_of(stats["moments"], c)[1] if self.strategy is FillStrategy.MEAN else self.value
            keep_int = (dtype.is_integer() or dtype == pl.Boolean) and self.strategy is FillStrategy.CONSTANT
            target = dtype if (dtype.is_float() or (keep_int and float(fill).is_integer())) else pl.Float64()
            col = pl.col(c).cast(target)
            filled = pl.when(_missing(c, dtype)).then(pl.lit(fill).cast(target)).otherwise(col)
            exprs.append(filled.alias(c))
            if self.add_indicator:
                exprs.append(_missing(c, dtype).alias(f"{c}_missing"))
        return frame.with_columns(exprs)


@dataclass(frozen=True)
class Clip(InPlaceOp):
    """Clamp to [min_value, max_value] (either may be None). Integer columns stay integer when the
    bounds are integral."""

    columns: tuple[str, ...]
    min_value: float | None = None
    max_value: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "Clip"))
        if self.min_value is None and self.max_value is None:
            raise ValueError("Clip: give min_value, max_value or both")
        if self.min_value is not None and self.max_value is not None and self.min_value > self.max_value:
            raise ValueError(f"Clip: min_value {self.min_value} > max_value {self.max_value}")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "Clip")
        bounds = [b for b in (self.min_value, self.max_value) if b is not None]
        exprs = []
        for c in self.columns:
            dtype = frame.schema[c]
            target = dtype if dtype.is_float() or all(float(b).is_integer() for b in bounds) else pl.Float64()
            exprs.append(pl.col(c).cast(target).clip(self.min_value, self.max_value).alias(c))
        return frame.with_columns(exprs)


@dataclass(frozen=True)
class LogOp(InPlaceOp):
    """x -> log1p(max(x, 0)) as Float32 (heavy-tailed counts such as Criteo's integer features)."""

    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "LogOp"))

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "LogOp")
        return frame.with_columns(
            [pl.col(c).cast(pl.Float64).clip(lower_bound=0.0).log1p().cast(pl.Float32).alias(c) for c in self.columns]
        )


@dataclass(frozen=True)
class Normalize:
    """x -> (x - mean) / std as Float32, with the mean and population std of the non-missing values
    over the whole dataset (std 0 -> divide by 1)."""

    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "Normalize"))

    @property
    def stateful(self) -> bool:
        return True

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return self.columns

    def fit(self, frame: pl.DataFrame) -> Stats:
        require_numeric(frame, self.columns, "Normalize")
        return {"moments": moments(frame, self.columns)}

    def merge(self, parts: Sequence[Stats]) -> Stats:
        return {"moments": merge_moments([p["moments"] for p in parts])}

    def finalize(self, stats: Stats) -> Stats:
        return stats

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "Normalize")
        exprs = []
        for c in self.columns:
            _, mean, std = moments_of(stats["moments"], c)
            scale = std if std > 0 else 1.0
            exprs.append(((pl.col(c).cast(pl.Float64) - mean) / scale).cast(pl.Float32).alias(c))
        return frame.with_columns(exprs)


@dataclass(frozen=True)
class Bucketize:
    """x -> bucket id by fixed, strictly increasing boundaries b[0] < ... < b[n-1]:

        0               null or NaN
        1               x < b[0]
        i + 1           b[i-1] <= x < b[i]
        n + 1           x >= b[n-1]

    cardinality = n + 2 (Int64 output, usable as a categorical feature).
    """

    columns: tuple[str, ...]
    boundaries: tuple[float, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "Bucketize"))
        bounds = tuple(float(b) for b in self.boundaries)
        if not bounds:
            raise ValueError("Bucketize: boundaries must not be empty")
        if any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
            raise ValueError(f"Bucketize: boundaries must be finite and strictly increasing, got {bounds}")
        object.__setattr__(self, "boundaries", bounds)

    @property
    def stateful(self) -> bool:
        return False

    @property
    def cardinality(self) -> int:
        return len(self.boundaries) + 2

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return self.columns

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "Bucketize")
        require_scalar(frame, self.columns, "Bucketize")
        bounds = np.asarray(self.boundaries)
        out = []
        for c in self.columns:
            x = frame[c].cast(pl.Float64).fill_null(float("nan")).to_numpy()
            ids = np.searchsorted(bounds, x, side="right").astype(np.int64) + 1
            ids[np.isnan(x)] = 0
            out.append(pl.Series(c, ids, dtype=pl.Int64))
        return frame.with_columns(out)


@dataclass(frozen=True)
class Binarize(InPlaceOp):
    """x -> 1.0 when x >= threshold else 0.0 (Float32), null stays null: a rating turned into a
    click-style label (MovieLens: rating >= 4 is a positive)."""

    columns: tuple[str, ...]
    threshold: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "Binarize"))
        if not math.isfinite(self.threshold):
            raise ValueError(f"Binarize: threshold must be finite, got {self.threshold}")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_numeric(frame, self.columns, "Binarize")
        return frame.with_columns((pl.col(c) >= self.threshold).cast(pl.Float32).alias(c) for c in self.columns)
