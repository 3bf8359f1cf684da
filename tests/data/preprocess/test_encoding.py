import numpy as np
import pandas as pd
import polars as pl
import pytest

from hugerec.data.preprocess.encoding import CountEncoding, TargetEncoding
from hugerec.data.preprocess.hashing import hash_value_reference
from hugerec.data.preprocess.op import ROW_ID


def _frame(n: int = 400, seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    cats = rng.choice(["a", "b", "c", "d", None], n, p=[0.4, 0.3, 0.2, 0.05, 0.05])
    y = (rng.random(n) < np.where(cats == "a", 0.7, 0.2)).astype(np.float64)
    return pl.DataFrame(
        {"c": pl.Series(cats.tolist(), dtype=pl.String), "y": y, ROW_ID: pl.Series(np.arange(n), dtype=pl.UInt64)}
    )


def _fit(op, *frames):
    return op.finalize(op.merge([op.fit(f) for f in frames]))


def _te_reference(train: pd.DataFrame, values: list, m: float) -> np.ndarray:
    labelled = train[train["y"].notna()]
    prior = labelled["y"].mean() if len(labelled) else 0.0
    grouped = labelled.groupby("c", dropna=False)["y"].agg(["sum", "count"])
    out = []
    for v in values:
        key = np.nan if v is None else v
        s, n = (grouped.loc[key, "sum"], grouped.loc[key, "count"]) if key in grouped.index else (0.0, 0)
        out.append((s + m * prior) / (n + m))
    return np.array(out)


def test_full_statistics_match_pandas_and_merge():
    frame = _frame()
    op = TargetEncoding("c", target="y", smoothing=5.0)
    stats = _fit(op, frame[:150], frame[150:])
    assert stats["c"].equals(_fit(op, frame)["c"])
    query = pl.DataFrame({"c": ["a", "b", None, "never seen"]})
    got = op.transform(query, stats)["c_te"].to_numpy()
    expected = _te_reference(frame.drop(ROW_ID).to_pandas(), ["a", "b", None, "never seen"], 5.0)
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-6)


def test_out_of_fold_uses_only_the_other_folds():
    frame = _frame()
    op = TargetEncoding("c", target="y", k_folds=4, smoothing=3.0, seed=9)
    stats = _fit(op, frame)
    got = op.transform(frame, stats)["c_te"].to_numpy()
    df = frame.to_pandas()
    folds = np.array([hash_value_reference(int(r), 9) % 4 for r in df[ROW_ID]])
    expected = np.empty(len(df))
    for f in range(4):
        rows = folds == f
        expected[rows] = _te_reference(df[~rows], df.loc[rows, "c"].tolist(), 3.0)
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=1e-6)


def test_no_target_leakage_out_of_fold():
    frame = _frame()
    op = TargetEncoding("c", target="y", k_folds=5, smoothing=1.0)
    before = op.transform(frame, _fit(op, frame))["c_te"].to_numpy()
    for row in (0, 17, 123):
        flipped = frame.with_columns(pl.Series("y", frame["y"].to_numpy().copy()).scatter(row, 1 - frame["y"][row]))
        after = op.transform(flipped, _fit(op, flipped))["c_te"].to_numpy()
        assert after[row] == before[row]  # its own label never reaches its feature
        assert not np.array_equal(after, before)  # but it does reach the other folds' rows
    leaky = op.transform(frame.drop(ROW_ID), _fit(op, frame))["c_te"].to_numpy()
    assert not np.allclose(leaky, before)


def test_null_targets_are_not_counted_and_config_is_checked():
    frame = _frame().with_columns(pl.when(pl.col("c") == "a").then(None).otherwise(pl.col("y")).alias("y"))
    op = TargetEncoding("c", target="y", smoothing=0.0)
    stats = _fit(op, frame)
    assert "a" not in stats["c"]["value"].to_list()  # every "a" row has a null target
    prior = frame["y"].drop_nulls().mean()
    assert op.transform(pl.DataFrame({"c": ["a"]}), stats)["c_te"][0] == pytest.approx(prior, rel=1e-6)
    with pytest.raises(ValueError, match="k_folds"):
        TargetEncoding("c", target="y", k_folds=1)
    with pytest.raises(ValueError, match="other than the encoded"):
        TargetEncoding("c", target="c")
    with pytest.raises(ValueError, match="row ids"):
        op.fit(frame.drop(ROW_ID))


def test_count_encoding_matches_value_counts():
    frame = _frame()
    op = CountEncoding("c")
    stats = _fit(op, frame[:100], frame[100:])
    query = pl.DataFrame({"c": ["a", None, "zzz"]})
    counts = frame.to_pandas()["c"].value_counts(dropna=False)
    expected = [counts["a"], counts[counts.index.isna()].iloc[0], 0]
    assert op.transform(query, stats)["c_count"].to_list() == expected
    assert op.transform(query.clear(), stats).schema["c_count"] == pl.Int64
