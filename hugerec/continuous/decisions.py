"""What the loop does with what the monitor saw: promote or roll back the canary, or retrain from scratch.

Thresholds are data (DecisionConfig):
    canary      both versions have >= min_feedback labelled requests: canary AUC >= stable AUC - kpi_margin
                and canary CTR >= stable CTR * (1 - ctr_margin) -> promote, else rollback; fewer -> wait
    retrain     any feature drifts (PSI >= psi_alarm) or the predictions do, or the stable version's
                feedback AUC falls below its gate AUC (its baseline) by more than baseline_margin (the
                loop then trains from scratch on the last `retrain_windows` windows, or on the latest
                window alone when only a KPI fell: a concept drift, where older windows mislead)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field


class Action(enum.Enum):
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    WAIT = "wait"


@dataclass(frozen=True)
class DecisionConfig:
    min_feedback: int = 200
    kpi_margin: float = 0.005
    ctr_margin: float = 0.5
    baseline_margin: float = 0.03
    psi_alarm: float = 0.2

    def __post_init__(self) -> None:
        if self.min_feedback < 1:
            raise ValueError(f"DecisionConfig: min_feedback must be >= 1, got {self.min_feedback}")
        for name in ("kpi_margin", "ctr_margin", "baseline_margin", "psi_alarm"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"DecisionConfig: {name} must be a finite number >= 0, got {v}")


@dataclass(frozen=True)
class Kpis:
    """Labelled feedback of one version: count, AUC, CTR (observed), mean prediction, calibration."""

    count: int
    auc: float
    ctr: float
    mean_prediction: float

    @property
    def calibration(self) -> float:
        return self.mean_prediction / self.ctr if self.ctr > 0 else math.nan


@dataclass(frozen=True)
class Observation:
    """What the monitor saw in one window: KPIs per role ("stable", "canary") and drift per feature (PSI)."""

    kpis: Mapping[str, Kpis] = field(default_factory=dict)
    drift: Mapping[str, float] = field(default_factory=dict)  # feature (or "prediction") -> PSI


def decide_canary(obs: Observation, config: DecisionConfig) -> tuple[Action, str]:
    stable, canary = obs.kpis.get("stable"), obs.kpis.get("canary")
    counts = [0 if k is None else k.count for k in (stable, canary)]
    if stable is None or canary is None or min(counts) < config.min_feedback:
        return Action.WAIT, f"feedback stable {counts[0]}, canary {counts[1]} < min_feedback {config.min_feedback}"
    if not (math.isfinite(canary.auc) and math.isfinite(stable.auc)):
        return Action.WAIT, f"AUC undefined on the feedback (stable {stable.auc}, canary {canary.auc})"
    worse = []
    if canary.auc < stable.auc - config.kpi_margin:
        worse.append(f"AUC {canary.auc:.4f} < stable {stable.auc:.4f} - {config.kpi_margin}")
    if canary.ctr < stable.ctr * (1 - config.ctr_margin):
        worse.append(f"CTR {canary.ctr:.4f} < stable {stable.ctr:.4f} x (1 - {config.ctr_margin})")
    if worse:
        return Action.ROLLBACK, "canary worse: " + "; ".join(worse)
    return Action.PROMOTE, f"canary AUC {canary.auc:.4f} >= stable {stable.auc:.4f} - {config.kpi_margin}"


@dataclass(frozen=True)
class Retrain:
    """Why to retrain from scratch; `concept`: only a KPI fell (no feature drifted), so the hidden relation
    changed and windows before the change would teach the old one: retrain on the latest window alone."""

    reason: str
    concept: bool


def retrain_reason(obs: Observation, baseline_auc: float | None, config: DecisionConfig) -> Retrain | None:
    """Why the stable model needs a full retraining, or None."""
    drifted = [
        f"drift in {name} (PSI {psi:.3f} >= {config.psi_alarm})"
        for name, psi in obs.drift.items()
        if psi >= config.psi_alarm
    ]
    reasons = list(drifted)
    stable = obs.kpis.get("stable")
    if (
        stable is not None
        and baseline_auc is not None
        and stable.count >= config.min_feedback
        and stable.auc < baseline_auc - config.baseline_margin
    ):
        reasons.append(f"stable AUC {stable.auc:.4f} below its baseline {baseline_auc:.4f} - {config.baseline_margin}")
    return Retrain("; ".join(reasons), not drifted) if reasons else None
