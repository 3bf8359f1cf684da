"""Groupby: rows -> one row per group (session or user), with time-ordered lists for sequence models.

user  time  item          group_by=user, sort_by=time,     user  item_list   item_count
1     20    b        ->   aggregations={item: (LIST,   ->  1     [a, b]      2
1     10    a                          COUNT)}             2     [c]         1
2     15    c
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from hugerec.data.preprocess.op import ROW_ID, as_columns
from hugerec.data.preprocess.stats import Stats


class Agg(enum.Enum):
    LIST = "list"  # all values in time order (the last `max_list_length` when set)
    FIRST = "first"
    LAST = "last"
    COUNT = "count"  # non-null values
    SUM = "sum"
    MEAN = "mean"
    MIN = "min"
    MAX = "max"


AggregationsArg = Mapping[str, Agg | str | Sequence[Agg | str]] | Sequence[tuple[str, Agg | str] | Sequence[str]]


def _as_aggregations(value: AggregationsArg) -> tuple[tuple[str, Agg], ...]:
    pairs: list[tuple[str, Agg]] = []
    items = value.items() if isinstance(value, Mapping) else [(p[0], p[1]) for p in value]
    for column, aggs in items:
        for agg in [aggs] if isinstance(aggs, Agg | str) else aggs:
            pairs.append((str(column), Agg(agg)))
    if not pairs or len(set(pairs)) != len(pairs):
        raise ValueError(f"Groupby: aggregations must be non-empty and distinct, got {value!r}")
    return tuple(pairs)


@dataclass(frozen=True)
class Groupby:
    """One output row per distinct `group_by` value, in first-appearance order after sorting by
    (`group_by`, `sort_by`); each (column, agg) gives `<column>_<agg>`. Replaces all other columns,
    so it must be the workflow's last op. Needs every row of a group in one partition (the workflow
    checks `Dataset.partitioned_by`; `repartition` arranges it)."""

    group_by: tuple[str, ...]
    aggregations: tuple[tuple[str, Agg], ...]
    sort_by: str | None = None
    max_list_length: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_by", as_columns(self.group_by, "Groupby", "group_by"))
        object.__setattr__(self, "aggregations", _as_aggregations(self.aggregations))
        if self.max_list_length is not None and self.max_list_length < 1:
            raise ValueError(f"Groupby: max_list_length must be >= 1 or None, got {self.max_list_length}")
        clash = set(self.outputs()) & set(self.group_by)
        if clash:
            raise ValueError(f"Groupby: output names {sorted(clash)} clash with group_by columns")

    @property
    def stateful(self) -> bool:
        return False

    def outputs(self) -> tuple[str, ...]:
        return tuple(f"{c}_{agg.value}" for c, agg in self.aggregations)

    def reads(self) -> tuple[str, ...]:
        time = (self.sort_by,) if self.sort_by else ()
        return tuple(dict.fromkeys((*self.group_by, *time, *(c for c, _ in self.aggregations))))

    def writes(self) -> tuple[str, ...]:
        return (*self.group_by, *self.outputs())

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        exprs = []
        for (c, agg), name in zip(self.aggregations, self.outputs(), strict=True):
            col = pl.col(c)
            match agg:
                case Agg.LIST:
                    expr = col.tail(self.max_list_length) if self.max_list_length else col
                case Agg.FIRST:
                    expr = col.first()
                case Agg.LAST:
                    expr = col.last()
                case Agg.COUNT:
                    expr = col.count().cast(pl.Int64)
                case Agg.SUM:
                    expr = col.sum()
                case Agg.MEAN:
                    expr = col.mean()
                case Agg.MIN:
                    expr = col.min()
                case Agg.MAX:
                    expr = col.max()
            exprs.append(expr.alias(name))
        keys = list(self.group_by) + ([self.sort_by] if self.sort_by else [])
        ordered = frame.drop(ROW_ID, strict=False).sort(keys, maintain_order=True, nulls_last=True)
        return ordered.group_by(list(self.group_by), maintain_order=True).agg(exprs)
