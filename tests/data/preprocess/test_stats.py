import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.stats import count_values, merge_counts, merge_moments, moments, moments_of

floats = st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False), st.just(float("nan")))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(floats, max_size=20), min_size=1, max_size=5))
def test_merged_moments_equal_moments_of_the_whole(parts):
    frames = [pl.DataFrame({"x": pl.Series(p, dtype=pl.Float64)}) for p in parts]
    merged = merge_moments([moments(f, ["x"]) for f in frames])
    n, mean, std = moments_of(merged, "x")
    values = np.array([v for p in parts for v in p if v is not None and v == v], dtype=np.float64)
    assert n == values.size
    if values.size:
        np.testing.assert_allclose(mean, values.mean(), rtol=1e-9, atol=1e-6)
        np.testing.assert_allclose(std, values.std(), rtol=1e-6, atol=1e-5)
    else:
        assert (mean, std) == (0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.one_of(st.none(), st.sampled_from("abcde")), max_size=15), min_size=1, max_size=5))
def test_merged_counts_equal_counts_of_the_whole(parts):
    frames = [
        pl.DataFrame({"k": pl.Series(p, dtype=pl.String), "y": pl.Series(range(len(p)), dtype=pl.Int64)}) for p in parts
    ]
    merged = merge_counts([count_values(f, ["k"], ["y"]) for f in frames], ["k"]).collect().sort("k", nulls_last=True)
    whole = count_values(pl.concat(frames), ["k"], ["y"]).sort("k", nulls_last=True)
    assert merged.equals(whole)


def test_moments_of_an_unknown_column_raises():
    stats = moments(pl.DataFrame({"x": [1.0, 2.0]}), ["x"])
    assert moments_of(stats, "x") == (2, 1.5, 0.5)
    try:
        moments_of(stats, "nope")
    except KeyError as e:
        assert "nope" in str(e)
    else:
        raise AssertionError("expected KeyError")
