"""repartition: hash-partition a dataset by key columns, so every group lies in one partition.

DifferenceLag and Groupby see one partition at a time; they are exact across a whole dataset only
when all rows of a group (a user, a session) share a partition. A two-phase shuffle on the engine
arranges that, never holding more than one input chunk or one output partition in memory:

    map      each input partition -> bucket = stable_hash(key columns) % P -> tmp/bucket-b/from-i-j.parquet
    reduce   each bucket b -> its rows, sorted by (key, sort_by) -> output_dir/part-b.parquet
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from hugerec.data.preprocess.dataset import Dataset, Format, Partition, read_chunks
from hugerec.data.preprocess.engine import Engine, run_tasks
from hugerec.data.preprocess.errors import OnError, SkipReport
from hugerec.data.preprocess.hashing import combine_hashes, hash_series
from hugerec.data.preprocess.op import as_columns

SHUFFLE_SEED = 0x5EED


def bucket_of(frame: pl.DataFrame, by: Sequence[str], num_partitions: int) -> np.ndarray:
    """[R] int64 bucket of each row: stable hash of the key columns' values % num_partitions."""
    hashes = [hash_series(frame[c], SHUFFLE_SEED) for c in by]
    combined = combine_hashes(hashes, SHUFFLE_SEED) if frame.height else np.zeros(0, dtype=np.uint64)
    return (combined % np.uint64(num_partitions)).astype(np.int64)


@dataclass(frozen=True)
class _Shuffle:
    by: tuple[str, ...]
    sort_by: tuple[str, ...]
    num_partitions: int
    tmp_dir: str
    output_dir: str
    schema: dict[str, pl.DataType]
    on_error: OnError


def _map_task(job: _Shuffle, partition: Partition) -> SkipReport:
    report = SkipReport()
    for j, chunk in enumerate(read_chunks(partition, job.on_error)):
        report = report.merge(chunk.report)
        frame = chunk.frame.with_columns(pl.Series("__bucket", bucket_of(chunk.frame, job.by, job.num_partitions)))
        for (bucket,), rows in frame.partition_by("__bucket", as_dict=True, include_key=False).items():
            folder = Path(job.tmp_dir) / f"bucket-{bucket:05d}"
            folder.mkdir(exist_ok=True)
            rows.write_parquet(folder / f"from-{partition.index:05d}-{j:05d}.parquet")
    return report


def _reduce_task(job: _Shuffle, bucket: int) -> tuple[str, int]:
    folder = Path(job.tmp_dir) / f"bucket-{bucket:05d}"
    files = sorted(folder.glob("*.parquet")) if folder.exists() else []
    frame = pl.read_parquet(files) if files else pl.DataFrame(schema=job.schema)
    frame = frame.sort([*job.by, *job.sort_by], maintain_order=True, nulls_last=True)
    path = str(Path(job.output_dir) / f"part-{bucket:05d}.parquet")
    frame.write_parquet(path)
    if folder.exists():
        shutil.rmtree(folder)
    return path, frame.height


def repartition(
    dataset: Dataset,
    by: str | Sequence[str],
    output_dir: str | Path,
    *,
    num_partitions: int,
    sort_by: str | Sequence[str] = (),
    engine: Engine = None,
    on_error: OnError | str = OnError.RAISE,
) -> Dataset:
    """Rewrite `dataset` as `num_partitions` Parquet files in which all rows with equal `by` values
    share a file, sorted by (`by`, `sort_by`); returns it as a Dataset with `partitioned_by=by`.
    Pick num_partitions so that one output file fits comfortably in a worker's memory."""
    keys = as_columns(by, "repartition", "by")
    order = as_columns(sort_by, "repartition", "sort_by") if sort_by else ()
    if num_partitions < 1:
        raise ValueError(f"repartition: num_partitions must be >= 1, got {num_partitions}")
    missing = [c for c in (*keys, *order) if c not in dataset.schema]
    if missing:
        raise ValueError(f"repartition: unknown column(s) {missing}; the dataset has {list(dataset.schema)}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("part-*.parquet")):
        raise ValueError(f"repartition: {out} already holds part files")
    tmp = out / "_shuffle"
    tmp.mkdir(exist_ok=True)
    job = _Shuffle(keys, order, num_partitions, str(tmp), str(out), dataset.schema, OnError(on_error))
    try:
        for _ in run_tasks(_map_task, job, dataset.partitions(), engine):
            pass
        paths = [path for path, _ in run_tasks(_reduce_task, job, list(range(num_partitions)), engine)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Dataset(paths, format=Format.PARQUET, schema=dataset.schema, partitioned_by=keys)
