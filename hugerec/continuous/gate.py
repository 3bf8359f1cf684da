"""The validation gate: whether a candidate may reach users, from its figures and the serving model's.

Thresholds are data (GateConfig). A ranking (CTR) candidate brings `auc`, `logloss`, `calibration` and
`count` (training.trainer.evaluate's figures); a retrieval or sequential candidate brings `recall@K`
for the gate's `recall_k` and `users` or `queries` (training.evaluate of a
RetrievalValidation or NextItemValidation: the project's full-catalogue ranking metrics). The candidate
and the serving model are measured on the same holdout. A candidate passes when every check holds:
    finite      the candidate's figures are finite (no NaN / inf)
    rows        the holdout has at least `min_rows` examples (users or queries for a ranking holdout)
    auc         candidate AUC >= serving AUC - auc_margin (skipped when nothing serves yet)
    calibration calibration (mean prediction / observed CTR) in [calibration_low, calibration_high]
    recall      candidate Recall@K >= serving Recall@K - recall_margin (skipped when nothing serves yet)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

CTR_FIGURES = ("auc", "logloss", "calibration")


@dataclass(frozen=True)
class GateConfig:
    """The validation gate's thresholds: a candidate passes when every check holds (see the module docstring)."""

    auc_margin: float = 0.005  # the candidate's AUC may be at most this much below the serving model's
    calibration_low: float = 0.8  # mean prediction / observed CTR must be at least this
    calibration_high: float = 1.25  # ... and at most this
    min_rows: int = 100  # holdout examples needed to judge (users or queries for a retrieval holdout)
    recall_k: int = 20  # retrieval and sequential candidates: the K of the Recall@K compared
    recall_margin: float = 0.01  # the candidate's Recall@K may be at most this much below the serving model's

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
        if isinstance(self.recall_k, bool) or not isinstance(self.recall_k, int) or self.recall_k < 1:
            raise ValueError(f"GateConfig: recall_k must be an integer >= 1, got {self.recall_k!r}")
        if not (math.isfinite(self.recall_margin) and 0 <= self.recall_margin <= 1):
            raise ValueError(f"GateConfig: recall_margin must be a number in [0, 1], got {self.recall_margin}")

    @property
    def recall_key(self) -> str:
        return f"recall@{self.recall_k}"


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str  # "ok", or every failed check, "; "-separated
    figures: dict[str, float]  # candidate_auc, serving_auc, candidate_calibration, ..., rows


def _kind(figures: Mapping[str, float], config: GateConfig, who: str) -> tuple[str, ...]:
    """The figures the gate checks for this candidate: the CTR ones, or Recall@K."""
    if all(k in figures for k in CTR_FIGURES):
        return CTR_FIGURES
    if config.recall_key in figures:
        return (config.recall_key,)
    raise ValueError(
        f"gate: the {who} figures {sorted(figures)} hold neither {list(CTR_FIGURES)} nor {config.recall_key!r} "
        f"(gate.recall_k = {config.recall_k})"
    )


def _rows(figures: Mapping[str, float], who: str) -> float:
    for key in ("count", "users", "queries"):
        if key in figures:
            return float(figures[key])
    raise ValueError(f"gate: the {who} figures {sorted(figures)} hold no row count ('count', 'users' or 'queries')")


def check(candidate: Mapping[str, float], serving: Mapping[str, float] | None, config: GateConfig) -> GateResult:
    """Gate a candidate on its holdout figures against the serving model's on the same holdout (None: nothing
    serves yet). CTR figures: auc, logloss, calibration, count; ranking figures: recall@K, users or queries."""
    keys = _kind(candidate, config, "candidate")
    if serving is not None and _kind(serving, config, "serving") != keys:
        raise ValueError(
            f"gate: the candidate brings {list(keys)} but the serving model {list(_kind(serving, config, 'serving'))}; "
            "a candidate is gated against a model of its own kind"
        )
    figures = {f"candidate_{k}": float(candidate[k]) for k in keys}
    rows = _rows(candidate, "candidate")
    figures["rows"] = rows
    if "ctr" in candidate and math.isfinite(float(candidate["ctr"])):  # for the AUC's standard error (decisions.py)
        figures["positives"] = float(round(float(candidate["ctr"]) * rows))
    if serving is not None:
        figures.update({f"serving_{k}": float(serving[k]) for k in keys})
    failed = []
    bad = [k for k in keys if not math.isfinite(float(candidate[k]))]
    if bad:
        failed.append(f"candidate {', '.join(bad)} not finite")
    if rows < config.min_rows:
        failed.append(f"holdout has {int(rows)} rows < min_rows {config.min_rows}")
    if keys == CTR_FIGURES:
        if serving is not None and not bad:
            floor = float(serving["auc"]) - config.auc_margin
            if not float(candidate["auc"]) >= floor:
                failed.append(f"AUC {candidate['auc']:.4f} < serving {serving['auc']:.4f} - margin {config.auc_margin}")
        cal = float(candidate["calibration"])
        if "calibration" not in bad and not config.calibration_low <= cal <= config.calibration_high:
            failed.append(f"calibration {cal:.3f} outside [{config.calibration_low}, {config.calibration_high}]")
    elif serving is not None and not bad:
        key = config.recall_key
        if not float(candidate[key]) >= float(serving[key]) - config.recall_margin:
            failed.append(
                f"Recall@{config.recall_k} {candidate[key]:.4f} < serving {serving[key]:.4f} - margin {config.recall_margin}"
            )
    return GateResult(not failed, "; ".join(failed) or "ok", figures)
