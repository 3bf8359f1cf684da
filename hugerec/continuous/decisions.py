"""What the loop does with what the monitor saw: promote or roll back the canary, or retrain from scratch.

Thresholds are data (DecisionConfig):
    canary      both versions have >= min_feedback labelled requests: the canary is rolled back when its AUC
                is below the stable's minus kpi_margin by more than confidence_z standard errors of the
                difference (Hanley-McNeil, from each side's clicks and non-clicks), or its CTR is below
                the stable's x (1 - ctr_margin); otherwise it is promoted; fewer requests -> wait.
                The standard error matters: two equally good versions measured on 400 requests each
                differ in AUC by up to ~0.1 from noise alone, so comparing point estimates rolls back
                good canaries about half the time; confidence_z = 0 compares the point estimates.
                The defaults (min_feedback 200, kpi_margin 0.005, confidence_z 1.645) are kept on purpose:
                the canary check is the second line behind the offline gate (which already compares holdout
                AUCs), there to catch a canary that is broken in serving (skew, a bad feature, a bad delta)
                soon, on little traffic; it is not a test for small regressions. Its power, by the standard
                error above, at AUC 0.7 with feedback per side of
                    200 rows, CTR 0.2 (40 clicks):    rolled back when >= ~0.12 AUC worse
                    200 rows, CTR 0.05 (10 clicks):   ~0.22 (barely above a random model: raise min_feedback)
                    1000 rows, CTR 0.2:               ~0.06;   2000 rows, CTR 0.2: ~0.04
                so below ~40 clicks per side a canary is promoted unless it is close to random, which is
                why min_feedback should be raised for low-CTR traffic (or to catch smaller losses: the
                table), at the cost of waiting longer. kpi_margin only matters once the noise is small
                (thousands of rows): it is the AUC loss tolerated as "as good", the same as the offline
                gate's auc_margin (GateConfig, 0.005), so both lines judge a loss alike; z = 1.645 keeps
                false rollbacks of an equally good canary at ~5% per decision
    retrain     any feature drifts (PSI >= psi_alarm) or the predictions do, or the stable version's
                feedback AUC falls below its gate AUC (its baseline) by more than baseline_margin plus
                confidence_z standard errors of the difference (below_baseline; the
                loop then trains from scratch on the last `retrain_windows` windows, or, when only a KPI
                fell, a concept drift where older windows mislead, runs its recovery: loop.Recovery)
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
    """The thresholds of the canary's promotion or rollback and of a retraining (see the module docstring)."""

    min_feedback: int = 200  # labelled requests each of stable and canary needs before a decision (fewer: wait)
    kpi_margin: float = 0.005  # the AUC loss of the canary against the stable tolerated as "as good"
    ctr_margin: float = 0.5  # the canary is rolled back when its CTR is below the stable's x (1 - ctr_margin)
    baseline_margin: float = 0.03  # the stable's feedback AUC below its gate AUC by more than this (+ the noise): a concept drift
    psi_alarm: float = 0.2  # a feature or the predictions drift when their PSI reaches this
    confidence_z: float = 1.645  # one-sided 95%: an equally good canary is rolled back about 5% of the time

    def __post_init__(self) -> None:
        if self.min_feedback < 1:
            raise ValueError(f"DecisionConfig: min_feedback must be >= 1, got {self.min_feedback}")
        for name in ("kpi_margin", "ctr_margin", "baseline_margin", "psi_alarm", "confidence_z"):
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

    @property
    def positives(self) -> int:
        """Clicked requests among the labelled ones (count x CTR)."""
        return round(self.count * self.ctr) if math.isfinite(self.ctr) else 0

    @property
    def auc_standard_error(self) -> float:
        return auc_standard_error(self.auc, self.positives, self.count - self.positives)


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """Hanley & McNeil (1982): the standard error of an AUC measured on `positives` clicked and `negatives`
    unclicked rows (the exponential approximation of the score distributions); inf without both kinds."""
    if positives < 1 or negatives < 1 or not math.isfinite(auc):
        return math.inf
    q1 = auc / (2 - auc)
    q2 = 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (positives - 1) * (q1 - auc * auc) + (negatives - 1) * (q2 - auc * auc)) / (
        positives * negatives
    )
    return math.sqrt(max(variance, 0.0))


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
    # the standard error of the difference of two AUCs measured on disjoint requests
    se = math.hypot(canary.auc_standard_error, stable.auc_standard_error)
    if canary.auc < stable.auc - config.kpi_margin - config.confidence_z * se:
        worse.append(
            f"AUC {canary.auc:.4f} < stable {stable.auc:.4f} - {config.kpi_margin} by more than "
            f"{config.confidence_z} x the difference's standard error {se:.4f}"
        )
    if canary.ctr < stable.ctr * (1 - config.ctr_margin):
        worse.append(f"CTR {canary.ctr:.4f} < stable {stable.ctr:.4f} x (1 - {config.ctr_margin})")
    if worse:
        return Action.ROLLBACK, "canary worse: " + "; ".join(worse)
    return Action.PROMOTE, (
        f"canary AUC {canary.auc:.4f} not below stable {stable.auc:.4f} - {config.kpi_margin} "
        f"by more than {config.confidence_z} x the difference's standard error {se:.4f}"
    )


@dataclass(frozen=True)
class Retrain:
    """Why to retrain; `concept`: only a KPI fell (no feature drifted), so the hidden relation changed and
    windows before the change would teach the old one: the loop's recovery trains on the windows since."""

    reason: str
    concept: bool


def below_baseline(auc: float, se: float, baseline: float, baseline_se: float, config: DecisionConfig) -> bool:
    """Whether an AUC (standard error `se`) is below its baseline (measured with `baseline_se`) by more than
    baseline_margin plus confidence_z standard errors of the difference: an AUC on a thousand rows moves by
    about 0.02 from noise alone, so a loop on short windows would see a drift in every other window."""
    return auc < baseline - config.baseline_margin - config.confidence_z * math.hypot(se, baseline_se)


def retrain_reason(
    obs: Observation, baseline_auc: float | None, config: DecisionConfig, baseline_se: float = 0.0
) -> Retrain | None:
    """Why the stable model needs a full retraining, or None (`baseline_se`: the standard error of the baseline
    AUC, 0 when it is exact)."""
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
        and below_baseline(stable.auc, stable.auc_standard_error, baseline_auc, baseline_se, config)
    ):
        se = math.hypot(stable.auc_standard_error, baseline_se)
        reasons.append(
            f"stable AUC {stable.auc:.4f} below its baseline {baseline_auc:.4f} - {config.baseline_margin} "
            f"by more than {config.confidence_z} x the difference's standard error {se:.4f}"
        )
    return Retrain("; ".join(reasons), not drifted) if reasons else None
