"""The validation gate: whether a candidate may reach users, from its figures and the serving model's.

Thresholds are data (GateConfig). A candidate passes when every check holds:
    finite      AUC, logloss and calibration of the candidate are finite (no NaN / inf)
    rows        the holdout has at least `min_rows` examples
    auc         candidate AUC >= serving AUC - auc_margin (skipped when nothing serves yet)
    calibration calibration (mean prediction / observed CTR) in [calibration_low, calibration_high]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GateConfig:
    auc_margin: float = 0.005
    calibration_low: float = 0.8
    calibration_high: float = 1.25
    min_rows: int = 100

    def __post_init__(self) -> None:
        if not (math.isfinite(self.auc_margin) and self.auc_margin >= 0):
            raise ValueError(f"GateConfig: auc_margin must be a finite number >= 0, got {self.auc_margin}")
        if not 0 < self.calibration_low <= 1 <= self.calibration_high:
            raise ValueError(
                "GateConfig: need 0 < calibration_low <= 1 <= calibration_high, got "
                f"{self.calibration_low}, {self.calibration_high}"
            )
        if self.min_rows < 1:
            raise ValueError(f"GateConfig: min_rows must be >= 1, got {self.min_rows}")


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str  # "ok", or every failed check, "; "-separated
    figures: dict[str, float]  # candidate_auc, serving_auc, candidate_calibration, ..., rows


def check(candidate: Mapping[str, float], serving: Mapping[str, float] | None, config: GateConfig) -> GateResult:
    """Gate a candidate on its holdout figures (auc, logloss, calibration, count) against the serving model's
    on the same holdout (None: nothing serves yet)."""
    figures = {f"candidate_{k}": float(candidate[k]) for k in ("auc", "logloss", "calibration")}
    figures["rows"] = float(candidate["count"])
    if serving is not None:
        figures.update({f"serving_{k}": float(serving[k]) for k in ("auc", "logloss", "calibration")})
    failed = []
    bad = [k for k in ("auc", "logloss", "calibration") if not math.isfinite(float(candidate[k]))]
    if bad:
        failed.append(f"candidate {', '.join(bad)} not finite")
    if candidate["count"] < config.min_rows:
        failed.append(f"holdout has {int(candidate['count'])} rows < min_rows {config.min_rows}")
    if serving is not None and not bad:
        floor = float(serving["auc"]) - config.auc_margin
        if not float(candidate["auc"]) >= floor:
            failed.append(f"AUC {candidate['auc']:.4f} < serving {serving['auc']:.4f} - margin {config.auc_margin}")
    cal = float(candidate["calibration"])
    if "calibration" not in bad and not config.calibration_low <= cal <= config.calibration_high:
        failed.append(f"calibration {cal:.3f} outside [{config.calibration_low}, {config.calibration_high}]")
    return GateResult(not failed, "; ".join(failed) or "ok", figures)
