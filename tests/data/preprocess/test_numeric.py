import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.numeric import Bucketize, Clip, FillMissing, FillStrategy, LogOp, Normalize

ints = st.lists(st.one_of(st.none(), st.integers(-1000, 10**6)), min_size=1, max_size=30)


def _fit(op, *frames):
    return op.finalize(op.merge([op.fit(f) for f in frames]))


def test_fill_missing_constant_keeps_integers_and_adds_indicator():
    frame = pl.DataFrame({"i": [1, None, 3], "f": [0.5, float("nan"), None]})
    out = FillMissing(["i", "f"], value=0, add_indicator=True).transform(frame, {})
    assert out["i"].to_list() == [1, 0, 3] and out.schema["i"] == pl.Int64
    assert out["f"].to_list() == [0.5, 0.0, 0.0]
    assert out["i_missing"].to_list() == [False, True, False] and out["f_missing"].to_list() == [False, True, True]
    assert FillMissing("i", value=0.5).transform(frame, {})["i"].to_list() == [1.0, 0.5, 3.0]


@settings(max_examples=40, deadline=None)
@given(st.lists(ints, min_size=1, max_size=4))
def test_fill_missing_mean_uses_the_mean_of_the_whole_dataset(parts):
    op = FillMissing("x", strategy=FillStrategy.MEAN)
    assert op.stateful
    frames = [pl.DataFrame({"x": pl.Series(p, dtype=pl.Int64)}) for p in parts]
    stats = _fit(op, *frames)
    present = [v for p in parts for v in p if v is not None]
    mean = float(np.mean(present)) if present else 0.0
    got = op.transform(pl.concat(frames), stats)["x"].to_numpy()
    expected = np.array([mean if v is None else v for p in parts for v in p], dtype=np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_clip_and_log():
    frame = pl.DataFrame({"x": [-5, 0, 7, None]})
    assert Clip("x", min_value=0, max_value=5).transform(frame, {})["x"].to_list() == [0, 0, 5, None]
    assert Clip("x", max_value=2.5).transform(frame, {})["x"].to_list() == [-5.0, 0.0, 2.5, None]
    logged = LogOp("x").transform(frame, {})
    assert logged.schema["x"] == pl.Float32
    np.testing.assert_allclose(logged["x"].to_numpy()[:3], np.log1p(np.maximum([-5, 0, 7], 0)), rtol=1e-6)
    assert logged["x"][3] is None
    with pytest.raises(ValueError, match="min_value 3 > max_value 1"):
        Clip("x", min_value=3, max_value=1)
    with pytest.raises(ValueError, match="expected a numeric column"):
        LogOp("s").transform(pl.DataFrame({"s": ["a"]}), {})


@settings(max_examples=40, deadline=None)
@given(st.lists(ints, min_size=1, max_size=4))
def test_normalize_matches_numpy_and_merges_exactly(parts):
    op = Normalize("x")
    frames = [pl.DataFrame({"x": pl.Series(p, dtype=pl.Int64)}) for p in parts]
    stats = _fit(op, *frames)
    whole = pl.concat(frames)
    present = np.array([v for p in parts for v in p if v is not None], dtype=np.float64)
    mean = present.mean() if present.size else 0.0
    std = present.std() if present.size and present.std() > 0 else 1.0
    got = op.transform(whole, stats)["x"].to_numpy()
    expected = np.array([np.nan if v is None else (v - mean) / std for p in parts for v in p])
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats["moments"]["mean"][0], _fit(op, whole)["moments"]["mean"][0], rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.just(float("nan")), st.floats(-100, 100)), max_size=30),
    st.lists(st.floats(-50, 50), min_size=1, max_size=6, unique=True),
)
def test_bucketize_matches_searchsorted(values, bounds):
    bounds = sorted(bounds)
    op = Bucketize("x", boundaries=bounds)
    got = op.transform(pl.DataFrame({"x": pl.Series(values, dtype=pl.Float64)}), {})["x"].to_list()
    expected = [0 if v is None or v != v else 1 + int(np.searchsorted(bounds, v, side="right")) for v in values]
    assert got == expected
    assert op.cardinality == len(bounds) + 2
    assert max(got, default=0) < op.cardinality


def test_bucketize_rejects_unsorted_boundaries():
    with pytest.raises(ValueError, match="strictly increasing"):
        Bucketize("x", boundaries=(1.0, 1.0))
