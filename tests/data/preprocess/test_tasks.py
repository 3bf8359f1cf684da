"""The workers' tasks: a fit pass over partitions gives, merged and finalized, the statistics a fit of the whole
frame gives; a transform task writes one partition's shard as the workflow transforms it, in row groups of at
most the size asked; row ids are partition << 40 | row; the columns an op reads when fitting and the keys it
groups by."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
from polars.testing import assert_frame_equal

from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.dataset import Dataset
from hugerec.data.preprocess.encoding import TargetEncoding
from hugerec.data.preprocess.errors import OnError
from hugerec.data.preprocess.numeric import Normalize
from hugerec.data.preprocess.op import ROW_ID
from hugerec.data.preprocess.tasks import (
    FitJob,
    TransformJob,
    fit_reads,
    fit_task,
    group_keys,
    transform_task,
    with_row_ids,
)
from hugerec.data.preprocess.temporal import DifferenceLag
from hugerec.data.preprocess.workflow import Workflow

A = pl.DataFrame({"c": ["x", "y", "x"], "n": [1.0, 2.0, 3.0]})
B = pl.DataFrame({"c": ["z", "x"], "n": [4.0, 5.0]})


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns)


def test_fit_task_over_partitions_equals_a_fit_of_the_whole() -> None:
    workflow = Workflow([Categorify("c"), Normalize("n")])
    partitions = Dataset.from_frames(A, B).partitions()
    for whole_partitions in (False, True):
        merged, report = fit_task(FitJob(workflow, (0, 1), OnError.RAISE, whole_partitions), partitions)
        assert (report.rows_read, report.rows_skipped) == (5, 0)
        whole = Workflow([Categorify("c"), Normalize("n")]).fit(pl.concat([A, B]))
        for i, op in enumerate(workflow.ops):
            got, want = op.finalize(merged[i]), whole.stats[i]  # type: ignore[attr-defined]
            assert want is not None and set(got) == set(want)
            for name in got:
                assert_frame_equal(_sorted(got[name]), _sorted(want[name]))


def test_a_pass_fits_only_its_ops() -> None:
    workflow = Workflow([Categorify("c"), Normalize("n")])
    merged, _ = fit_task(FitJob(workflow, (1,), OnError.RAISE, False), Dataset.from_frames(A).partitions())
    assert set(merged) == {1}


def test_transform_task_writes_the_partitions_shard(tmp_path: Path) -> None:
    workflow = Workflow([Categorify("c"), Normalize("n")]).fit(pl.concat([A, B]))
    partition = Dataset.from_frames(A, B).partitions()[1]
    job = TransformJob(workflow, str(tmp_path), OnError.RAISE, False, False, 1, 1, workflow.output_schema())
    path, rows, report = transform_task(job, partition)
    assert path == str(tmp_path / "part-00001.parquet") and rows == 2 and (report.rows_read, report.rows_skipped) == (2, 0)
    written = pl.read_parquet(path)
    assert_frame_equal(written, workflow.apply_ops(B).cast(dict(workflow.output_schema().items())))
    assert pq.ParquetFile(path).metadata.num_row_groups == 2  # row groups of at most row_group_size = 1


def test_row_ids_are_partition_and_row() -> None:
    frame = with_row_ids(A, partition=3, offset=10)
    assert frame[ROW_ID].to_list() == [(3 << 40) + 10, (3 << 40) + 11, (3 << 40) + 12]
    assert frame[ROW_ID].dtype == pl.UInt64 and with_row_ids(A.head(0), 0, 0).height == 0


def test_fit_reads_and_group_keys() -> None:
    te = TargetEncoding("c", target="y")
    assert "y" in fit_reads(te) and "y" not in te.reads()
    assert fit_reads(Normalize("n")) == Normalize("n").reads()
    assert group_keys(DifferenceLag(("n",), group_by=("c",), sort_by="n")) == ("c",)
    assert group_keys(Categorify("c")) is None
