"""Synthetic click logs with learnable labels, for benchmarks and tests without real data.

Every row, for a schema with sparse features f, dense features j and label(s) t:

    id_f     ~ Zipf(alpha) over 0..cardinality_f-1 (id 0 the most frequent) or uniform; a multi-hot
               feature draws `Hotness` ids; missing with rate m_f (single-hot: null, multi-hot: [])
    x_j      = log1p(floor(exp(mu_j + sigma_j * z))), z ~ N(0, 1)   (a log-count); missing -> 0.0
    logit_t  = b_t + sum_f w_f * mean(s(id) e_f(id) for id in row f)           per-id effects
                   + sum_(f,g) v_fg * <s(a) u_f(a), s(b) u_g(b)> / sqrt(r)      a few pairwise interactions
                   + sum_j c_j * (x_j - mean_j) / std_j                       dense terms
    label_t  ~ Bernoulli(sigmoid(logit_t))

e_f(id) and the r components of u_f(id) are unit-variance values hashed from (seed, task, feature,
id): no tables, so memory stays O(row group) for any vocabulary. The model is realistic and
learnable from a few million rows, unlike one with an independent effect per id and per id pair
(at Criteo Kaggle cardinalities most pairs, and many tail ids, are seen once or never, so a large
part of such labels is noise to any learner):
- interactions are low-rank, <u_f(a), u_g(b)> (the FM / DLRM assumption): each id's latent vector
  is learned from all rows with that id, so an interaction generalises to pairs never seen together;
- under Zipf, ids are popularity ranks and s(id) = (1 + id / head_ids) ** -1/2 fades the tail, as
  in real click logs, where rare values carry little signal (why frequency thresholds work);
- dense terms are linear in the standardized value the model reads, not in a latent it cannot see.
b_t is calibrated to `positive_rate`; the weights w, v, c are drawn from the seed and scaled, on a
sample of rows, so that the logit's feature part has std `signal`, 70% of its variance from the
per-id effects, 15% from the interactions and 15% from the dense terms. The oracle AUC
(sigmoid(logit) against the sampled labels) is the best any model can score.

Rows come in chunks of `row_group_rows`, each from its own RNG stream (seed, chunk): the output is
the same for a given seed whatever the file size. Ids are already in 0..cardinality-1 (what a
fitted Categorify produces) and dense values already log-transformed with missing filled, so the
shards train as they are; to exercise the preprocessing Workflow instead, read raw logs with
`hugerec.data.criteo.read_criteo` and fit a Workflow on them.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from hugerec.data import criteo
from hugerec.data.schema import ColumnKind, Schema, ValueType
from hugerec.data.shards import ShardWriter

_AUC_BINS = 1 << 16
_CALIBRATION_IDS = 1 << 22
_INT32_MAX = (1 << 31) - 1
_WORKERS = 2


class IdDistribution(enum.Enum):
    ZIPF = "zipf"  # P(id = k) ~ (k + 1) ** -alpha, approximately (a discretized continuous power law)
    UNIFORM = "uniform"


@dataclass(frozen=True)
class Hotness:
    """Ids per row of a multi-hot feature: uniform in low..high; fixed when high is None or == low."""

    low: int = 1
    high: int | None = None

    def __post_init__(self) -> None:
        if self.high is None:
            object.__setattr__(self, "high", self.low)
        assert self.high is not None
        if self.low < 0 or self.high < self.low:
            raise ValueError(f"Hotness: need 0 <= low <= high, got low={self.low}, high={self.high}")


@dataclass(frozen=True)
class SyntheticConfig:
    """What to generate. Sparse columns of `schema` need cardinalities; labels and dense are written as float32.

    hotness          default for multi-hot columns; column_hotness overrides per column
    missing          {column: rate in [0, 1)} for sparse and dense columns
    signal           std of the logit's feature part: higher -> higher oracle AUC
    num_interactions pairwise interaction terms between single-hot features
    interaction_rank length of the per-id latent vectors whose dot products make the interactions
    head_ids         under Zipf, the effects of id k scale as (1 + k / head_ids) ** -0.5: the most popular
                     ~head_ids ids of a feature carry its signal, the tail ever less
    """

    schema: Schema
    num_rows: int
    distribution: IdDistribution = IdDistribution.ZIPF
    alpha: float = 1.2
    hotness: Hotness = Hotness(1, 5)
    column_hotness: Mapping[str, Hotness] = field(default_factory=dict)
    missing: Mapping[str, float] = field(default_factory=dict)
    positive_rate: float = 0.25
    signal: float = 2.0
    num_interactions: int = 4
    interaction_rank: int = 4
    head_ids: float = 100.0
    seed: int = 0
    rows_per_file: int = 1 << 20
    row_group_rows: int = 1 << 16
    compression: str = "snappy"

    def __post_init__(self) -> None:
        if isinstance(self.distribution, str):
            object.__setattr__(self, "distribution", IdDistribution(self.distribution))
        if self.num_rows <= 0:
            raise ValueError(f"SyntheticConfig: num_rows must be > 0, got {self.num_rows}")
        if not self.alpha > 0:
            raise ValueError(f"SyntheticConfig: alpha must be > 0, got {self.alpha}")
        if not 0 < self.positive_rate < 1:
            raise ValueError(f"SyntheticConfig: positive_rate must be in (0, 1), got {self.positive_rate}")
        if self.signal < 0 or self.num_interactions < 0:
            raise ValueError(
                f"SyntheticConfig: signal and num_interactions must be >= 0, got {self.signal}, {self.num_interactions}"
            )
        if self.interaction_rank < 1:
            raise ValueError(f"SyntheticConfig: interaction_rank must be >= 1, got {self.interaction_rank}")
        if not self.head_ids > 0:
            raise ValueError(f"SyntheticConfig: head_ids must be > 0, got {self.head_ids}")
        for c in self.schema.sparse:
            if c.cardinality is None or c.dtype is not ValueType.INT:
                raise ValueError(
                    f"SyntheticConfig: sparse column {c.name!r} needs dtype int and a cardinality, "
                    f"got dtype {c.dtype} cardinality {c.cardinality}"
                )
        features = set(self.schema.dense_names) | set(self.schema.sparse_names)
        for name, rate in self.missing.items():
            if name not in features:
                raise ValueError(f"SyntheticConfig: missing rate for unknown feature {name!r}")
            if not 0 <= rate < 1:
                raise ValueError(f"SyntheticConfig: missing rate of {name!r} must be in [0, 1), got {rate}")
        multi = {c.name for c in self.schema.sparse if c.multi_hot}
        bad = sorted(set(self.column_hotness) - multi)
        if bad:
            raise ValueError(f"SyntheticConfig: column_hotness names {bad}, which are not multi-hot columns")
        # Validates the file layout early rather than after the first chunk.
        if self.row_group_rows <= 0 or self.rows_per_file % self.row_group_rows:
            raise ValueError(
                f"SyntheticConfig: rows_per_file ({self.rows_per_file}) must be a multiple of "
                f"row_group_rows ({self.row_group_rows})"
            )

    @property
    def output_schema(self) -> Schema:
        """The schema of the written shards: labels and dense as float, sparse as given."""
        cols = tuple(
            c if c.kind is ColumnKind.SPARSE else dataclasses.replace(c, dtype=ValueType.FLOAT)
            for c in self.schema.columns
        )
        return Schema(cols)

    def hotness_of(self, column: str) -> Hotness:
        return self.column_hotness.get(column, self.hotness)


def preset(name: str, num_rows: int, **overrides: Any) -> SyntheticConfig:
    """Named configurations; `overrides` replace any SyntheticConfig field.

    criteo-like     label + 13 dense + 26 single-hot sparse with the Criteo Kaggle cardinalities,
                    missing rates and click rate
    seed-synthetic  label + 100 sparse fields x 10 ids each (fixed hotness), vocabulary 8192 per
                    field, no dense (the HugeCTR embedding-plugin benchmark)
    """
    match name:
        case "criteo-like":
            schema = Schema.build(
                dense=criteo.DENSE_NAMES,
                sparse=dict(zip(criteo.SPARSE_NAMES, criteo.KAGGLE_CARDINALITIES, strict=True)),
            )
            missing = dict(zip(criteo.DENSE_NAMES, criteo.DENSE_MISSING_RATES, strict=True))
            missing.update(zip(criteo.SPARSE_NAMES, criteo.SPARSE_MISSING_RATES, strict=True))
            base = SyntheticConfig(schema, num_rows, missing=missing, positive_rate=criteo.POSITIVE_RATE)
        case "seed-synthetic":
            names = [f"f{i}" for i in range(100)]
            schema = Schema.build(sparse=dict.fromkeys(names, 8192), multi_hot=names)
            base = SyntheticConfig(schema, num_rows, hotness=Hotness(10))
        case _:
            raise ValueError(f"preset: unknown preset {name!r}; expected 'criteo-like' or 'seed-synthetic'")
    return dataclasses.replace(base, **overrides)


@dataclass(frozen=True)
class SyntheticReport:
    paths: list[Path]
    num_rows: int
    schema: Schema
    oracle_auc: dict[str, float]  # label -> AUC of the true probabilities against the sampled labels
    positive_rate: dict[str, float]  # label -> share of ones

    def to_dict(self) -> dict[str, Any]:
        return {
            "paths": [str(p) for p in self.paths],
            "num_rows": self.num_rows,
            "oracle_auc": self.oracle_auc,
            "positive_rate": self.positive_rate,
        }


# -- kernels: hashed unit-variance effects (no tables) and Zipf ids -------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_UNIT_SCALE = math.sqrt(12.0) * 2.0**-53


@njit(cache=True, inline="always")
def _mix(x: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """splitmix64 finalizer (wrapping arithmetic): a bijection with full avalanche."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@njit(cache=True, inline="always")
def _unit(h: np.uint64) -> float:  # pragma: no cover - compiled
    """Hash -> uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1."""
    return float(h >> np.uint64(11)) * _UNIT_SCALE - math.sqrt(3.0)


@njit(cache=True, nogil=True)
def id_effects(key: np.uint64, ids: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """[N] ids -> [N] effects e(key, id)."""
    out = np.empty(ids.size)
    for i in range(ids.size):
        out[i] = _unit(_mix(np.uint64(ids[i]) ^ key))
    return out


@njit(cache=True, nogil=True)
def _bag_means(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Multi-hot: [N] per-id values in bags of [n] lengths -> [n] mean per bag (0 for an empty bag)."""
    out = np.zeros(lengths.size)
    start = 0
    for r in range(lengths.size):
        s = 0.0
        for i in range(start, start + lengths[r]):
            s += values[i]
        if lengths[r] > 0:
            out[r] = s / lengths[r]
        start += lengths[r]
    return out


@njit(cache=True, nogil=True)
def _latent(key: np.uint64, ids: np.ndarray, rank: int) -> np.ndarray:  # pragma: no cover - compiled
    """[n] ids -> [n, rank] unit-variance latent vectors u(key, id)."""
    out = np.empty((ids.size, rank))
    for i in range(ids.size):
        h = _mix(np.uint64(ids[i]) ^ key)
        for k in range(rank):
            out[i, k] = _unit(_mix(h ^ np.uint64(k)))
    return out


@njit(cache=True, nogil=True, fastmath=True)
def power_law_ids(u: np.ndarray, cardinality: int, alpha: float) -> np.ndarray:  # pragma: no cover - compiled
    """[N] uniforms -> [N] ids in 0..cardinality-1: inverse CDF of x ** -alpha on [1, cardinality + 1), minus 1."""
    out = np.empty(u.size, np.int64)
    top = cardinality + 1.0
    e = 1.0 - alpha
    log_mode = abs(e) < 1e-9
    span = math.log(top) if log_mode else top**e - 1.0
    inv = 0.0 if log_mode else 1.0 / e
    for i in range(u.size):
        x = math.exp(u[i] * span) if log_mode else math.exp(math.log(1.0 + u[i] * span) * inv)
        out[i] = min(max(int(x) - 1, 0), cardinality - 1)
    return out


@dataclass(frozen=True)
class _Task:
    """Hidden model of one label."""

    keys: np.ndarray  # [F] uint64 per sparse feature: its per-id effects
    missing_keys: np.ndarray  # [F] uint64: effect of a missing value
    latent_keys: np.ndarray  # [F] uint64: its per-id latent vectors (the same for every pair it is in)
    w: np.ndarray  # [F]
    pairs: tuple[tuple[int, int], ...]  # sparse feature index pairs
    v: np.ndarray  # [P]
    c: np.ndarray  # [Dd]
    bias: float


@dataclass(frozen=True)
class _Model:
    mu: np.ndarray  # [Dd] log-count location
    sigma: np.ndarray  # [Dd] log-count scale
    dense_mean: np.ndarray  # [Dd] of the written dense values, to standardize them in the logit
    dense_std: np.ndarray  # [Dd]
    tasks: tuple[_Task, ...]


def _draw_model(cfg: SyntheticConfig) -> _Model:
    rng = np.random.default_rng([cfg.seed, 0x5EED])
    sparse, dense = cfg.schema.sparse, cfg.schema.dense
    single = [i for i, c in enumerate(sparse) if not c.multi_hot]
    all_pairs = [(a, b) for k, a in enumerate(single) for b in single[k + 1 :]]
    mu = rng.uniform(0.0, 4.0, len(dense))
    sigma = rng.uniform(0.5, 2.0, len(dense))
    tasks = []
    for _ in cfg.schema.labels:
        f, d = len(sparse), len(dense)
        n_pairs = min(cfg.num_interactions, len(all_pairs))
        picked = rng.choice(len(all_pairs), size=n_pairs, replace=False) if n_pairs else np.zeros(0, np.int64)
        tasks.append(
            _Task(
                keys=rng.integers(0, 2**63, f, dtype=np.uint64),
                missing_keys=rng.integers(0, 2**63, f, dtype=np.uint64),
                latent_keys=rng.integers(0, 2**63, f, dtype=np.uint64),
                w=rng.uniform(0.2, 1.0, f),  # relative weights; _calibrate scales each group to its share
                pairs=tuple((all_pairs[i][0], all_pairs[i][1]) for i in picked),
                v=rng.uniform(0.5, 1.0, n_pairs),
                c=rng.uniform(0.2, 1.0, d) * rng.choice([-1.0, 1.0], d),
                bias=0.0,
            )
        )
    ones = np.ones(len(dense))
    return _calibrate(cfg, _Model(mu, sigma, np.zeros(len(dense)), ones, tuple(tasks)))


@dataclass
class _Chunk:
    """One chunk of rows before it becomes an Arrow table."""

    ids: list[np.ndarray]  # per sparse feature: [n] (single-hot) or [sum lengths] (multi-hot) int64
    lengths: list[np.ndarray | None]  # per sparse feature: [n] int64 for multi-hot, None for single-hot
    present: list[np.ndarray]  # per sparse feature: [n] bool
    dense: np.ndarray  # [n, Dd] the written dense values: log1p(count), 0.0 where missing


def _sample_ids(cfg: SyntheticConfig, rng: np.random.Generator, cardinality: int, n: int) -> np.ndarray:
    u = rng.random(n)
    match cfg.distribution:
        case IdDistribution.UNIFORM:
            return np.minimum((u * cardinality).astype(np.int64), cardinality - 1)
        case IdDistribution.ZIPF:
            return power_law_ids(u, cardinality, cfg.alpha)


def _sample_chunk(cfg: SyntheticConfig, model: _Model, rng: np.random.Generator, n: int) -> _Chunk:
    ids: list[np.ndarray] = []
    lengths: list[np.ndarray | None] = []
    present: list[np.ndarray] = []
    for col in cfg.schema.sparse:
        assert col.cardinality is not None
        keep = rng.random(n) >= cfg.missing.get(col.name, 0.0)
        if col.multi_hot:
            hot = cfg.hotness_of(col.name)
            assert hot.high is not None
            lens = rng.integers(hot.low, hot.high + 1, n) * keep
            ids.append(_sample_ids(cfg, rng, col.cardinality, int(lens.sum())))
            lengths.append(lens)
            keep = lens > 0
        else:
            ids.append(_sample_ids(cfg, rng, col.cardinality, n))
            lengths.append(None)
        present.append(keep)
    dense = cfg.schema.dense
    z = rng.standard_normal((n, len(dense)))
    rates = np.array([cfg.missing.get(c.name, 0.0) for c in dense])
    dense_present = rng.random((n, len(dense))) >= rates
    counts = np.floor(np.exp(model.mu + model.sigma * z))  # [n, Dd]
    return _Chunk(ids, lengths, present, np.where(dense_present, np.log1p(counts), 0.0))


def _amplitude(cfg: SyntheticConfig, ids: np.ndarray) -> np.ndarray:
    """[N] ids -> [N] scale of their effects: under Zipf the id is the popularity rank, and the tail fades."""
    match cfg.distribution:
        case IdDistribution.UNIFORM:
            return np.ones(ids.size)
        case IdDistribution.ZIPF:
            return 1.0 / np.sqrt(1.0 + ids / cfg.head_ids)


def _parts(cfg: SyntheticConfig, model: _Model, task: _Task, chunk: _Chunk) -> tuple[np.ndarray, ...]:
    """([n] per-id part, [n] interaction part, [n] dense part) of one task's logit, unweighted by group."""
    n = chunk.dense.shape[0]
    per_id = np.zeros(n)
    for f, (ids, lens, keep) in enumerate(zip(chunk.ids, chunk.lengths, chunk.present, strict=True)):
        eff = id_effects(task.keys[f], ids) * _amplitude(cfg, ids)
        eff = eff if lens is None else _bag_means(eff, lens)
        missing = id_effects(task.missing_keys[f], np.zeros(1, np.int64))[0]
        per_id += task.w[f] * np.where(keep, eff, missing)
    pairwise = np.zeros(n)
    rank = cfg.interaction_rank
    for (a, b), v in zip(task.pairs, task.v, strict=True):
        ua = _latent(task.latent_keys[a], chunk.ids[a], rank) * _amplitude(cfg, chunk.ids[a])[:, None]  # [n, r]
        ub = _latent(task.latent_keys[b], chunk.ids[b], rank) * _amplitude(cfg, chunk.ids[b])[:, None]
        pairwise += v * np.where(chunk.present[a] & chunk.present[b], np.sum(ua * ub, axis=1), 0.0) / math.sqrt(rank)
    dense = ((chunk.dense - model.dense_mean) / model.dense_std) @ task.c
    return per_id, pairwise, dense


def _logits(cfg: SyntheticConfig, model: _Model, task: _Task, chunk: _Chunk) -> np.ndarray:
    """[n] logits of one task, with the bias."""
    return sum(_parts(cfg, model, task, chunk), np.full(chunk.dense.shape[0], task.bias))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# Shares of the logit variance: per-id effects, pairwise interactions, dense terms.
_SHARES = (0.7, 0.15, 0.15)


def _calibrate(cfg: SyntheticConfig, model: _Model) -> _Model:
    """On a sample of rows: standardizes the dense values, scales the weights so that the logit's feature part
    has std `signal` split by _SHARES (measured, so tail amplitudes and missing values count), and solves each
    task's bias so that the mean click probability is `positive_rate` (bisection)."""
    rng = np.random.default_rng([cfg.seed, 0xCA11B])
    ids_per_row = sum(
        1.0 if not c.multi_hot else (cfg.hotness_of(c.name).low + (cfg.hotness_of(c.name).high or 0)) / 2
        for c in cfg.schema.sparse
    )
    rows = int(np.clip(_CALIBRATION_IDS // max(ids_per_row, 1.0), 4096, 1 << 16))  # wide rows need fewer
    chunk = _sample_chunk(cfg, model, rng, rows)
    std = chunk.dense.std(axis=0)
    model = dataclasses.replace(model, dense_mean=chunk.dense.mean(axis=0), dense_std=np.where(std > 0, std, 1.0))
    tasks = []
    for task in model.tasks:
        parts = _parts(cfg, model, task, chunk)
        stds = [float(p.std()) for p in parts]
        total = sum(share for sd, share in zip(stds, _SHARES, strict=True) if sd > 0)
        scale = [
            cfg.signal * math.sqrt(share / total) / sd if sd > 0 else 0.0
            for sd, share in zip(stds, _SHARES, strict=True)
        ]
        task = dataclasses.replace(task, w=task.w * scale[0], v=task.v * scale[1], c=task.c * scale[2])
        logit: np.ndarray = parts[0] * scale[0] + parts[1] * scale[1] + parts[2] * scale[2]
        lo, hi = -30.0, 30.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _sigmoid(logit + mid).mean() < cfg.positive_rate else (lo, mid)
        tasks.append(dataclasses.replace(task, bias=(lo + hi) / 2))
    return dataclasses.replace(model, tasks=tuple(tasks))


def _to_table(cfg: SyntheticConfig, chunk: _Chunk, labels: np.ndarray) -> pa.Table:
    cols: dict[str, pa.Array] = {}
    for t, name in enumerate(cfg.schema.label_names):
        cols[name] = pa.array(labels[:, t].astype(np.float32))
    for j, name in enumerate(cfg.schema.dense_names):
        cols[name] = pa.array(chunk.dense[:, j].astype(np.float32))
    for col, ids, lens, keep in zip(cfg.schema.sparse, chunk.ids, chunk.lengths, chunk.present, strict=True):
        assert col.cardinality is not None
        dtype = np.int32 if col.cardinality <= _INT32_MAX else np.int64
        if lens is None:
            cols[col.name] = pa.array(ids.astype(dtype), mask=~keep)
        else:
            offsets = np.zeros(len(lens) + 1, np.int32)
            np.cumsum(lens, out=offsets[1:])
            cols[col.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids.astype(dtype)))
    return pa.table(cols)


class _AucHistogram:
    """Streaming AUC: positives and negatives counted per probability bin (ties within a bin count half)."""

    def __init__(self) -> None:
        self.pos = np.zeros(_AUC_BINS, np.int64)
        self.neg = np.zeros(_AUC_BINS, np.int64)

    def add(self, p: np.ndarray, y: np.ndarray) -> None:
        b = np.minimum((p * _AUC_BINS).astype(np.int64), _AUC_BINS - 1)
        self.pos += np.bincount(b[y], minlength=_AUC_BINS)
        self.neg += np.bincount(b[~y], minlength=_AUC_BINS)

    def auc(self) -> float:
        n_pos, n_neg = int(self.pos.sum()), int(self.neg.sum())
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        neg_below = np.cumsum(self.neg) - self.neg
        return float(np.sum(self.pos * (neg_below + 0.5 * self.neg)) / (n_pos * n_neg))


def _make_chunk(cfg: SyntheticConfig, model: _Model, k: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    n = min(cfg.row_group_rows, cfg.num_rows - k * cfg.row_group_rows)
    rng = np.random.default_rng([cfg.seed, k])
    chunk = _sample_chunk(cfg, model, rng, n)
    probs = np.stack([_sigmoid(_logits(cfg, model, t, chunk)) for t in model.tasks], axis=1)  # [n, T]
    labels = rng.random(probs.shape) < probs
    return _to_table(cfg, chunk, labels), probs, labels


def _iter_chunks(cfg: SyntheticConfig) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:
    """(table, probabilities [n, T], labels [n, T] bool) per chunk of `row_group_rows` rows, in order.

    Chunks are made by a small thread pool (the kernels release the GIL); at most
    `_WORKERS + 1` chunks are in memory.
    """
    model = _draw_model(cfg)
    num_chunks = -(-cfg.num_rows // cfg.row_group_rows)
    with ThreadPoolExecutor(_WORKERS) as pool:
        ahead: deque[Future[tuple[pa.Table, np.ndarray, np.ndarray]]] = deque()
        for k in range(num_chunks):
            ahead.append(pool.submit(_make_chunk, cfg, model, k))
            if len(ahead) > _WORKERS:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def iter_tables(cfg: SyntheticConfig) -> Iterator[pa.Table]:
    """The dataset as a stream of Arrow tables of `row_group_rows` rows (in memory, nothing written)."""
    for table, _, _ in _iter_chunks(cfg):
        yield table


def generate(cfg: SyntheticConfig, out_dir: str | Path) -> SyntheticReport:
    """Writes the dataset as Parquet shards plus `schema.json` and `synthetic.json` (this report) in `out_dir`."""
    out = Path(out_dir)
    hists = [_AucHistogram() for _ in cfg.schema.labels]
    ones = np.zeros(len(cfg.schema.labels), np.int64)
    with ShardWriter(out, cfg.rows_per_file, cfg.row_group_rows, cfg.compression) as writer:
        for table, probs, labels in _iter_chunks(cfg):
            writer.write(table)
            for t, h in enumerate(hists):
                h.add(probs[:, t], labels[:, t])
            ones += labels.sum(axis=0)
    names = cfg.schema.label_names
    report = SyntheticReport(
        paths=writer.paths,
        num_rows=writer.num_rows,
        schema=cfg.output_schema,
        oracle_auc={n: h.auc() for n, h in zip(names, hists, strict=True)},
        positive_rate={n: float(k) / writer.num_rows for n, k in zip(names, ones, strict=True)},
    )
    report.schema.save(out / "schema.json")
    (out / "synthetic.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    return report
