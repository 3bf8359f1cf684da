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
    assert auc.update({"auc": 0.70}) and not auc.update({"auc": 0.705}) and auc.update({"auc": 0.72})
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
