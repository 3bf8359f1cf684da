"""Early stopping: track the best evaluation by one metric, stop after `patience` evaluations without a gain.

    EarlyStopping(metric="auc", patience=2)      what to watch (a TrainConfig field, plain data)
    tracker = BestTracker(config)                its state during one `fit`; state_dict() goes into checkpoints
    tracker.update({"auc": 0.77, ...}, step=120) -> True when this evaluation is the new best

The direction of each metric is known (AUC up, logloss down, every ranking metric @K up), so the config
only names the metric; left unnamed (None) it is the model family's (auc for ranking, recall@10 for
retrieval and sequential models).
The best evaluation (kept as best.pt) is the best value seen, by any margin; patience counts the
evaluations since the last one that beat its predecessor mark by more than `min_delta` (a gain
smaller than that is kept as the best but does not reset the patience). A NaN metric (say, an AUC on
a single-class evaluation set) never improves and counts as a bad evaluation.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from dataclasses import dataclass
from typing import Any


class Direction(enum.Enum):
    MAX = "max"
    MIN = "min"


# metric name (a key of `evaluate`'s result) -> which way is better
METRICS: dict[str, Direction] = {"auc": Direction.MAX, "logloss": Direction.MIN}
# the retrieval and next-item metrics at a cutoff K (ranking_metrics.list_metrics, next_item.rank_metrics)
AT_K = re.compile(r"^(recall|ndcg|mrr|hitrate|coverage)@([1-9][0-9]*)$")


def direction(metric: str) -> Direction:
    """Which way `metric` improves; ValueError naming the known metrics when it is none of them."""
    if metric in METRICS:
        return METRICS[metric]
    if AT_K.match(metric):
        return Direction.MAX
    raise ValueError(
        f"metric: unknown metric {metric!r}; expected one of {sorted(METRICS)} or recall|ndcg|mrr|hitrate|coverage@K"
    )


@dataclass(frozen=True)
class EarlyStopping:
    """Which evaluation is the best, and when to stop (the [train.early_stopping] section).

    metric        "auc" (higher is better) or "logloss" (lower is better) for ranking models; "recall@K",
                  "ndcg@K", "mrr@K", "hitrate@K" (higher is better) for retrieval and sequential ones; from
                  the evaluation on eval_data. None: the model family's default
    patience      stop after this many evaluations in a row without a new best (None: never stop early,
                  still keep the best)
    min_delta     a gain of more than this restarts the patience (0.001: on MovieLens-100K the valid
                  AUC kept creeping up by ~0.0001 an epoch for 20+ epochs after it had settled); a smaller
                  gain is still kept as the best
    restore_best  at the end of `fit`, load the best evaluation's weights back into the model (the last
                  checkpoint keeps the last weights either way)
    """

    metric: str | None = None
    patience: int | None = 2
    min_delta: float = 0.001
    restore_best: bool = False

    def __post_init__(self) -> None:
        if self.metric is not None:
            direction(self.metric)
        if self.patience is not None and (
            isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1
        ):
            raise ValueError(f"patience: must be an int >= 1 or none, got {self.patience!r}")
        if not (isinstance(self.min_delta, int | float) and self.min_delta >= 0):
            raise ValueError(f"min_delta: must be a number >= 0, got {self.min_delta!r}")

    @property
    def direction(self) -> Direction:
        if self.metric is None:
            raise ValueError("early stopping: no metric named; call for_metric(the family's default) first")
        return direction(self.metric)

    def for_metric(self, default: str) -> EarlyStopping:
        """This config with `default` as its metric when it names none."""
        return self if self.metric is not None else dataclasses.replace(self, metric=default)


class BestTracker:
    """The early-stopping state of one run: the best value, its step and the evaluations since it."""

    def __init__(self, config: EarlyStopping) -> None:
        self.config = config.for_metric("auc")  # a config naming no metric: ranking's, as fit resolves it
        self.best: dict[str, float] | None = None  # the best evaluation's record (step, epoch, metrics)
        self.mark: float | None = None  # the value the last gain of more than min_delta reached
        self.bad_evals = 0
        self.stopped = False

    @property
    def metric(self) -> str:
        assert self.config.metric is not None  # resolved in __init__
        return self.config.metric

    @property
    def best_value(self) -> float | None:
        return None if self.best is None else self.best[self.metric]

    def is_better(self, value: float, than: float | None = None, margin: float = 0.0) -> bool:
        """Whether `value` beats `than` (default: the best value) by more than `margin`."""
        if math.isnan(value):
            return False
        reference = self.best_value if than is None else than
        if reference is None or math.isnan(reference):
            return True
        match self.config.direction:
            case Direction.MAX:
                return value > reference + margin
            case Direction.MIN:
                return value < reference - margin

    def update(self, record: dict[str, float]) -> bool:
        """Account for one evaluation `record` (holding the metric); True when it is the new best (by any
        margin). Patience restarts only on a gain of more than min_delta over the mark."""
        if self.metric not in record:
            raise ValueError(f"early stopping: the evaluation has no {self.metric!r}, only {sorted(record)}")
        value = float(record[self.metric])
        best = self.is_better(value)
        if best:
            self.best = dict(record)
        gain = self.mark is None or self.is_better(value, self.mark, self.config.min_delta)
        if gain and not math.isnan(value):
            self.mark, self.bad_evals = value, 0
            return best
        self.bad_evals += 1
        patience = self.config.patience
        if patience is not None and self.bad_evals >= patience:
            self.stopped = True
        return best

    def state_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "best": None if self.best is None else dict(self.best),
            "mark": self.mark,
            "bad_evals": self.bad_evals,
            "stopped": self.stopped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["metric"] != self.metric:
            raise ValueError(
                f"early stopping: the checkpoint tracked {state['metric']!r}, this run tracks "
                f"{self.metric!r}; resume with the same early_stopping.metric or start a fresh run"
            )
        self.best = None if state["best"] is None else {k: float(v) for k, v in state["best"].items()}
        mark = state.get("mark", self.best_value)  # checkpoints before the mark: the best was the mark
        self.mark = None if mark is None else float(mark)
        self.bad_evals = int(state["bad_evals"])
        patience = self.config.patience  # a resume with another patience: that patience decides
        self.stopped = patience is not None and self.bad_evals >= patience
