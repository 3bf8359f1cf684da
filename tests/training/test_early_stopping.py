import math
from typing import Any

import pytest

from hugerec.training.early_stopping import BestTracker, EarlyStopping


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"metric": "accuracy"}, "unknown metric 'accuracy'"),
        ({"patience": 0}, "patience"),
        ({"min_delta": -1.0}, "min_delta"),
    ],
)
def test_early_stopping_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EarlyStopping(**kwargs)


def test_min_delta_and_direction() -> None:
    auc = BestTracker(EarlyStopping(metric="auc", patience=2, min_delta=0.01))
    assert auc.update({"auc": 0.70}) and auc.update({"auc": 0.705}) and auc.bad_evals == 1  # best, not a gain
    assert auc.update({"auc": 0.72}) and auc.bad_evals == 0  # 0.02 over the mark 0.70
    assert not auc.update({"auc": float("nan")}) and not auc.update({"auc": 0.5}) and auc.stopped
    loss = BestTracker(EarlyStopping(metric="logloss", patience=1))
    assert loss.update({"logloss": 0.5}) and loss.update({"logloss": 0.4}) and not loss.update({"logloss": 0.45})
    assert loss.stopped and loss.best == {"logloss": 0.4}
    with pytest.raises(ValueError, match="no 'auc'"):
        BestTracker(EarlyStopping()).update({"logloss": 0.3})


def test_state_round_trips_and_a_resume_with_another_patience_decides_by_it() -> None:
    tracker = BestTracker(EarlyStopping(patience=3))
    for auc in (0.7, 0.69, 0.68):
        tracker.update({"step": 1.0, "auc": auc})
    state = tracker.state_dict()
    same = BestTracker(EarlyStopping(patience=3))
    same.load_state_dict(state)
    assert (same.best, same.bad_evals, same.stopped) == (tracker.best, 2, False)
    shorter = BestTracker(EarlyStopping(patience=2))
    shorter.load_state_dict(state)
    assert shorter.stopped
    with pytest.raises(ValueError, match="tracked 'auc'"):
        BestTracker(EarlyStopping(metric="logloss")).load_state_dict(state)


def test_a_nan_best_is_replaced_by_any_number() -> None:
    tracker = BestTracker(EarlyStopping(patience=None))
    assert not tracker.update({"auc": math.nan}) and tracker.best is None
    assert tracker.update({"auc": 0.5}) and not tracker.stopped


def test_the_best_evaluation_is_kept_when_its_gain_is_under_min_delta() -> None:
    """Paper cut 4: eval AUC 0.6900, 0.6917, 0.6923 with min_delta 0.001 kept 0.6917 as the best (best.pt).
    The best is now the best value by any margin; only the patience asks for more than min_delta."""
    tracker = BestTracker(EarlyStopping(metric="auc", patience=2, min_delta=0.001))
    assert tracker.update({"step": 1.0, "auc": 0.6900}) and tracker.update({"step": 2.0, "auc": 0.6917})
    assert tracker.update({"step": 3.0, "auc": 0.6923})  # the new best: best.pt is written
    assert tracker.best == {"step": 3.0, "auc": 0.6923} and tracker.bad_evals == 1 and not tracker.stopped
    assert tracker.update({"step": 4.0, "auc": 0.6926}) and tracker.stopped  # 0.0009 over the mark 0.6917
    assert tracker.best == {"step": 4.0, "auc": 0.6926}
    resumed = BestTracker(EarlyStopping(metric="auc", patience=3, min_delta=0.001))
    resumed.load_state_dict(tracker.state_dict())
    assert (resumed.best, resumed.mark, resumed.bad_evals) == (tracker.best, 0.6917, 2)
    old = {k: v for k, v in tracker.state_dict().items() if k != "mark"}  # a checkpoint written before the mark
    resumed.load_state_dict(old)
    assert resumed.mark == 0.6926

