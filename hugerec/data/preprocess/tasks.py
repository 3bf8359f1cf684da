"""What a worker runs on one partition: a fit pass (partial statistics) or a transform (a Parquet
shard), plus the column rules the workflow's pass planning shares with them.

Tasks take the workflow inside a small job object, so the engine ships it once per worker.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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

MERGE_BATCH = 4  # partial statistics merged at once (bounds memory and repeated merging of a growing whole)


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
    row_group_size: int  # at most this many rows per row group
    groups_per_chunk: int  # at least this many row groups per chunk written (as its rows allow)
    schema: pl.Schema  # of the output (computed once, not per partition)


def _frames(partition: Partition, on_error: OnError, whole: bool) -> list[tuple[pl.DataFrame, int, SkipReport]]:
    if whole:
        frame, report = read_partition(partition, on_error)
        return [(frame, 0, report)]
    return [(c.frame, c.row_offset, c.report) for c in read_chunks(partition, on_error)]


def fit_task(job: FitJob, partitions: Sequence[Partition]) -> tuple[dict[int, Stats], SkipReport]:
    """Partial statistics of the pass's ops over a group of partitions, merged here (a few chunks at
    a time), so the driver merges one result per group."""
    wf = job.workflow
    parts: dict[int, list[Stats]] = {i: [] for i in job.to_fit}
    report = SkipReport()
    last = max(job.to_fit)
    for partition in partitions:
        for frame, offset, chunk_report in _frames(partition, job.on_error, job.whole_partitions):
            report = report.merge(chunk_report)
            frame = with_row_ids(frame, partition.index, offset)
            dirty: set[str] = set()  # columns that do not hold their final value in `frame` this pass
            for i, op in enumerate(wf.ops[: last + 1]):
                reads = set(fit_reads(op))
                if reads & dirty or (op.stateful and i not in job.to_fit and wf.stats[i] is None):
                    dirty |= set(op.writes())
                elif i in job.to_fit:
                    parts[i].append(cast(FittableOp, op).fit(frame))
                    if len(parts[i]) > MERGE_BATCH:
                        parts[i] = [cast(FittableOp, op).merge(parts[i])]
                    dirty |= set(op.writes())
                else:
                    frame = wf.apply_op(i, frame)
    merged = {i: cast(FittableOp, wf.ops[i]).merge(p) for i, p in parts.items() if p}
    return merged, report


def transform_task(job: TransformJob, partition: Partition) -> tuple[str, int, SkipReport]:
    wf, schema = job.workflow, job.schema
    path = os.path.join(job.output_dir, f"part-{partition.index:05d}.parquet")
    rows, report = 0, SkipReport()
    with pq.ParquetWriter(path, pl.DataFrame(schema=schema).to_arrow().schema) as writer:
        for frame, offset, chunk_report in _frames(partition, job.on_error, job.whole_partitions):
            report = report.merge(chunk_report)
            if job.out_of_fold:
                frame = with_row_ids(frame, partition.index, offset)
            out = wf.apply_ops(frame).cast(dict(schema.items()))
            size = min(job.row_group_size, max(1, -(-out.height // job.groups_per_chunk)))
            writer.write_table(out.to_arrow(), row_group_size=size)
            rows += out.height
    return path, rows, report
