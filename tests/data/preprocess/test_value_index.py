import gc

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.stats import _CACHE, cached
from hugerec.data.preprocess.value_index import ValueIndex, index_of


def _reference(values: list, query: list) -> list[int]:
    rows = {v: i for i, v in enumerate(values)}
    return [rows.get(q, -1) for q in query]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=20)), unique=True, max_size=50),
    st.lists(st.one_of(st.none(), st.text(max_size=20)), max_size=50),
)
def test_strings_match_dict(values, query):
    index = ValueIndex.build(pl.Series(values, dtype=pl.String))
    assert index.lookup(pl.Series(query, dtype=pl.String)).tolist() == _reference(values, query)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.text(max_size=4)), unique=True, max_size=50),
    st.lists(st.one_of(st.none(), st.text(max_size=4), st.just("abc\0"), st.just("123456789")), max_size=50),
)
def test_short_strings_are_indexed_packed_and_match_dict(values, query):
    index = ValueIndex.build(pl.Series(values, dtype=pl.String))
    assert index.packed == all(v is None or ("\0" not in v and len(v.encode()) <= 8) for v in values)
    assert index.lookup(pl.Series(query, dtype=pl.String)).tolist() == _reference(values, query)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), unique=True, max_size=50),
    st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=50),
)
def test_integers_match_dict(values, query):
    index = ValueIndex.build(pl.Series(values, dtype=pl.Int64))
    assert index.lookup(pl.Series(query, dtype=pl.Int64)).tolist() == _reference(values, query)


def test_strings_sharing_a_head_and_length_are_told_apart():
    values = ["prefix00-a", "prefix00-b", "ab", "ab\x00"]
    index = ValueIndex.build(pl.Series(values))
    assert index.lookup(pl.Series(["prefix00-b", "prefix00-c", "ab\x00", "ab", "a"])).tolist() == [1, -1, 3, 2, -1]


def test_query_of_another_dtype_is_cast_or_rejected():
    index = ValueIndex.build(pl.Series([1, 2, 3], dtype=pl.Int64))
    assert index.lookup(pl.Series([3, 9], dtype=pl.Int32)).tolist() == [2, -1]
    with pytest.raises(ValueError, match="fitted dtype"):
        index.lookup(pl.Series(["x"]))


def test_floats_use_canonical_bits():
    index = ValueIndex.build(pl.Series([0.0, float("nan"), 2.5]))
    assert index.lookup(pl.Series([-0.0, float("nan"), 2.5, 3.0])).tolist() == [0, 1, 2, -1]


def test_cache_builds_once_per_frame_and_forgets_dead_frames():
    frame = pl.DataFrame({"value": ["a", "b"]})
    assert index_of(frame) is index_of(frame)
    calls = []
    cached(frame, "x", lambda f: calls.append(1) or np.zeros(1))
    cached(frame, "x", lambda f: calls.append(1) or np.zeros(1))
    assert calls == [1]
    other = pl.DataFrame({"value": ["b", "a"]})
    assert index_of(other).lookup(pl.Series(["a"])).tolist() == [1]
    key = id(frame)
    assert key in _CACHE
    del frame
    gc.collect()
    assert key not in _CACHE
