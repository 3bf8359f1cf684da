"""The monitor: per window, logged requests and feedback against the training reference.

    drift        per feature: PSI and Jensen-Shannon distance (base 2) between the reference's and the
                 window's bucket shares. Numeric features: buckets between the reference's deciles.
                 Categorical, by `categorical` (a CategoricalDrift):
                   IDENTITY  buckets: the reference's `top_k` most frequent ids, "other", "missing"
                   PROFILE   buckets: each side's own 1st, 2nd, ... `top_k`-th most frequent id, "other",
                             "missing": the shape of the popularity curve, blind to which ids hold it.
                             The default: ids churn every day (new items replace old ones at every
                             popularity level), and identity PSI then alarms on every ordinary day
    predictions  mean and deciles of the window's predictions, PSI against the reference predictions
    KPIs         per role (stable, canary) on the labelled rows: count, AUC, CTR, mean prediction

Shapes: n rows, J features, B buckets. The kernels are NumPy (searchsorted + bincount per feature,
vectorised PSI / JS over [J, B]); tests/continuous/test_monitor.py checks each against a plain loop.
Figures go to a Prometheus text file (write_prometheus) and a PNG per window (write_png).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from scipy.spatial.distance import jensenshannon
from scipy.stats import rankdata

from hugerec.continuous.decisions import Kpis, Observation

_EPS = 1e-4  # floor of a bucket share in PSI (an empty bucket would make it infinite)


class CategoricalDrift(enum.Enum):
    IDENTITY = "identity"
    PROFILE = "profile"


@dataclass(frozen=True)
class MonitorConfig:
    """How the monitor buckets the features it compares (see the module docstring)."""

    numeric_buckets: int = 10  # numeric features: buckets between the reference's quantiles
    top_k: int = 50  # categorical features: the most frequent ids that get a bucket each
    categorical: CategoricalDrift = CategoricalDrift.PROFILE  # "profile": the popularity curve's shape; "identity": the reference's top ids

    def __post_init__(self) -> None:
        if isinstance(self.categorical, str):
            try:
                object.__setattr__(self, "categorical", CategoricalDrift(self.categorical))
            except ValueError:
                raise ValueError(
                    f"MonitorConfig: categorical must be 'identity' or 'profile', got {self.categorical!r}"
                ) from None
        if self.numeric_buckets < 2 or self.top_k < 1:
            raise ValueError(
                f"MonitorConfig: numeric_buckets must be >= 2 and top_k >= 1, got {self.numeric_buckets}, {self.top_k}"
            )


# -- kernels ------------------------------------------------------------------------------------
def numeric_edges(reference: np.ndarray, buckets: int) -> np.ndarray:
    """[n] reference values -> inner bucket edges (its quantiles, duplicates dropped)."""
    finite = reference[np.isfinite(reference)]
    if finite.size == 0:
        return np.zeros(0)
    return np.unique(np.quantile(finite, np.linspace(0, 1, buckets + 1)[1:-1]))


def numeric_counts(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """[n] values -> [len(edges) + 2] counts: bucket i holds edges[i-1] <= v < edges[i]; the last: NaN."""
    nan = ~np.isfinite(values)
    b = np.searchsorted(edges, values[~nan], side="right")
    counts = np.bincount(b, minlength=edges.size + 1)
    return np.append(counts, nan.sum())


def top_ids(reference: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """The k most frequent ids of the valid reference rows, sorted ascending."""
    ids, counts = np.unique(reference[valid], return_counts=True)
    keep = np.argsort(-counts, kind="stable")[:k]
    return np.sort(ids[keep])


def categorical_counts(values: np.ndarray, valid: np.ndarray, top: np.ndarray) -> np.ndarray:
    """[n] ids -> [K + 2] counts: one per id of `top` (sorted), then "other", then "missing"."""
    v = values[valid]
    pos = np.searchsorted(top, v)
    hit = pos < top.size
    hit[hit] = top[pos[hit]] == v[hit]
    counts = np.bincount(np.where(hit, pos, top.size), minlength=top.size + 1)
    return np.append(counts, (~valid).sum())


def profile_counts(values: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """[n] ids -> [k + 2] counts: of the most frequent id, the 2nd, ... the k-th (0 past the distinct ids),
    then all other ids, then "missing"."""
    _, counts = np.unique(values[valid], return_counts=True)
    ordered = -np.sort(-counts)
    head = np.zeros(k, np.int64)
    head[: min(k, ordered.size)] = ordered[:k]
    return np.concatenate([head, [ordered[k:].sum(), (~valid).sum()]])


def psi(reference: np.ndarray, current: np.ndarray) -> np.ndarray:
    """[J, B] bucket counts of both sides -> [J] population stability index, sum (c - r) ln(c / r) of shares."""
    r = np.maximum(reference / np.maximum(reference.sum(axis=-1, keepdims=True), 1), _EPS)
    c = np.maximum(current / np.maximum(current.sum(axis=-1, keepdims=True), 1), _EPS)
    return np.sum((c - r) * np.log(c / r), axis=-1)


def js_distance(reference: np.ndarray, current: np.ndarray) -> np.ndarray:
    """[J, B] bucket counts -> [J] Jensen-Shannon distance (base 2, in [0, 1])."""
    r = reference / np.maximum(reference.sum(axis=-1, keepdims=True), 1)
    c = current / np.maximum(current.sum(axis=-1, keepdims=True), 1)
    return np.asarray(jensenshannon(r, c, base=2, axis=-1))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact AUC (ties count half) by ranks; NaN without both classes."""
    y = labels > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return math.nan
    ranks = rankdata(scores)
    return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def _pad(rows: Sequence[np.ndarray]) -> np.ndarray:
    """Ragged count vectors -> [J, max B], zero padded (a zero in both sides adds nothing to PSI / JS)."""
    width = max((r.size for r in rows), default=0)
    out = np.zeros((len(rows), width))
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


# -- the reference and one window's report ------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    """Bucket layout and counts of the training reference, per feature; numeric features first."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    mode: CategoricalDrift
    edges: tuple[np.ndarray, ...]
    tops: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]  # per feature, numeric then categorical
    prediction_edges: np.ndarray | None = None
    prediction_counts: np.ndarray | None = None

    @staticmethod
    def of(
        table: pa.Table,
        numeric: Sequence[str],
        categorical: Sequence[str],
        config: MonitorConfig,
        predictions: np.ndarray | None = None,
    ) -> Reference:
        edges, tops, counts = [], [], []
        for name in numeric:
            x = _floats(table, name)
            edges.append(numeric_edges(x, config.numeric_buckets))
            counts.append(numeric_counts(x, edges[-1]))
        for name in categorical:
            ids, valid = _ids(table, name)
            match config.categorical:
                case CategoricalDrift.IDENTITY:
                    tops.append(top_ids(ids, valid, config.top_k))
                    counts.append(categorical_counts(ids, valid, tops[-1]))
                case CategoricalDrift.PROFILE:
                    tops.append(np.zeros(0, np.int64))  # unused: each side ranks its own ids
                    counts.append(profile_counts(ids, valid, config.top_k))
        p_edges = p_counts = None
        if predictions is not None:
            p_edges = numeric_edges(predictions, config.numeric_buckets)
            p_counts = numeric_counts(predictions, p_edges)
        return Reference(
            tuple(numeric),
            tuple(categorical),
            config.categorical,
            tuple(edges),
            tuple(tops),
            tuple(counts),
            p_edges,
            p_counts,
        )


@dataclass(frozen=True)
class Report:
    window: int
    rows: int
    psi: dict[str, float]
    js: dict[str, float]
    prediction: dict[str, float] = field(default_factory=dict)  # mean, p10..p90, psi
    kpis: dict[str, Kpis] = field(default_factory=dict)  # role -> KPIs on the labelled rows

    def observation(self) -> Observation:
        drift = dict(self.psi)
        if "psi" in self.prediction:
            drift["prediction"] = self.prediction["psi"]
        return Observation(kpis=self.kpis, drift=drift)


def drift(reference: Reference, table: pa.Table) -> tuple[dict[str, float], dict[str, float]]:
    """(PSI, JS distance) per feature of `table` against `reference`."""
    current = [numeric_counts(_floats(table, n), e) for n, e in zip(reference.numeric, reference.edges, strict=True)]
    for name, top, ref_counts in zip(
        reference.categorical, reference.tops, reference.counts[len(reference.numeric) :], strict=True
    ):
        ids, valid = _ids(table, name)
        match reference.mode:
            case CategoricalDrift.IDENTITY:
                current.append(categorical_counts(ids, valid, top))
            case CategoricalDrift.PROFILE:
                current.append(profile_counts(ids, valid, ref_counts.size - 2))
    ref, cur = _pad(reference.counts), _pad(current)
    names = (*reference.numeric, *reference.categorical)
    if not names:
        return {}, {}
    return dict(zip(names, psi(ref, cur).tolist(), strict=True)), dict(
        zip(names, js_distance(ref, cur).tolist(), strict=True)
    )


def kpis(predictions: np.ndarray, labels: np.ndarray) -> Kpis:
    n = int(labels.size)
    return Kpis(
        n,
        auc(predictions, labels),
        float(labels.mean()) if n else math.nan,
        float(predictions.mean()) if n else math.nan,
    )


def report(
    window: int,
    reference: Reference,
    requests: pa.Table,
    roles: Mapping[str, str] | None = None,
    labelled: pa.Table | None = None,
) -> Report:
    """One window's report: drift of `requests` (features + "prediction"), KPIs of `labelled` (requests
    joined with feedback: prediction, label, version) per role (roles: version -> "stable" / "canary")."""
    psis, jss = drift(reference, requests)
    pred: dict[str, float] = {}
    if "prediction" in requests.column_names and requests.num_rows:
        p = requests["prediction"].to_numpy().astype(np.float64)
        pred = {"mean": float(p.mean())}
        pred.update(
            {
                f"p{q}": float(v)
                for q, v in zip(range(10, 100, 10), np.quantile(p, np.arange(0.1, 1.0, 0.1)), strict=True)
            }
        )
        if reference.prediction_edges is not None and reference.prediction_counts is not None:
            cur = numeric_counts(p, reference.prediction_edges)
            pred["psi"] = float(psi(reference.prediction_counts[None], cur[None])[0])
    out: dict[str, Kpis] = {}
    if labelled is not None and labelled.num_rows and roles:
        versions = np.asarray(labelled["version"].to_pylist(), dtype=object)
        p = labelled["prediction"].to_numpy().astype(np.float64)
        y = labelled["label"].to_numpy().astype(np.float64)
        for version, role in roles.items():
            m = versions == version
            if m.any():
                out[role] = kpis(p[m], y[m])
    return Report(window, requests.num_rows, psis, jss, pred, out)


def _floats(table: pa.Table, name: str) -> np.ndarray:
    """A numeric column as float64, nulls as NaN (counted in the NaN bucket)."""
    col = table[name].cast(pa.float64())
    return np.asarray(col.fill_null(math.nan).to_numpy(), np.float64)


def _ids(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    col = table[name]
    valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)
    ids = col.fill_null(0).to_numpy().astype(np.int64)
    return ids, valid


# -- outputs ------------------------------------------------------------------------------------
def write_prometheus(rep: Report, path: str | Path) -> Path:
    """The report as a Prometheus text file (node exporter's textfile collector reads it)."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    registry = CollectorRegistry()
    g_psi = Gauge(
        "hugerec_monitor_psi", "PSI of a feature against the training reference", ["feature"], registry=registry
    )
    g_js = Gauge("hugerec_monitor_js", "Jensen-Shannon distance against the reference", ["feature"], registry=registry)
    g_pred = Gauge("hugerec_monitor_prediction", "Prediction distribution of the window", ["stat"], registry=registry)
    g_kpi = Gauge("hugerec_monitor_kpi", "KPIs on labelled feedback", ["role", "kpi"], registry=registry)
    g_win = Gauge("hugerec_monitor_window", "Window of these figures", registry=registry)
    g_win.set(rep.window)
    for name, v in rep.psi.items():
        g_psi.labels(name).set(v)
    for name, v in rep.js.items():
        g_js.labels(name).set(v)
    for stat, v in rep.prediction.items():
        g_pred.labels(stat).set(v)
    for role, k in rep.kpis.items():
        for key in ("count", "auc", "ctr", "mean_prediction", "calibration"):
            g_kpi.labels(role, key).set(float(getattr(k, key)))
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(p), registry)
    return p


def write_png(rep: Report, path: str | Path, alarm: float = 0.2) -> Path:
    """A one-page PNG: PSI per feature (alarm line), prediction deciles, KPIs per role."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = list(rep.psi)
    axes[0].barh(names, [rep.psi[n] for n in names], color=["C3" if rep.psi[n] >= alarm else "C0" for n in names])
    axes[0].axvline(alarm, color="k", ls="--", lw=1)
    axes[0].set_title(f"window {rep.window}: PSI per feature ({rep.rows} rows)")
    deciles = [rep.prediction[f"p{q}"] for q in range(10, 100, 10) if f"p{q}" in rep.prediction]
    axes[1].plot(range(10, 10 * len(deciles) + 1, 10), deciles, marker="o")
    axes[1].set_title(f"prediction deciles (PSI {rep.prediction.get('psi', math.nan):.3f})")
    axes[1].set_xlabel("percentile")
    roles = list(rep.kpis)
    for i, key in enumerate(("auc", "ctr", "mean_prediction")):
        axes[2].bar(
            [j + 0.25 * i for j in range(len(roles))], [getattr(rep.kpis[r], key) for r in roles], 0.25, label=key
        )
    axes[2].set_xticks(range(len(roles)), [f"{r} (n={rep.kpis[r].count})" for r in roles])
    axes[2].set_title("KPIs on feedback")
    axes[2].legend()
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=80)
    plt.close(fig)
    return p
