"""Statistical encodings of categorical columns: TargetEncoding (smoothed target mean), CountEncoding.

Both add a new column per input column and leave the input as it is; null is a category of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import polars as pl

from hugerec.data.preprocess.hashing import hash_series
from hugerec.data.preprocess.op import ROW_ID, as_columns, require_numeric, require_scalar
from hugerec.data.preprocess.stats import Stats, cached, collect_by_name, count_values, merge_counts
from hugerec.data.preprocess.value_index import index_of

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TargetEncoding:
    """`<column><suffix>` = smoothed mean of `target` over the rows sharing the column's value (Float32):

        enc(v) = (sum_v + smoothing * prior) / (count_v + smoothing),   prior = mean target overall

    Out of fold, no target leakage: each training row gets a fold, fold = stable_hash(row id, seed) %
    k_folds, and while the workflow transforms the very dataset it was fitted on (`fit_transform`, or
    `transform(..., out_of_fold=True)`), a row's sums, counts and prior come from the other folds
    only, so its own target never enters its feature. Everywhere else (validation data, serving
    requests) the statistics of all folds are used. Rows with a null target are not counted;
    values never seen get the prior.
    """

    columns: tuple[str, ...]
    target: str
    k_folds: int = 5
    smoothing: float = 20.0
    seed: int = 0
    suffix: str = "_te"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "TargetEncoding"))
        if not self.target or self.target in self.columns:
            raise ValueError(f"TargetEncoding: target {self.target!r} must be a column other than the encoded ones")
        if self.k_folds < 2:
            raise ValueError(f"TargetEncoding: k_folds must be >= 2, got {self.k_folds}")
        if not self.smoothing >= 0:
            raise ValueError(f"TargetEncoding: smoothing must be >= 0, got {self.smoothing}")
        if not self.suffix:
            raise ValueError("TargetEncoding: suffix must not be empty (the input columns are kept)")

    @property
    def stateful(self) -> bool:
        return True

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def fit_reads(self) -> tuple[str, ...]:
        return (*self.columns, self.target)

    def writes(self) -> tuple[str, ...]:
        return tuple(c + self.suffix for c in self.columns)

    def _folds(self, frame: pl.DataFrame) -> pl.Series:
        if ROW_ID not in frame.columns:
            raise ValueError("TargetEncoding: out-of-fold statistics need the workflow's row ids")
        folds = hash_series(frame[ROW_ID], self.seed) % np.uint64(self.k_folds)
        return pl.Series("fold", folds.astype(np.int64))

    def fit(self, frame: pl.DataFrame) -> Stats:
        """Per column: (value, count_0..count_{k-1}, sum_0..sum_{k-1}) by fold, over non-null targets."""
        require_numeric(frame, (self.target,), "TargetEncoding")
        require_scalar(frame, self.columns, "TargetEncoding")
        labelled = frame.with_columns(self._folds(frame)).filter(pl.col(self.target).is_not_null())
        y = pl.col(self.target).cast(pl.Float64)
        out: Stats = {}
        for c in self.columns:
            aggs = [(pl.col("fold") == f).sum().cast(pl.Int64).alias(f"count_{f}") for f in range(self.k_folds)]
            aggs += [y.filter(pl.col("fold") == f).sum().alias(f"sum_{f}") for f in range(self.k_folds)]
            out[c] = labelled.group_by(pl.col(c).alias("value")).agg(aggs)
        return out

    def merge(self, parts: Sequence[Stats]) -> Stats:
        return collect_by_name({c: merge_counts([p[c] for p in parts], ["value"]) for c in self.columns})

    def finalize(self, stats: Stats) -> Stats:
        return {c: stats[c].sort("value", nulls_last=True) for c in self.columns}

    def _arrays(self, table: pl.DataFrame) -> tuple[F64, F64]:
        """[V + 1, k] counts and sums by value and fold; row V is zeros (for values never seen)."""
        zeros = np.zeros((1, self.k_folds))
        counts = table.select([f"count_{f}" for f in range(self.k_folds)]).to_numpy().astype(np.float64)
        sums = table.select([f"sum_{f}" for f in range(self.k_folds)]).to_numpy().astype(np.float64)
        return np.concatenate([counts, zeros]), np.concatenate([sums, zeros])

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_scalar(frame, self.columns, "TargetEncoding")
        fold = self._folds(frame).to_numpy() if ROW_ID in frame.columns else None  # [R]
        encoded = []
        for c in self.columns:
            table = stats[c]
            counts, sums = cached(table, "target_encoding", self._arrays)  # [V + 1, k] each
            rows = index_of(table).lookup(frame[c])  # [R]
            rows[rows < 0] = table.height
            count_v, sum_v = counts[rows].sum(axis=1), sums[rows].sum(axis=1)  # [R]
            total_count, total_sum = counts.sum(axis=0), sums.sum(axis=0)  # [k]
            if fold is not None:
                count_v -= counts[rows, fold]
                sum_v -= sums[rows, fold]
                n = total_count.sum() - total_count[fold]  # [R]
                s = total_sum.sum() - total_sum[fold]
            else:
                n = np.full(frame.height, total_count.sum())
                s = np.full(frame.height, total_sum.sum())
            prior = np.divide(s, n, out=np.zeros(frame.height), where=n > 0)
            denominator = count_v + self.smoothing
            value = np.divide(sum_v + self.smoothing * prior, denominator, out=prior.copy(), where=denominator > 0)
            encoded.append(pl.Series(c + self.suffix, value.astype(np.float32)))
        return frame.with_columns(encoded)


@dataclass(frozen=True)
class CountEncoding:
    """`<column><suffix>` = how often the value occurred in the fitted dataset (Int64; 0 if never)."""

    columns: tuple[str, ...]
    suffix: str = "_count"

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", as_columns(self.columns, "CountEncoding"))
        if not self.suffix:
            raise ValueError("CountEncoding: suffix must not be empty (the input columns are kept)")

    @property
    def stateful(self) -> bool:
        return True

    def reads(self) -> tuple[str, ...]:
        return self.columns

    def writes(self) -> tuple[str, ...]:
        return tuple(c + self.suffix for c in self.columns)

    def fit(self, frame: pl.DataFrame) -> Stats:
        require_scalar(frame, self.columns, "CountEncoding")
        return {c: count_values(frame.select(pl.col(c).alias("value")), ["value"]) for c in self.columns}

    def merge(self, parts: Sequence[Stats]) -> Stats:
        return collect_by_name({c: merge_counts([p[c] for p in parts], ["value"]) for c in self.columns})

    def finalize(self, stats: Stats) -> Stats:
        return {c: stats[c].sort("value", nulls_last=True) for c in self.columns}

    def transform(self, frame: pl.DataFrame, stats: Stats) -> pl.DataFrame:
        require_scalar(frame, self.columns, "CountEncoding")
        encoded = []
        for c in self.columns:
            table = stats[c]
            counts = cached(table, "count_encoding", lambda t: np.append(t["count"].to_numpy(), 0))  # [V + 1]
            rows = index_of(table).lookup(frame[c])
            rows[rows < 0] = table.height
            values = counts[rows]
            encoded.append(pl.Series(c + self.suffix, values, dtype=pl.Int64))
        return frame.with_columns(encoded)
