import datetime as dt

import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.temporal import CyclicTime, DifferenceLag, TimeFeature, TimeUnit


def test_cyclic_time_from_epoch_seconds_matches_numpy():
    stamps = [0, 6 * 3600 + 1800, 3 * 86400 + 23 * 3600, None]  # Thu 00:00, Thu 06:30, Sun 23:00 (UTC)
    out = CyclicTime("t").transform(pl.DataFrame({"t": stamps}), {})
    hours = np.array([0.0, 6.5, 23.0])
    weekday = np.array([3, 3, 6])  # Monday = 0
    np.testing.assert_allclose(out["t_hour_sin"][:3].to_numpy(), np.sin(2 * np.pi * hours / 24), atol=1e-6)
    np.testing.assert_allclose(out["t_hour_cos"][:3].to_numpy(), np.cos(2 * np.pi * hours / 24), atol=1e-6)
    np.testing.assert_allclose(out["t_dow_sin"][:3].to_numpy(), np.sin(2 * np.pi * weekday / 7), atol=1e-6)
    np.testing.assert_allclose(out["t_dow_cos"][:3].to_numpy(), np.cos(2 * np.pi * weekday / 7), atol=1e-6)
    assert out["t_hour_sin"][3] is None and out.schema["t_dow_cos"] == pl.Float32


def test_cyclic_time_on_datetimes_and_milliseconds_agree():
    when = dt.datetime(2024, 5, 17, 13, 45)
    epoch_ms = int(when.replace(tzinfo=dt.UTC).timestamp() * 1000)
    op_ms = CyclicTime("t", features=("hour",), unit=TimeUnit.MILLISECONDS)
    from_ms = op_ms.transform(pl.DataFrame({"t": [epoch_ms]}), {})
    from_dt = CyclicTime("t", features=(TimeFeature.HOUR_OF_DAY,)).transform(pl.DataFrame({"t": [when]}), {})
    assert from_ms["t_hour_sin"][0] == pytest.approx(from_dt["t_hour_sin"][0], abs=1e-6)
    assert op_ms.writes() == ("t_hour_sin", "t_hour_cos")
    with pytest.raises(ValueError, match="Datetime or integer epoch"):
        CyclicTime("t").transform(pl.DataFrame({"t": ["x"]}), {})


def test_difference_lag_matches_pandas_groupby_diff():
    rng = np.random.default_rng(0)
    frame = pl.DataFrame({"user": rng.integers(0, 5, 60), "ts": rng.permutation(60), "x": rng.random(60)})
    out = DifferenceLag("x", group_by="user", sort_by="ts", shifts=(1, 2, -1)).transform(frame, {})
    df = frame.to_pandas().sort_values("ts")
    for shift, name in ((1, "x_lag1"), (2, "x_lag2"), (-1, "x_lead1")):
        expected = df.groupby("user")["x"].diff(shift).sort_index()  # x - x.shift(shift), as ours
        np.testing.assert_allclose(out[name].to_numpy(), expected.to_numpy(), equal_nan=True)
    assert out["user"].equals(frame["user"])  # row order kept


def test_difference_lag_of_datetimes_is_in_seconds_and_config_checked():
    frame = pl.DataFrame({"u": [1, 1], "t": [dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, 0, 1, 30)]})
    out = DifferenceLag("t", group_by="u", sort_by="t").transform(frame, {})
    assert out["t_lag1"].to_list() == [None, 90.0]
    with pytest.raises(ValueError, match="non-zero"):
        DifferenceLag("x", group_by="u", sort_by="t", shifts=(0,))
