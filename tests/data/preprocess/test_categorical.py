import pandas as pd
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.categorical import FIRST_VOCAB_ID, NULL_ID, OOV_ID, Categorify, HashBucket, HashedCross
from hugerec.data.preprocess.hashing import combine_reference, hash_value_reference


def _fit(op: Categorify, *frames: pl.DataFrame) -> dict[str, pl.DataFrame]:
    return op.finalize(op.merge([op.fit(f) for f in frames]))


def _categorify_reference(train: list, test: list, threshold: int, max_size: int | None) -> list[int]:
    """The documented id layout, written with pandas."""
    counts = pd.Series(train, dtype=object).dropna().value_counts().rename("count").reset_index()
    counts.columns = ["value", "count"]
    counts = counts[counts["count"] >= threshold].sort_values(["count", "value"], ascending=[False, True])
    if max_size is not None:
        counts = counts.head(max_size)
    ids = {v: FIRST_VOCAB_ID + i for i, v in enumerate(counts["value"])}
    return [NULL_ID if v is None else ids.get(v, OOV_ID) for v in test]


values = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d", "e", "ff", "ggg"]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(values, max_size=25), min_size=1, max_size=4),
    st.lists(values, max_size=20),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(0, 5)),
)
def test_categorify_matches_pandas_reference(parts, test, threshold, max_size):
    op = Categorify("c", freq_threshold=threshold, max_size=max_size)
    frames = [pl.DataFrame({"c": pl.Series(p, dtype=pl.String)}) for p in parts]
    stats = _fit(op, *frames)
    got = op.transform(pl.DataFrame({"c": pl.Series(test, dtype=pl.String)}), stats)["c"].to_list()
    assert got == _categorify_reference([v for p in parts for v in p], test, threshold, max_size)
    whole = _fit(op, pl.concat(frames))
    assert stats["c"].equals(whole["c"])  # merged statistics == statistics of the whole
    assert op.cardinality(stats, "c") == FIRST_VOCAB_ID + stats["c"].height


def test_tail_buckets_hash_out_of_vocabulary_values():
    op = Categorify("c", freq_threshold=2, num_tail_buckets=5, seed=3)
    stats = _fit(op, pl.DataFrame({"c": ["a", "a", "b", "c"]}))
    got = op.transform(pl.DataFrame({"c": ["a", "b", "zzz", None]}), stats)["c"].to_list()
    tail = [FIRST_VOCAB_ID + 1 + hash_value_reference(v, 3) % 5 for v in ("b", "zzz")]
    assert got == [FIRST_VOCAB_ID, *tail, NULL_ID]
    assert op.cardinality(stats, "c") == FIRST_VOCAB_ID + 1 + 5


def test_integer_and_list_columns():
    op = Categorify(["n", "tags"])
    frame = pl.DataFrame({"n": [5, 5, 7, None], "tags": [["x", "y"], [], None, ["y", None, "z"]]})
    stats = _fit(op, frame)
    out = op.transform(frame, stats)
    assert out["n"].to_list() == [2, 2, 3, 0]
    assert out["tags"].to_list() == [[3, 2], [], None, [2, 0, 4]]  # y is most frequent; ties by value
    assert out.schema["tags"] == pl.List(pl.Int64)
    empty = op.transform(frame.clear(), stats)
    assert empty.schema == out.schema and empty.height == 0


def test_config_is_validated():
    with pytest.raises(ValueError, match="freq_threshold"):
        Categorify("c", freq_threshold=0)
    with pytest.raises(ValueError, match="at least one column"):
        Categorify([])
    with pytest.raises(ValueError, match="duplicates"):
        Categorify(["a", "a"])
    assert Categorify(["a", "b"]).columns == ("a", "b")


def test_hash_bucket_matches_reference():
    op = HashBucket(["s", "n"], num_buckets=7, seed=1)
    frame = pl.DataFrame({"s": ["a", None, "bc"], "n": [3, 4, None]})
    out = op.transform(frame, {})
    assert out["s"].to_list() == [1 + hash_value_reference("a", 1) % 7, 0, 1 + hash_value_reference("bc", 1) % 7]
    assert out["n"].to_list() == [1 + hash_value_reference(3, 1) % 7, 1 + hash_value_reference(4, 1) % 7, 0]
    lists = op.transform(pl.DataFrame({"s": [["a"], []], "n": [[3], None]}), {})
    assert lists["s"].to_list() == [[1 + hash_value_reference("a", 1) % 7], []]


def test_hashed_cross_matches_reference_and_keeps_nulls_as_values():
    op = HashedCross(["u", "i"], num_buckets=1000, seed=2)
    assert op.writes() == ("u_x_i",)
    frame = pl.DataFrame({"u": ["a", "a", None], "i": [1, None, 1]})
    got = op.transform(frame, {})["u_x_i"].to_list()
    expected = [
        combine_reference([hash_value_reference(u, 2), hash_value_reference(i, 2)], 2) % 1000
        for u, i in [("a", 1), ("a", None), (None, 1)]
    ]
    assert got == expected
    with pytest.raises(ValueError, match="at least two columns"):
        HashedCross(["u"], 10)
    with pytest.raises(ValueError, match="list column"):
        op.transform(pl.DataFrame({"u": [["a"]], "i": [1]}), {})
