"""SplitList, ListSlice, ParseTime and Binarize against plain-Python references (hypothesis for the edges)."""

from __future__ import annotations

import datetime

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.lists import ListSlice, SplitList
from hugerec.data.preprocess.numeric import Binarize
from hugerec.data.preprocess.temporal import ParseTime
from hugerec.data.preprocess.workflow import Workflow


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(st.lists(st.integers(-5, 5), max_size=6), min_size=1, max_size=8),
    start=st.integers(-7, 7),
    end=st.one_of(st.none(), st.integers(-7, 7)),
)
def test_list_slice_is_python_slicing(lists: list[list[int]], start: int, end: int | None) -> None:
    if end is not None and start >= 0 and 0 <= end <= start:
        with pytest.raises(ValueError, match="must be after start"):
            ListSlice(["x"], start, end)
        return
    frame = pl.DataFrame({"x": lists}, schema={"x": pl.List(pl.Int64)})
    out = ListSlice(["x"], start, end).transform(frame, {})["x"].to_list()
    assert out == [v[start:end] for v in lists]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.sampled_from(["a", "b", "c d", "é"]), min_size=1, max_size=4)), min_size=1))
def test_split_list_is_str_split(values: list[list[str] | None]) -> None:
    text = [None if v is None else "|".join(v) for v in values]
    out = SplitList(["g"]).transform(pl.DataFrame({"g": text}, schema={"g": pl.String}), {})["g"].to_list()
    assert out == [None if t is None else t.split("|") for t in text]
    assert SplitList(["g"]).transform(pl.DataFrame({"g": [""]}), {})["g"].to_list() == [[]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.datetimes(datetime.datetime(1971, 1, 1), datetime.datetime(2100, 1, 1)), min_size=1, max_size=20))
def test_parse_time_matches_datetime(stamps: list[datetime.datetime]) -> None:
    expected = [int(s.replace(tzinfo=datetime.UTC).timestamp()) for s in stamps]
    text = pl.DataFrame({"t": [s.strftime("%Y-%m-%d %H:%M:%S") for s in stamps]})
    assert ParseTime(["t"], "%Y-%m-%d %H:%M:%S").transform(text, {})["t"].to_list() == expected
    ms = pl.DataFrame({"t": [int(s.replace(tzinfo=datetime.UTC).timestamp() * 1000) for s in stamps]})
    assert ParseTime(["t"], "unix_ms").transform(ms, {})["t"].to_list() == [m // 1000 for m in ms["t"].to_list()]
    seconds = pl.DataFrame({"t": [e + 0.5 for e in expected]})
    assert ParseTime(["t"], "unix").transform(seconds, {})["t"].to_list() == expected


def test_parse_time_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="column 't' value '2024-13-45' does not match"):
        ParseTime(["t"], "%Y-%m-%d").transform(pl.DataFrame({"t": ["2024-01-02", "2024-13-45"]}), {})
    with pytest.raises(ValueError, match="neither 'unix'"):
        ParseTime(["t"], "YYYY-MM-DD")


def test_binarize() -> None:
    frame = pl.DataFrame({"r": [1, 4, None, 5, 3]})
    assert Binarize(["r"], 4).transform(frame, {})["r"].to_list() == [0.0, 1.0, None, 1.0, 0.0]


def test_every_op_round_trips_through_a_flat_spec() -> None:
    """Workflow.to_spec -> Workflow.from_spec: what [[preprocess.ops]] tables say, for every op the library has."""
    spec = [
        {"op": "ParseTime", "columns": ["t"], "format": "%Y-%m-%d"},
        {"op": "SplitList", "columns": ["tags"], "separator": ";"},
        {"op": "FillMissing", "columns": ["price"], "value": 1.0, "strategy": "mean", "add_indicator": True},
        {"op": "Clip", "columns": ["price"], "min_value": 0.0, "max_value": 100.0},
        {"op": "LogOp", "columns": ["price"]},
        {"op": "Normalize", "columns": ["price"]},
        {"op": "Bucketize", "columns": ["age"], "boundaries": [18.0, 30.0, 50.0]},
        {"op": "Binarize", "columns": ["rating"], "threshold": 4.0},
        {"op": "Categorify", "columns": ["user", "tags"], "freq_threshold": 2, "max_size": 100, "num_tail_buckets": 4},
        {"op": "HashBucket", "columns": ["zip"], "num_buckets": 1000},
        {"op": "HashedCross", "columns": ["user", "zip"], "num_buckets": 500, "name": "user_x_zip"},
        {"op": "TargetEncoding", "columns": ["zip"], "target": "rating", "k_folds": 3},
        {"op": "CountEncoding", "columns": ["zip"]},
        {"op": "CyclicTime", "columns": ["t"], "features": ["hour"]},
        {"op": "DifferenceLag", "columns": ["t"], "group_by": ["user"], "sort_by": "t", "shifts": [1]},
        {"op": "ListSlice", "columns": ["tags"], "start": -3},
        {"op": "Groupby", "group_by": ["user"], "aggregations": [["tags", "list"], ["price", "mean"]], "sort_by": "t"},
    ]
    workflow = Workflow.from_spec(spec)
    again = Workflow.from_spec(workflow.to_spec())
    assert again.to_config() == workflow.to_config()
    assert {e["op"] for e in workflow.to_spec()} >= {
        "Categorify", "HashBucket", "HashedCross", "TargetEncoding", "CountEncoding", "FillMissing", "LogOp",
        "Normalize", "Bucketize", "CyclicTime", "DifferenceLag", "Groupby", "ListSlice",
    }
    with pytest.raises(ValueError, match=r"ops\[0\]\.bins: Bucketize has no parameter 'bins'"):
        Workflow.from_spec([{"op": "Bucketize", "columns": ["a"], "bins": [1.0]}])
