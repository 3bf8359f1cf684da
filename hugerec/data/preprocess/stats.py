"""Mergeable statistics: what ops gather per partition and combine, so that fit is a map-reduce.

Every op's statistics are `Stats`: named Polars frames (saved as Parquet, no code inside). Two
building blocks cover the ops:

    counts   group keys -> summed columns (value counts, target sums): merge = concat + group-by sum
    moments  column -> (count, mean, m2) of non-null values: merge = Chan et al.'s parallel update,
             exact and stable where summing x and x^2 is not
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import polars as pl

Stats = dict[str, pl.DataFrame]

MOMENTS_SCHEMA = {"column": pl.String(), "count": pl.Int64(), "mean": pl.Float64(), "m2": pl.Float64()}

T = TypeVar("T")
_CACHE: dict[int, tuple[weakref.ref[pl.DataFrame], dict[str, object]]] = {}


def cached(frame: pl.DataFrame, name: str, build: Callable[[pl.DataFrame], T]) -> T:
    """`build(frame)`, computed once per statistics frame object (fitted stats are never mutated)."""
    key = id(frame)
    hit = _CACHE.get(key)
    if hit is None or hit[0]() is not frame:
        hit = (weakref.ref(frame, lambda _ref, key=key: _CACHE.pop(key, None)), {})  # type: ignore[misc]  # default-arg binding of the key
        _CACHE[key] = hit
    if name not in hit[1]:
        hit[1][name] = build(frame)
    return cast(T, hit[1][name])


def count_values(frame: pl.DataFrame, keys: Sequence[str], sums: Sequence[str] = ()) -> pl.DataFrame:
    """(*keys, count, *sums): rows per distinct key (nulls included as a key) and sums of `sums`."""
    aggs = [pl.len().cast(pl.Int64).alias("count")] + [pl.col(c).cast(pl.Float64).sum() for c in sums]
    return frame.group_by(list(keys)).agg(aggs)


def merge_counts(parts: Sequence[pl.DataFrame], keys: Sequence[str]) -> pl.LazyFrame:
    """Plan: sum the count/sum columns of several `count_values` results over equal keys (collect
    several plans at once with `pl.collect_all`, which runs them in parallel)."""
    frames = [p for p in parts if p.height] or list(parts[:1])
    if len(frames) == 1:  # already one row per key
        return frames[0].lazy()
    whole = pl.concat([f.lazy() for f in frames], how="vertical_relaxed")
    value_cols = [c for c in frames[0].columns if c not in keys]
    return whole.group_by(list(keys)).agg([pl.col(c).sum() for c in value_cols])


def collect_by_name(plans: dict[str, pl.LazyFrame]) -> Stats:
    """Run named plans in parallel."""
    return dict(zip(plans, pl.collect_all(list(plans.values())), strict=True))


def moments(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """[len(columns)] rows of (column, count, mean, m2) over the non-null, non-NaN values."""
    exprs = []
    for i, c in enumerate(columns):
        x = pl.col(c).cast(pl.Float64).fill_nan(None)
        exprs += [x.count().alias(f"n{i}"), x.mean().alias(f"mean{i}"), (x.var(ddof=0) * x.count()).alias(f"m2_{i}")]
    row = frame.select(exprs).row(0) if columns else ()
    rows = []
    for i, c in enumerate(columns):
        n, mean, m2 = row[3 * i : 3 * i + 3]
        rows.append({"column": c, "count": int(n), "mean": float(mean or 0.0), "m2": float(m2 or 0.0)})
    return pl.DataFrame(rows, schema=MOMENTS_SCHEMA)


def merge_moments(parts: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Chan's pairwise merge, folded over the parts (rows matched by column name)."""
    acc: dict[str, tuple[int, float, float]] = {}
    order: list[str] = []
    for part in parts:
        for c, n, mean, m2 in part.iter_rows():
            if c not in acc:
                acc[c] = (n, mean, m2)
                order.append(c)
                continue
            na, ma, m2a = acc[c]
            total = na + n
            if total == 0:
                continue
            delta = mean - ma
            acc[c] = (total, ma + delta * n / total, m2a + m2 + delta * delta * na * n / total)
    return pl.DataFrame(
        [{"column": c, "count": acc[c][0], "mean": acc[c][1], "m2": acc[c][2]} for c in order], schema=MOMENTS_SCHEMA
    )


def moments_of(stats: pl.DataFrame, column: str) -> tuple[int, float, float]:
    """(count, mean, population std) of one column."""
    by_column = cached(stats, "moments", lambda f: {row[0]: row[1:] for row in f.iter_rows()})
    if column not in by_column:
        raise KeyError(f"no moments for column {column!r}")
    n, mean, m2 = by_column[column]
    std = (m2 / n) ** 0.5 if n else 0.0
    return int(n), float(mean), float(std)
