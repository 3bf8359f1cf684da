"""A drifting click stream over days: the synthetic click generator with a time axis.

Every row of day d, for sparse features f (raw int64 keys, for dynamic tables) and dense features j:

    rank_f   ~ Zipf(alpha_f(d)) over 0..vocabulary-1            (rank 0 the most popular)
    key_f    = rank_f + vocabulary * epoch_f(rank_f, d)          the id that holds that rank on day d
    x_j      = z_j + shift_j(d), z ~ N(0, 1)
    logit    = b + sum_f w_f * e_f^c(key_f) + sum_j s_j^c * c_j * x_j
    label    ~ Bernoulli(sigmoid(logit)),   ts = d * 86400 + uniform second of the day (sorted)

Drift, all controllable:
- popularity: every day each rank is handed to a brand-new id with probability `churn` (epoch_f
  counts the hand-overs, hashed from (seed, f, rank, day)): popular items fade, new ids arrive at
  every popularity level, old ids go stale (what dynamic tables admit and evict);
- concept drift from `concept_drift_day`: the hidden model changes: the first `concept_drift_share`
  of the sparse features get new per-id effects (c = 1 picks other hash keys) and the dense
  coefficients flip sign (s = -1);
- feature shift from `feature_shift_day`: the first half of the dense features move by
  `feature_shift` standard deviations and feature 0's Zipf exponent drops to `shift_alpha` (a flatter
  id distribution). The label function is unchanged (covariate shift).

e^c(key) are unit-variance values hashed from (seed, feature, c, key) as in hugerec.data.synthetic;
w and c are scaled so that the logit's feature part has std `signal` (70% per-id effects, 30% dense)
and b is solved on day 0 for `positive_rate`. The true probabilities are returned with each day:
their AUC is the oracle's, the best any model can score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hugerec.data.schema import Schema
from hugerec.data.synthetic import id_effects, power_law_ids

SECONDS_PER_DAY = 86400
TIME_COLUMN = "ts"
LABEL = "label"
_ID_SHARE = 0.7  # share of the logit variance from the per-id effects (the rest: dense)


@dataclass(frozen=True)
class StreamConfig:
    """What the stream looks like; days are 0..days-1. None for a drift day: that drift never happens."""

    days: int = 7  # days of the stream (0..days-1), one window per day at unit = "day"
    rows_per_day: int = 20_000  # rows of each day
    num_sparse: int = 6  # sparse (id) features c0, c1, ...: raw int64 keys
    num_dense: int = 4  # dense features d0, d1, ...
    vocabulary: int = 2000  # popularity ranks per sparse feature (the ids holding them change with `churn`)
    alpha: float = 1.1  # Zipf exponent of the ranks (larger: a few ids take most rows)
    churn: float = 0.02  # each day, the chance that a rank passes to a brand-new id
    concept_drift_day: int | None = None  # from this day the hidden model changes (none: never)
    concept_drift_share: float = 0.5  # the share of sparse features whose per-id effects change at the concept drift
    feature_shift_day: int | None = None  # from this day half the dense features and feature 0's ids shift (none: never)
    feature_shift: float = 1.5  # the dense shift, in standard deviations
    shift_alpha: float = 0.6  # feature 0's Zipf exponent after the shift (a flatter id distribution)
    positive_rate: float = 0.2  # the click rate on day 0
    signal: float = 2.0  # standard deviation of the logit's feature part (larger: an easier task, a higher oracle AUC)
    seed: int = 0  # the stream's seed: the same seed, the same rows

    def __post_init__(self) -> None:
        for name in ("days", "rows_per_day", "num_sparse", "vocabulary"):
            if getattr(self, name) < 1:
                raise ValueError(f"StreamConfig: {name} must be >= 1, got {getattr(self, name)}")
        if self.num_dense < 0:
            raise ValueError(f"StreamConfig: num_dense must be >= 0, got {self.num_dense}")
        if not (self.alpha > 0 and self.shift_alpha > 0):
            raise ValueError(f"StreamConfig: alpha and shift_alpha must be > 0, got {self.alpha}, {self.shift_alpha}")
        if not 0 <= self.churn < 1:
            raise ValueError(f"StreamConfig: churn must be in [0, 1), got {self.churn}")
        if not 0 <= self.concept_drift_share <= 1:
            raise ValueError(f"StreamConfig: concept_drift_share must be in [0, 1], got {self.concept_drift_share}")
        if not 0 < self.positive_rate < 1:
            raise ValueError(f"StreamConfig: positive_rate must be in (0, 1), got {self.positive_rate}")
        if self.signal < 0:
            raise ValueError(f"StreamConfig: signal must be >= 0, got {self.signal}")
        for name in ("concept_drift_day", "feature_shift_day"):
            day = getattr(self, name)
            if day is not None and not 0 < day < self.days:
                raise ValueError(f"StreamConfig: {name} must be in 1..{self.days - 1} or None, got {day}")

    @property
    def sparse_names(self) -> tuple[str, ...]:
        return tuple(f"c{i}" for i in range(self.num_sparse))

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(f"d{j}" for j in range(self.num_dense))

    @property
    def schema(self) -> Schema:
        """Label, dense and sparse columns (sparse without a cardinality: raw keys for dynamic tables)."""
        return Schema.build(labels=(LABEL,), dense=self.dense_names, sparse=dict.fromkeys(self.sparse_names))

    def concept(self, day: int) -> int:
        """0 before the concept drift, 1 from its day on."""
        return int(self.concept_drift_day is not None and day >= self.concept_drift_day)

    def shifted(self, day: int) -> bool:
        return self.feature_shift_day is not None and day >= self.feature_shift_day


@dataclass(frozen=True)
class Day:
    """One day of the stream: the rows (with the time column) and their true click probabilities [n]."""

    day: int
    table: pa.Table
    probability: np.ndarray


class Stream:
    """The hidden model of a StreamConfig; `day(d)` makes day d (the same rows for the same seed and day)."""

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        rng = np.random.default_rng([config.seed, 0x57EA])
        f, d = config.num_sparse, config.num_dense
        self._keys = rng.integers(0, 2**63, (2, f), dtype=np.uint64)  # [concept, feature] effect hash keys
        self._churn_keys = rng.integers(0, 2**63, f, dtype=np.uint64)
        self._w = np.full(f, config.signal * math.sqrt(_ID_SHARE / f))
        dense_scale = config.signal * math.sqrt((1 - _ID_SHARE) / d) if d else 0.0
        self._c = rng.choice([-1.0, 1.0], d) * dense_scale
        self._bias = 0.0
        logit = self._logit(0, *self._features(0, np.random.default_rng([config.seed, 0xB1A5]), 1 << 14))
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _sigmoid(logit + mid).mean() < config.positive_rate else (lo, mid)
        self._bias = (lo + hi) / 2

    def epochs(self, feature: int, day: int) -> np.ndarray:
        """[vocabulary] how many times each rank of `feature` was handed to a new id by `day`."""
        cfg = self.config
        ranks = np.arange(cfg.vocabulary, dtype=np.int64)
        out = np.zeros(cfg.vocabulary, np.int64)
        for d in range(1, day + 1):
            key = self._churn_keys[feature] ^ np.uint64(d * 0x9E3779B1)
            u = id_effects(key, ranks) / (2 * math.sqrt(3.0)) + 0.5  # unit variance on [-sqrt3, sqrt3) -> [0, 1)
            out += u < cfg.churn
        return out

    def _features(self, day: int, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """[F, n] keys and [n, Dd] dense values of n rows of `day`."""
        cfg = self.config
        keys = np.empty((cfg.num_sparse, n), np.int64)
        for f in range(cfg.num_sparse):
            alpha = cfg.shift_alpha if f == 0 and cfg.shifted(day) else cfg.alpha
            ranks = power_law_ids(rng.random(n), cfg.vocabulary, alpha)
            keys[f] = ranks + cfg.vocabulary * self.epochs(f, day)[ranks]
        dense = rng.standard_normal((n, cfg.num_dense))
        if cfg.shifted(day):
            dense[:, : cfg.num_dense // 2] += cfg.feature_shift
        return keys, dense

    def _logit(self, day: int, keys: np.ndarray, dense: np.ndarray) -> np.ndarray:
        cfg = self.config
        concept = cfg.concept(day)
        drifted = round(cfg.concept_drift_share * cfg.num_sparse)
        logit = np.full(keys.shape[1], self._bias)
        for f in range(cfg.num_sparse):
            c = concept if f < drifted else 0
            logit += self._w[f] * id_effects(self._keys[c, f], keys[f])
        sign = -1.0 if concept else 1.0
        return logit + dense @ (sign * self._c)

    def day(self, d: int) -> Day:
        cfg = self.config
        if not 0 <= d < cfg.days:
            raise ValueError(f"Stream.day: day must be in 0..{cfg.days - 1}, got {d}")
        rng = np.random.default_rng([cfg.seed, d, 0xDA7])
        n = cfg.rows_per_day
        keys, dense = self._features(d, rng, n)
        p = _sigmoid(self._logit(d, keys, dense))
        labels = rng.random(n) < p
        ts = d * SECONDS_PER_DAY + np.sort(rng.integers(0, SECONDS_PER_DAY, n))
        cols: dict[str, pa.Array] = {LABEL: pa.array(labels.astype(np.float32))}
        for j, name in enumerate(cfg.dense_names):
            cols[name] = pa.array(dense[:, j].astype(np.float32))
        for f, name in enumerate(cfg.sparse_names):
            cols[name] = pa.array(keys[f])
        cols[TIME_COLUMN] = pa.array(ts.astype(np.int64))
        return Day(d, pa.table(cols), p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))
