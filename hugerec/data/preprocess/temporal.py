"""Time ops: CyclicTime (hour of day, day of week as points on a circle) and DifferenceLag (change
since the previous event of the same group, in time order)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import polars as pl

from hugerec.data.preprocess.op import InPlaceOp, as_columns, require_scalar
from hugerec.data.preprocess.stats import Stats


class TimeFeature(enum.Enum):
    HOUR_OF_DAY = "hour"  # angle 2 pi (hour + minute / 60 + second / 3600) / 24
    DAY_OF_WEEK = "dow"  # angle 2 pi (weekday - 1) / 7, Monday = 0


class TimeUnit(enum.Enum):
    SECONDS = "s"
    MILLISECONDS = "ms"
    MICROSECONDS = "us"


def _as_datetime(frame: pl.DataFrame, column: str, unit: TimeUnit, op: str) -> pl.Expr:
    dtype = frame.schema[column]
    if isinstance(dtype, pl.Datetime):
        return pl.col(column)
    if dtype.is_integer():
        return pl.from_epoch(pl.col(column), time_unit=unit.value)
    raise ValueError(f"{op}: column {column!r} has dtype {dtype}; expected a Datetime or integer epoch column")


@dataclass(frozen=True)
class CyclicTime:
    """Timestamps -> `<column>_<feature>_sin` and `_cos` (Float32) per feature, so that 23:00 lies next
    to 00:00 and Sunday next to Monday. Integer columns are epoch times in `unit` (UTC); Datetime
    columns use their own wall-clock time. Null stays null."""

    columns: tuple[str, ...]
    features: tuple[TimeFeature, ...] = (TimeFeature.HOUR_OF_DAY, TimeFeature.DAY_OF_WEEK)
    unit: TimeUnit = TimeUnit.SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "CyclicTime"))
        features = tuple(TimeFeature(f) for f in self.features)
        if not features or len(set(features)) != len(features):
            raise ValueError(f"CyclicTime: features must be distinct and non-empty, got {self.features!r}")
        object.__setattr__(self, "features", features)
        object.__setattr__(self, "unit", TimeUnit(self.unit))

    @property
    def stateful(self) -> bool:
        return False

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return tuple(f"{c}_{f.value}_{trig}" for c in self.columns for f in self.features for trig in ("sin", "cos"))

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        exprs = []
        for c in self.columns:
            when = _as_datetime(frame, c, self.unit, "CyclicTime")
            for feature in self.features:
                match feature:
                    case TimeFeature.HOUR_OF_DAY:
                        hours = when.dt.hour() + when.dt.minute() / 60.0 + when.dt.second() / 3600.0
                        angle = hours.cast(pl.Float64) * (2 * math.pi / 24)
                    case TimeFeature.DAY_OF_WEEK:
                        angle = (when.dt.weekday() - 1).cast(pl.Float64) * (2 * math.pi / 7)
                exprs.append(angle.sin().cast(pl.Float32).alias(f"{c}_{feature.value}_sin"))
                exprs.append(angle.cos().cast(pl.Float32).alias(f"{c}_{feature.value}_cos"))
        return frame.with_columns(exprs)


@dataclass(frozen=True)
class DifferenceLag:
    """`<column>_lag<s>` = x - (x of the event s steps earlier in the same group), events ordered by
    `sort_by`; negative s looks ahead (`<column>_lead<|s|>`). Null where no such event exists.
    Datetime columns give seconds (Float64). Needs every row of a group in one partition (the
    workflow checks `Dataset.partitioned_by`; `repartition` arranges it)."""

    columns: tuple[str, ...]
    group_by: tuple[str, ...]
    sort_by: str
    shifts: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "DifferenceLag"))
        object.__setattr__(self, "group_by", as_columns(self.group_by, "DifferenceLag", "group_by"))
        shifts = tuple(int(s) for s in self.shifts)
        if not shifts or 0 in shifts or len(set(shifts)) != len(shifts):
            raise ValueError(f"DifferenceLag: shifts must be distinct non-zero integers, got {self.shifts!r}")
        object.__setattr__(self, "shifts", shifts)
        if not self.sort_by:
            raise ValueError("DifferenceLag: sort_by must name the time column")

    @property
    def stateful(self) -> bool:
        return False

    def reads(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.columns, *self.group_by, self.sort_by)))

    def output_name(self, column: str, shift: int) -> str:
        return f"{column}_lag{shift}" if shift > 0 else f"{column}_lead{-shift}"

    def writes(self) -> tuple[str, ...]:
        return tuple(self.output_name(c, s) for c in self.columns for s in self.shifts)

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_scalar(frame, self.reads(), "DifferenceLag")
        exprs = []
        for c in self.columns:
            dtype = frame.schema[c]
            if isinstance(dtype, pl.Datetime):
                x = pl.col(c).dt.epoch("us").cast(pl.Float64) / 1e6
            elif dtype.is_numeric():
                x = pl.col(c)
            else:
                raise ValueError(f"DifferenceLag: column {c!r} has dtype {dtype}; expected numeric or Datetime")
            for s in self.shifts:
                diff = (x - x.shift(s)).over(list(self.group_by), order_by=self.sort_by)
                exprs.append(diff.alias(self.output_name(c, s)))
        return frame.with_columns(exprs)


@dataclass(frozen=True)
class ParseTime(InPlaceOp):
    """Text or epoch timestamps -> Int64 epoch seconds (UTC), what CyclicTime, DifferenceLag and the
    time splits read. format: "unix" (seconds), "unix_ms" (milliseconds), or a strptime format such
    as "%Y-%m-%d %H:%M:%S" or "%Y-%m-%dT%H:%M:%S%.fZ" (naive times are taken as UTC). A value that
    does not match the format is an error naming the column and the value, never a silent null."""

    columns: tuple[str, ...]
    format: str = "unix"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "ParseTime"))
        if not isinstance(self.format, str) or not self.format:
            raise ValueError(f"ParseTime: format must be 'unix', 'unix_ms' or a strptime format, got {self.format!r}")
        if self.format not in ("unix", "unix_ms") and "%" not in self.format:
            raise ValueError(
                f"ParseTime: format {self.format!r} is neither 'unix', 'unix_ms' nor a strptime format (e.g. '%Y-%m-%d')"
            )

    def expression(self, column: str, dtype: pl.DataType) -> pl.Expr:
        """The epoch-seconds expression for one column of `dtype` (also used by the time splits)."""
        col = pl.col(column)
        match self.format:
            case "unix" | "unix_ms" if dtype.is_integer() or dtype.is_float():
                seconds = col if self.format == "unix" else col / 1000
                return seconds.floor().cast(pl.Int64) if dtype.is_float() or self.format == "unix_ms" else col.cast(pl.Int64)
            case "unix" | "unix_ms":
                raise ValueError(f"ParseTime: column {column!r} has dtype {dtype}; format {self.format!r} needs numbers")
            case _:
                if dtype != pl.String:
                    raise ValueError(f"ParseTime: column {column!r} has dtype {dtype}; a strptime format needs text")
                parsed = col.str.strptime(pl.Datetime("us"), self.format, strict=False)
                return parsed.dt.replace_time_zone(None).dt.epoch("s")

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        out = frame.with_columns(self.expression(c, frame.schema[c]).alias(c) for c in self.columns)
        for c in self.columns:
            failed = out[c].is_null() & frame[c].is_not_null()
            if failed.any():
                value = frame[c].filter(failed)[0]
                raise ValueError(f"ParseTime: column {c!r} value {value!r} does not match the time format {self.format!r}")
        return out
