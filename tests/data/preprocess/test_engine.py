import operator
import os
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.dataset import CRITEO_DENSE, CRITEO_SPARSE, Dataset
from hugerec.data.preprocess.engine import run_tasks
from hugerec.data.preprocess.errors import BadInputError
from hugerec.data.preprocess.numeric import FillMissing, LogOp, Normalize
from hugerec.data.preprocess.workflow import Workflow


def _workflow() -> Workflow:
    dense = list(CRITEO_DENSE)
    return Workflow([FillMissing(dense), LogOp(dense), Normalize(dense), Categorify(list(CRITEO_SPARSE))])


def _assert_same_stats(got: Workflow, expected: Workflow) -> None:
    for a, b in zip(got.stats, expected.stats, strict=True):
        assert (a is None) == (b is None)
        for name in a or {}:
            if name == "moments":  # merged in another order: equal up to rounding
                np.testing.assert_allclose(a[name].drop("column").to_numpy(), b[name].drop("column").to_numpy())
            else:
                assert a[name].equals(b[name]), name


def test_in_process_and_argument_errors():
    assert list(run_tasks(operator.add, 10, [1, 2, 3], 1)) == [11, 12, 13]
    with pytest.raises(ValueError, match="local workers must be >= 1"):
        list(run_tasks(operator.add, 10, [1, 2], 0))
    with pytest.raises(ValueError, match="dask Client"):
        list(run_tasks(operator.add, 10, [1, 2], 2.5))  # type: ignore[arg-type]


def test_local_pool_matches_in_process_and_carries_errors(tmp_path: Path, criteo_tsv: Path):
    assert list(run_tasks(operator.add, 10, list(range(7)), 2)) == [10 + i for i in range(7)]
    dataset = Dataset.criteo(criteo_tsv, partition_bytes=100_000)
    assert len(dataset.partitions()) > 2
    pooled = _workflow().fit(dataset, engine=2)
    inline = _workflow().fit(dataset, engine=1)
    _assert_same_stats(pooled, inline)
    result = pooled.transform(dataset, tmp_path / "out", engine=2)
    assert pl.read_parquet(result.paths).equals(
        pooled.transform_frame(pl.read_csv(criteo_tsv, separator="\t", has_header=False, schema=dataset.schema))
    )
    lines = criteo_tsv.read_bytes().split(b"\n")
    lines[2500] = b"1\t2"
    criteo_tsv.write_bytes(b"\n".join(lines))
    with pytest.raises(BadInputError) as info:  # raised in a worker, rebuilt here with its location
        _workflow().fit(Dataset.criteo(criteo_tsv, partition_bytes=100_000), engine=2)
    assert info.value.error.line == 2501


def test_dask_local_cluster_matches_in_process(tmp_path: Path, criteo_tsv: Path):
    distributed = pytest.importorskip("distributed")
    dataset = Dataset.criteo(criteo_tsv, partition_bytes=150_000)
    inline = _workflow().fit(dataset, engine=1)
    with (
        distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_dask = _workflow().fit(dataset, engine=client)
        result = on_dask.transform(dataset, tmp_path / "dask", engine=cluster.scheduler_address)
    _assert_same_stats(on_dask, inline)
    raw = pl.read_csv(criteo_tsv, separator="\t", has_header=False, schema=dataset.schema)
    assert pl.read_parquet(result.paths).equals(on_dask.transform_frame(raw))


def test_local_workers_get_the_job_in_memory_not_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The job reached the workers as a pickle in a temporary file they loaded: now it is handed to each
    worker as it starts, and no file is written for it (nothing the package loads from disk is a pickle).

    The job is `os.listdir` and each item the parent's temporary folder, so every worker lists that folder
    while it runs; both are importable by name in a forkserver worker, which a function defined in this
    test module is not (pytest imports it without putting the repository on the workers' sys.path)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "data.parquet").write_bytes(b"")
    listed = list(run_tasks(operator.call, os.listdir, [str(tmp_path)] * 3, 2))
    assert listed == [["data.parquet"]] * 3
