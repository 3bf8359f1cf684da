"""hugerec.data.prepare and input_spec: splits fitted on train only, joins, raw files through a fitted
workflow, and the fit/transform type mismatch that used to map values to OOV ids without a word."""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from hugerec.data.criteo import TSV
from hugerec.data.input_spec import ColumnSpec, InputFormat, InputSpec, infer_spec
from hugerec.data.prepare import Join, SplitKind, SplitSpec, cutoff_seconds, prepare, transform_raw
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.readers import read
from hugerec.data.schema import Schema

EVENTS = InputSpec(
    InputFormat.CSV,
    ",",
    header=True,
    columns=(
        ColumnSpec("user", "int", "user"),
        ColumnSpec("item", "string", "item"),
        ColumnSpec("time", "timestamp", format="%Y-%m-%d %H:%M:%S"),
        ColumnSpec("clicked", "int", "label"),
    ),
)


def _events(path: Path, n: int = 300) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    start = datetime.datetime(2024, 1, 1)
    frame = pl.DataFrame(
        {
            "user": rng.integers(0, 20, n),
            "item": [f"i{k}" for k in rng.integers(0, 30, n)],
            "time": [(start + datetime.timedelta(hours=int(h))).strftime("%Y-%m-%d %H:%M:%S") for h in range(n)],
            "clicked": rng.integers(0, 2, n),
        }
    )
    frame.write_csv(path)
    return frame


def _read(folder: Path) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for f in sorted(folder.glob("*.parquet"))])


def test_time_split_by_last_days_and_cutoff(tmp_path: Path) -> None:
    _events(tmp_path / "e.csv")  # 300 hourly events from 2024-01-01 00:00: the last is 2024-01-13 11:00
    report = prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.TIME, last_days=1))
    assert (report.train_rows, report.eval_rows) == (276, 24)  # 2024-01-12 11:00 and later
    report = prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.TIME, cutoff="2024-01-13"))
    assert (report.train_rows, report.eval_rows) == (288, 12)
    report = prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.TIME, eval_fraction=0.1))
    assert (report.train_rows, report.eval_rows) == (270, 30)  # neither: the latest eval_fraction of the rows
    with pytest.raises(ValueError, match=r'takes one of time_cutoff \(.*\) and last_days, not both'):
        SplitSpec(SplitKind.TIME, cutoff="2024-01-13", last_days=1)
    assert cutoff_seconds("2024-01-13") == cutoff_seconds(int(datetime.datetime(2024, 1, 13, tzinfo=datetime.UTC).timestamp()))


def test_leave_last_out_holds_out_each_users_last_rows(tmp_path: Path) -> None:
    frame = _events(tmp_path / "e.csv")
    prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.LEAVE_LAST_OUT, holdout=2))
    counts = frame.group_by("user").len()
    expected = int(counts.filter(pl.col("len") > 2).height * 2)
    assert pq.read_metadata(next((tmp_path / "out" / "eval").glob("*.parquet"))).num_rows <= expected
    assert sum(pq.read_metadata(f).num_rows for f in (tmp_path / "out" / "eval").glob("*.parquet")) == expected


def test_test_split_holds_out_train_eval_and_test_from_one_file(tmp_path: Path) -> None:
    """Paper cut 7: a three-way split of one input, each kind applying its rule once more for test."""
    frame = _events(tmp_path / "e.csv")  # 300 hourly events, 2024-01-01 00:00 .. 2024-01-13 11:00
    path, out = str(tmp_path / "e.csv"), tmp_path / "out"
    report = prepare(EVENTS, path, out, split=SplitSpec(SplitKind.TIME, last_days=1, test_split=True))
    assert (report.train_rows, report.eval_rows, report.test_rows) == (252, 24, 24)  # test: the last day; eval: the one before
    report = prepare(EVENTS, path, out, split=SplitSpec(SplitKind.TIME, eval_fraction=0.1, test_split=True))
    assert (report.train_rows, report.eval_rows, report.test_rows) == (240, 30, 30)
    report = prepare(EVENTS, path, out, split=SplitSpec(SplitKind.RANDOM, eval_fraction=0.2, test_split=True))
    assert report.train_rows + report.eval_rows + report.test_rows == 300
    assert 40 <= report.eval_rows <= 80 and 40 <= report.test_rows <= 80
    plain = prepare(EVENTS, path, out, split=SplitSpec(SplitKind.RANDOM, eval_fraction=0.2))
    assert plain.eval_rows == report.eval_rows and plain.test_rows == 0  # the same eval rows as without a test part
    assert not (out / "test").exists()

    prepare(EVENTS, path, out, split=SplitSpec(SplitKind.LEAVE_LAST_OUT, holdout=2, test_split=True))
    counts = frame.group_by("user").len()
    users = counts.filter(pl.col("len") > 4).height  # more than 2 * holdout rows: both parts
    parts = {part: _read(out / part) for part in ("train", "eval", "test")}
    assert parts["eval"].height == parts["test"].height == 2 * users
    assert sum(p.height for p in parts.values()) == 300
    assert parts["eval"]["user"].value_counts()["count"].to_list() == [2] * users  # two rows of each such user
    assert sorted(parts["test"]["user"].unique().to_list()) == sorted(parts["eval"]["user"].unique().to_list())


@pytest.mark.parametrize(
    ("split", "message"),
    [
        (dict(kind=SplitKind.FILES), 'split = "files" takes the test rows from test_input'),
        (dict(kind=SplitKind.TIME, cutoff="2024-01-13"), "one time_cutoff cannot cut twice"),
        (dict(kind=SplitKind.RANDOM, eval_fraction=0.5), r"eval and test take eval_fraction each, which must be in \(0, 0.5\), got 0.5"),
    ],
)
def test_test_split_mistakes_name_the_key(split: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=f"test_split: {message}"):
        SplitSpec(**split, test_split=True)  # type: ignore[arg-type]


def test_test_split_and_test_input_are_one_or_the_other(tmp_path: Path) -> None:
    _events(tmp_path / "e.csv")
    with pytest.raises(ValueError, match=r"preprocess\.test_split: the test rows come from test_input"):
        prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(test_split=True), test_paths=str(tmp_path / "e.csv"))


def test_the_workflow_is_fitted_on_train_only(tmp_path: Path) -> None:
    """An item seen only in the eval part gets the out-of-vocabulary id: its value never reached the fit."""
    frame = _events(tmp_path / "e.csv")
    late = frame.with_columns(pl.lit("only_late").alias("item")).tail(5)
    pl.concat([frame.head(295), late]).write_csv(tmp_path / "e.csv")
    prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.TIME, cutoff="2024-01-13 07:00:00"))
    workflow = Workflow.load(tmp_path / "out" / "workflow")
    vocab = workflow.stats[-1]
    assert vocab is not None and "only_late" not in str(vocab)
    assert set(_read(tmp_path / "out" / "eval")["item"].to_list()) == {1}  # OOV


def test_given_files_and_a_join(tmp_path: Path) -> None:
    _events(tmp_path / "train.csv")
    _events(tmp_path / "eval.csv", 40)
    users = pl.DataFrame({"user": list(range(15)), "country": ["fr", "de", "jp"] * 5})
    users.write_csv(tmp_path / "users.csv")
    side = InputSpec(columns=(ColumnSpec("user", "int", "user"), ColumnSpec("country", "string")))
    report = prepare(
        EVENTS,
        str(tmp_path / "train.csv"),
        tmp_path / "out",
        split=SplitSpec(SplitKind.FILES),
        eval_paths=str(tmp_path / "eval.csv"),
        joins=[Join(side, str(tmp_path / "users.csv"), "user")],
    )
    assert (report.train_rows, report.eval_rows) == (300, 40)
    schema = Schema.load(tmp_path / "out" / "schema.json")
    assert schema.sparse_names == ("user", "item", "country")
    assert 0 in _read(tmp_path / "out" / "train")["country"].to_list()  # users 15..19 have no row: null id
    bad_side = InputSpec(columns=(ColumnSpec("user", "string", "user"), ColumnSpec("country", "string")))
    with pytest.raises(ValueError, match="join on 'user': the input reads it as Int64, the side table as String"):
        prepare(EVENTS, str(tmp_path / "train.csv"), tmp_path / "o2", split=SplitSpec(SplitKind.FILES),
                eval_paths=str(tmp_path / "eval.csv"), joins=[Join(bad_side, str(tmp_path / "users.csv"), "user")])


def test_raw_rows_through_the_fitted_workflow_match_the_shards(tmp_path: Path) -> None:
    _events(tmp_path / "e.csv")
    prepare(EVENTS, str(tmp_path / "e.csv"), tmp_path / "out", split=SplitSpec(SplitKind.FILES), eval_paths=str(tmp_path / "e.csv"))
    workflow = Workflow.load(tmp_path / "out" / "workflow")
    transform_raw(EVENTS, str(tmp_path / "e.csv"), workflow, tmp_path / "raw_eval", "data.eval")
    assert _read(tmp_path / "raw_eval").equals(_read(tmp_path / "out" / "eval"))


def test_a_type_mismatch_between_fit_and_transform_is_an_error_naming_the_column(tmp_path: Path) -> None:
    """The silent corruption of #13: a vocabulary fitted on Criteo's hex ids as text, then rows read by
    `readers.read` (hex parsed to Int64), mapped 88.6% of the values to the OOV id. Now: an error."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(200):
        dense = [str(int(v)) for v in rng.integers(0, 50, 13)]
        sparse = [f"{int(v):08x}" for v in rng.integers(0, 40, 26)]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *dense, *sparse]))
    (tmp_path / "day.tsv").write_text("\n".join(lines) + "\n")
    prepare(InputSpec.criteo(), str(tmp_path / "day.tsv"), tmp_path / "out", split=SplitSpec(eval_fraction=0.2))
    workflow = Workflow.load(tmp_path / "out" / "workflow")
    frame, _ = read(str(tmp_path / "day.tsv"), Schema.criteo(), csv=TSV)  # C1..C26 parsed to Int64
    with pytest.raises(ValueError, match=r"column 'C1' holds Int64 but the workflow was fitted on String"):
        workflow.transform_frame(frame)
    as_text = frame.with_columns(pl.col(f"C{i}").map_elements(lambda v: f"{v:08x}", pl.String) for i in range(1, 27))
    out = workflow.transform_frame(as_text)
    assert (out["C1"] > 1).mean() > 0.9  # read as the fit read them: ids, not OOV
    with pytest.raises(ValueError, match="column 'I1' holds String"):
        workflow.transform_frame(frame.with_columns(pl.col("I1").cast(pl.String)))


def test_infer_spec_guesses_and_refuses(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("label,price,city,when\n1,2.5,paris,2024-01-01T10:00:00Z\n0,1.0,rome,2024-01-02T11:00:00Z\n")
    spec = infer_spec(tmp_path / "a.csv")
    assert [(c.name, c.type.value, c.role_value) for c in spec.columns] == [
        ("label", "int", "label"),
        ("price", "float", "dense"),
        ("city", "string", "categorical"),
        ("when", "timestamp", "timestamp"),
    ]
    assert spec.column("when").format == "%Y-%m-%dT%H:%M:%S%.fZ"  # fractions of a second optional
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ValueError, match="empty file"):
        infer_spec(tmp_path / "empty.csv")
    with pytest.raises(ValueError, match="is a folder"):
        infer_spec(tmp_path)
