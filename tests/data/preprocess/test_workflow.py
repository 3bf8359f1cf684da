import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.categorical import Categorify, HashBucket, HashedCross
from hugerec.data.preprocess.dataset import CRITEO_DENSE, CRITEO_SPARSE, Dataset
from hugerec.data.preprocess.encoding import CountEncoding, TargetEncoding
from hugerec.data.preprocess.errors import BadInputError, OnError
from hugerec.data.preprocess.grouping import Groupby
from hugerec.data.preprocess.numeric import Bucketize, Clip, FillMissing, FillStrategy, LogOp, Normalize
from hugerec.data.preprocess.temporal import CyclicTime
from hugerec.data.preprocess.workflow import Workflow

DENSE, SPARSE = list(CRITEO_DENSE), list(CRITEO_SPARSE)


def _criteo_workflow() -> Workflow:
    return Workflow(
        [
            FillMissing(DENSE, value=0),
            Bucketize("I1", boundaries=(0, 1, 10)),
            Clip(DENSE[1:], min_value=0),
            LogOp(DENSE[1:]),
            Normalize(DENSE[1:]),
            CountEncoding("C3"),
            TargetEncoding(["C1", "C2"], target="label", k_folds=3),
            Categorify(SPARSE, freq_threshold=2, num_tail_buckets=4),
            HashedCross(["C1", "C2"], num_buckets=101),
            HashBucket("C5", num_buckets=13),
        ]
    )


def _raw_rows(path: Path) -> list[dict[str, str]]:
    names = ["label", *DENSE, *SPARSE]
    return [dict(zip(names, line.split("\t"), strict=True)) for line in path.read_text().splitlines()]


def test_partitioned_fit_equals_in_memory_fit(criteo_tsv: Path, criteo_frame: pl.DataFrame):
    dataset = Dataset.criteo(criteo_tsv, partition_bytes=70_000)
    assert len(dataset.partitions()) > 5
    parts = _criteo_workflow().fit(dataset, engine=1)
    whole = _criteo_workflow().fit(criteo_frame)
    assert parts._next_pass([not op.stateful for op in parts.ops]) == (4, 5, 6, 7)  # one fit pass
    for a, b in zip(parts.stats, whole.stats, strict=True):
        for name in a or {}:
            if name == "moments":
                np.testing.assert_allclose(a[name].drop("column").to_numpy(), b[name].drop("column").to_numpy())
            elif "count_0" in a[name].columns:  # target encoding: folds differ (row ids are per partition), totals not
                total = pl.sum_horizontal(pl.selectors.starts_with("count_", "sum_")).alias("total")
                assert a[name].select("value", total).sort("value").equals(b[name].select("value", total).sort("value"))
            else:
                assert a[name].equals(b[name]), name
    assert parts.fit_report is not None and (parts.fit_report.rows_read, parts.fit_report.rows_skipped) == (3000, 0)


def test_stateful_chains_take_several_passes(criteo_frame: pl.DataFrame):
    wf = Workflow(
        [FillMissing("I2", strategy=FillStrategy.MEAN), Normalize("I2"), Categorify("C1"), HashedCross(["C1", "I2"], 7)]
    )
    assert wf._next_pass([False, False, False, True]) == (0, 2)
    assert wf._next_pass([True, False, True, True]) == (1,)
    wf.fit(Dataset.from_frames(criteo_frame[:1000], criteo_frame[1000:]), engine=1)
    x = criteo_frame["I2"].to_numpy().astype(float)
    filled = np.where(np.isnan(x), np.nanmean(x), x)
    np.testing.assert_allclose(
        wf.transform_frame(criteo_frame)["I2"].to_numpy(), (filled - filled.mean()) / filled.std(), rtol=1e-4, atol=1e-5
    )


def test_save_load_round_trip_and_request_equivalence(tmp_path: Path, criteo_tsv: Path):
    dataset = Dataset.criteo(criteo_tsv, partition_bytes=200_000)
    wf = _criteo_workflow()
    result = wf.fit_transform(dataset, tmp_path / "out", engine=1)
    wf.save(tmp_path / "wf")
    meta = json.loads((tmp_path / "wf" / "workflow.json").read_text())
    assert [op["op"] for op in meta["ops"]][:2] == ["FillMissing", "Bucketize"]
    assert not list((tmp_path / "wf").rglob("*.pkl"))
    loaded = Workflow.load(tmp_path / "wf")
    assert loaded.ops == wf.ops and loaded.input_schema == wf.input_schema
    for a, b in zip(loaded.stats, wf.stats, strict=True):
        assert (a is None) == (b is None) and all(a[k].equals(b[k]) for k in a or {})
    assert loaded.cardinalities() == wf.cardinalities()
    assert loaded.cardinalities()["C1_x_C2"] == 101 and loaded.cardinalities()["I1"] == 5

    # serving: raw text values, one request at a time or in a list, full (not out-of-fold) statistics
    training = pl.read_parquet(result.paths)
    served = loaded.transform(dataset, tmp_path / "served", engine=1)
    expected = pl.read_parquet(served.paths)
    assert not expected["C1_te"].equals(training["C1_te"])  # training features are out of fold
    assert expected.drop("C1_te", "C2_te").equals(training.drop("C1_te", "C2_te"))
    rows = _raw_rows(criteo_tsv)
    for i in (0, 1, 7, 1234):
        request = {k: v for k, v in rows[i].items() if k != "label"}
        assert loaded.transform_request(request).equals(expected[i].drop("label"))
    batch = loaded.transform_request(rows[10:20])
    assert batch.equals(expected[10:20])
    typed = {k: (None if v == "" else int(v) if k in DENSE else v) for k, v in rows[3].items()}
    assert loaded.transform_request(typed).equals(expected[3])


def test_request_errors_name_the_column(criteo_frame: pl.DataFrame):
    wf = Workflow([Normalize("I1"), Categorify("C1")]).fit(criteo_frame)
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['I99'\]"):
        wf.transform_request({"I99": 1})
    with pytest.raises(ValueError, match="column 'I1' value 'abc' does not convert to Int64"):
        wf.transform_request({"I1": "abc"})
    out = wf.transform_request({"C1": "never seen"})  # a missing key is a missing value
    assert out["C1"].to_list() == [1] and out["I1"].to_list() == [None]


def test_structural_errors():
    frame = pl.DataFrame({"a": [1, 2], "s": ["x", "y"], "t": [10, 20]})
    with pytest.raises(ValueError, match=r"op 1 Normalize reads unknown column\(s\) \['b'\]"):
        Workflow([Categorify("s"), Normalize("b")]).fit(frame)
    with pytest.raises(ValueError, match="must be the last op"):
        Workflow([Groupby("s", {"a": "sum"}), Normalize("a_sum")])
    with pytest.raises(ValueError, match="not fitted"):
        Workflow([Normalize("a")]).transform_frame(frame)
    with pytest.raises(ValueError, match="output_columns"):
        Workflow([Normalize("a")], output_columns=["zz"]).fit(frame)
    wf = Workflow([CyclicTime("t"), Normalize("a")], output_columns=["a", "t_hour_sin"]).fit(frame)
    assert wf.transform_frame(frame).columns == ["a", "t_hour_sin"]
    with pytest.raises(ValueError, match="Normalize"):
        Workflow([Normalize("s")]).fit(frame)


def test_out_of_fold_needs_the_fitted_dataset_and_outputs_are_not_overwritten(
    tmp_path: Path, criteo_tsv: Path, criteo_frame: pl.DataFrame
):
    wf = Workflow([TargetEncoding("C1", target="label")]).fit(Dataset.criteo(criteo_tsv), engine=1)
    other = Dataset.from_frames(criteo_frame)
    with pytest.raises(ValueError, match="exact dataset the workflow was fitted on"):
        wf.transform(other, tmp_path / "o", out_of_fold=True, engine=1)
    wf.transform(other, tmp_path / "o", engine=1)
    with pytest.raises(ValueError, match="overwrite=True"):
        wf.transform(other, tmp_path / "o", engine=1)
    assert wf.transform(other, tmp_path / "o", engine=1, overwrite=True).rows == 3000
    in_memory = Workflow([TargetEncoding("C1", target="label")]).fit_transform(criteo_frame, tmp_path / "f", engine=1)
    out_of_fold = pl.read_parquet(in_memory.paths)["C1_te"]
    assert not out_of_fold.equals(wf.transform_frame(criteo_frame)["C1_te"])  # frames too are encoded out of fold


def test_skip_mode_counts_bad_rows(tmp_path: Path, criteo_tsv: Path):
    lines = criteo_tsv.read_bytes().split(b"\n")
    lines[5] = b"0\tnot-a-number" + lines[5][lines[5].index(b"\t", 2) :]
    lines[9] = b"1\t2\t3"
    criteo_tsv.write_bytes(b"\n".join(lines))
    dataset = Dataset.criteo(criteo_tsv, partition_bytes=100_000)
    with pytest.raises(BadInputError, match="line 6, column 'I1'"):
        Workflow([Normalize("I1")]).fit(dataset, engine=1)
    wf = Workflow([Normalize("I1")]).fit(dataset, engine=1, on_error=OnError.SKIP)
    assert wf.fit_report is not None and (wf.fit_report.rows_read, wf.fit_report.rows_skipped) == (3000, 2)
    assert {e.line for e in wf.fit_report.examples} == {6, 10}
    result = wf.transform(dataset, tmp_path / "o", engine=1, on_error="skip")
    assert (result.rows, result.report.rows_skipped) == (2998, 2)


def test_real_criteo_sample_fit_transform_and_serve(tmp_path: Path, criteo_sample: Path):
    dataset = Dataset.criteo(criteo_sample, partition_bytes=600_000)
    wf = Workflow([FillMissing(DENSE), LogOp(DENSE), Normalize(DENSE), Categorify(SPARSE, freq_threshold=3)])
    out = pl.read_parquet(wf.fit_transform(dataset, tmp_path / "out", engine=1).paths)
    assert out.height == 10_000 and out.select(DENSE).null_count().sum_horizontal().item() == 0
    cards = wf.cardinalities()
    assert all(out[c].max() < cards[c] for c in SPARSE)
    rows = _raw_rows(criteo_sample)
    assert wf.transform_request(rows[:50]).equals(out[:50])


def test_config_round_trips_through_json():
    wf = _criteo_workflow()
    again = Workflow.from_config(json.loads(json.dumps(wf.to_config())))
    assert again.ops == wf.ops and again.output_columns is None
    spec = {"ops": [{"op": "Categorify", "config": {"columns": ["C1"], "freq_threshold": 3}}], "output_columns": ["C1"]}
    assert Workflow.from_config(spec).ops == (Categorify("C1", freq_threshold=3),)
    with pytest.raises(ValueError, match="op 0 is 'Pickle'"):
        Workflow.from_config({"ops": [{"op": "Pickle", "config": {}}]})
    with pytest.raises(ValueError, match="op 0 Normalize"):
        Workflow.from_config({"ops": [{"op": "Normalize", "config": {"colums": ["a"]}}]})
