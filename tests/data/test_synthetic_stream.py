"""The drifting click stream: the same seed gives the same rows; day d's rows lie in day d, sorted by time;
the positive rate on day 0 is the configured one; churn hands ranks to new ids (none without churn); the
concept drift changes the labels' function from its day (not before) and the feature shift moves the dense
features; bad settings refused naming the value."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from hugerec.data.synthetic_stream import LABEL, SECONDS_PER_DAY, TIME_COLUMN, Stream, StreamConfig

SMALL = {"days": 4, "rows_per_day": 4000, "num_sparse": 2, "num_dense": 2, "vocabulary": 200}


def test_the_same_seed_gives_the_same_rows() -> None:
    a, b = Stream(StreamConfig(**SMALL)).day(1), Stream(StreamConfig(**SMALL)).day(1)
    assert a.table.equals(b.table)
    np.testing.assert_array_equal(a.probability, b.probability)
    assert not a.table.equals(Stream(StreamConfig(**SMALL, seed=1)).day(1).table)


def test_a_day_has_its_columns_times_and_rate() -> None:
    config = StreamConfig(**SMALL, positive_rate=0.3)
    day = Stream(config).day(2)
    assert day.table.column_names == [LABEL, "d0", "d1", "c0", "c1", TIME_COLUMN]
    assert config.schema.names == (LABEL, "d0", "d1", "c0", "c1")
    ts = day.table[TIME_COLUMN].to_numpy()
    assert (np.diff(ts) >= 0).all() and ts.min() >= 2 * SECONDS_PER_DAY and ts.max() < 3 * SECONDS_PER_DAY
    day0 = Stream(config).day(0)
    assert day0.probability.mean() == pytest.approx(0.3, abs=0.02)
    labels = day0.table[LABEL].to_numpy()
    assert labels.mean() == pytest.approx(0.3, abs=0.03)
    assert roc_auc_score(labels, day0.probability) > 0.7  # the oracle: the true probabilities rank the clicks


def test_churn_hands_ranks_to_new_ids() -> None:
    stream = Stream(StreamConfig(**SMALL, churn=0.1))
    assert stream.epochs(0, 0).sum() == 0
    e1, e3 = stream.epochs(0, 1), stream.epochs(0, 3)
    assert (e3 >= e1).all() and 0.05 < e1.mean() < 0.15
    keys = stream.day(3).table["c0"].to_numpy()
    assert (keys >= 200).any()  # some ranks are held by ids born since day 0
    still = Stream(StreamConfig(**SMALL, churn=0.0))
    assert still.epochs(1, 3).sum() == 0 and still.day(3).table["c1"].to_numpy().max() < 200


def test_concept_drift_changes_the_labels_function_from_its_day() -> None:
    base, drifted = (
        Stream(StreamConfig(**SMALL, churn=0.0)),
        Stream(StreamConfig(**SMALL, churn=0.0, concept_drift_day=2)),
    )
    before_a, before_b = base.day(1), drifted.day(1)
    np.testing.assert_array_equal(before_a.probability, before_b.probability)
    after_a, after_b = base.day(2), drifted.day(2)
    assert after_a.table["c0"].equals(after_b.table["c0"])  # same rows ...
    assert np.corrcoef(after_a.probability, after_b.probability)[0, 1] < 0.5  # ... another function of them


def test_feature_shift_moves_half_the_dense_features() -> None:
    stream = Stream(StreamConfig(**{**SMALL, "num_dense": 4}, feature_shift_day=1, feature_shift=2.0))  # type: ignore[arg-type]
    before, after = stream.day(0).table, stream.day(1).table
    assert abs(before["d0"].to_numpy().mean()) < 0.1 and after["d0"].to_numpy().mean() == pytest.approx(2.0, abs=0.1)
    assert abs(after["d3"].to_numpy().mean()) < 0.1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"days": 0}, "days must be >= 1, got 0"),
        ({"num_dense": -1}, "num_dense must be >= 0, got -1"),
        ({"alpha": 0.0}, "alpha and shift_alpha must be > 0, got 0.0, 0.6"),
        ({"churn": 1.0}, r"churn must be in \[0, 1\), got 1.0"),
        ({"concept_drift_share": 1.5}, r"concept_drift_share must be in \[0, 1\], got 1.5"),
        ({"positive_rate": 0.0}, r"positive_rate must be in \(0, 1\), got 0.0"),
        ({"signal": -1.0}, "signal must be >= 0, got -1.0"),
        ({"concept_drift_day": 0}, r"concept_drift_day must be in 1..3 or None, got 0"),
        ({"feature_shift_day": 4}, r"feature_shift_day must be in 1..3 or None, got 4"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamConfig(**{**SMALL, **change})  # type: ignore[arg-type]


def test_a_day_outside_the_stream_is_refused() -> None:
    with pytest.raises(ValueError, match=r"day must be in 0..3, got 4"):
        Stream(StreamConfig(**SMALL)).day(4)
