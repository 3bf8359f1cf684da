"""What a worker runs on one partition: a fit pass (partial statistics) or a transform (a Parquet
shard), plus the column rules the workflow's pass planning shares with them.

Tasks take the workflow inside a small job object, so the engine ships it once per worker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import polars as pl
import pyarrow.parquet as pq

from hugerec.data.preprocess.dataset import Partition, read_chunks, read_partition
from hugerec.data.preprocess.encoding import TargetEncoding
from hugerec.data.preprocess.errors import OnError, SkipReport
from hugerec.data.preprocess.grouping import Groupby
from hugerec.data.preprocess.op import ROW_ID, FittableOp, Op
from hugerec.data.preprocess.stats import Stats
from hugerec.data.preprocess.temporal import DifferenceLag

if TYPE_CHECKING:
    from hugerec.data.preprocess.workflow import Workflow


def fit_reads(op: Op) -> tuple[str, ...]:
    return op.fit_reads() if isinstance(op, TargetEncoding) else op.reads()


def group_keys(op: Op) -> tuple[str, ...] | None:
    match op:
        case DifferenceLag() | Groupby():
            return op.group_by
        case _:
            return None


def with_row_ids(frame: pl.DataFrame, partition: int, offset: int) -> pl.DataFrame:
    start = (partition << 40) + offset
    return frame.with_columns(pl.int_range(start, start + frame.height, dtype=pl.UInt64).alias(ROW_ID))


@dataclass(frozen=True)
class FitJob:
    workflow: Workflow
    to_fit: tuple[int, ...]  # ops whose partial statistics this pass gathers
    on_error: OnError
    whole_partitions: bool


@dataclass(frozen=True)
class TransformJob:
    workflow: Workflow
    output_dir: str
    on_error: OnError
    out_of_fold: bool
    whole_partitions: bool
    row_group_size: int


def _frames(partition: Partition, on_error: OnError, whole: bool) -> list[tuple[pl.DataFrame, int, SkipReport]]:
    if whole:
        frame, report = read_partition(partition, on_error)
        return [(frame, 0, report)]
    return [(c.frame, c.row_offset, c.report) for c in read_chunks(partition, on_error)]


def fit_task(job: FitJob, partition: Partition) -> tuple[dict[int, Stats], SkipReport]:
    wf = job.workflow
    partial: dict[int, Stats] = {}
    report = SkipReport()
    last = max(job.to_fit)
    for frame, offset, chunk_report in _frames(partition, job.on_error, job.whole_partitions):
        report = report.merge(chunk_report)
        frame = with_row_ids(frame, partition.index, offset)
        dirty: set[str] = set()  # columns that do not hold their final value in `frame` this pass
        for i, op in enumerate(wf.ops[: last + 1]):
            reads = set(fit_reads(op))
            if reads & dirty or (op.stateful and i not in job.to_fit and wf.stats[i] is None):
                dirty |= set(op.writes())
            elif i in job.to_fit:
                stats = cast(FittableOp, op).fit(frame)
                partial[i] = cast(FittableOp, op).merge([partial[i], stats]) if i in partial else stats
                dirty |= set(op.writes())
            else:
                frame = wf.apply_op(i, frame)
    return partial, report


def transform_task(job: TransformJob, partition: Partition) -> tuple[str, int, SkipReport]:
    wf = job.workflow
    schema = wf.output_schema()
    path = os.path.join(job.output_dir, f"part-{partition.index:05d}.parquet")
    rows, report = 0, SkipReport()
    with pq.ParquetWriter(path, pl.DataFrame(schema=schema).to_arrow().schema) as writer:
        for frame, offset, chunk_report in _frames(partition, job.on_error, job.whole_partitions):
            report = report.merge(chunk_report)
            if job.out_of_fold:
                frame = with_row_ids(frame, partition.index, offset)
            out = wf.apply_ops(frame).cast(dict(schema.items()))
            writer.write_table(out.to_arrow(), row_group_size=job.row_group_size)
            rows += out.height
    return path, rows, report
