import itertools
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hugerec.data import criteo
from hugerec.data.loader import Loader, load
from hugerec.data.preprocess.categorical import Categorify
from hugerec.data.preprocess.dataset import Dataset
from hugerec.data.preprocess.numeric import FillMissing, LogOp, Normalize
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.schema import Schema
from hugerec.data.shards import ShardWriter, prebatch
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

SCHEMA = Schema.build(dense=["rid", "x"], sparse={"a": 7, "m": 11, "b": 1000}, multi_hot=["m"])


def _row(rid: int) -> tuple[float, float, list[int], list[int], list[int]]:
    """Every column is a function of the row id, so any batch can be checked row by row."""
    a = [] if rid % 5 == 0 else [rid % 7]
    return float(rid % 2), rid * 0.5, a, [rid % 11] * (rid % 3), [rid % 1000]


def _table(rids: np.ndarray) -> pa.Table:
    rows = [_row(int(r)) for r in rids]
    return pa.table(
        {
            "label": pa.array([r[0] for r in rows], pa.float32()),
            "rid": pa.array(rids.astype(np.float32)),
            "x": pa.array([r[1] for r in rows], pa.float64()),
            "a": pa.array([r[2][0] if r[2] else None for r in rows], pa.int32()),
            "m": pa.array([r[3] for r in rows], pa.list_(pa.int64())),
            "b": pa.array([r[4][0] for r in rows], pa.int64()),
        }
    )


def _write(path: Path, num_rows: int = 1000, row_group_rows: int = 64, rows_per_file: int = 320) -> Path:
    with ShardWriter(path, rows_per_file, row_group_rows) as w:
        for start in range(0, num_rows, 100):  # writes that straddle row groups
            w.write(_table(np.arange(start, min(start + 100, num_rows))))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("loader"))


def _check(batch: Batch) -> list[int]:
    """Checks a batch against `_row` (the slow reference); returns its row ids."""
    rids = [int(r) for r in batch.dense[:, 0].tolist()]
    assert batch.dense.dtype == torch.float32 and batch.labels.dtype == torch.float32
    assert batch.sparse.values.dtype == torch.int64 and batch.sparse.keys == ("a", "m", "b")
    want = [_row(r) for r in rids]
    ref = SparseFeatures.from_lists({"a": [w[2] for w in want], "m": [w[3] for w in want], "b": [w[4] for w in want]})
    assert torch.equal(batch.sparse.values, ref.values)
    assert torch.equal(batch.sparse.lengths.to(torch.int32), ref.lengths)
    assert batch.labels.tolist() == [w[0] for w in want]
    assert batch.dense[:, 1].tolist() == [w[1] for w in want]
    # The loader skips SparseFeatures' checks; re-running them must pass.
    SparseFeatures(batch.sparse.keys, batch.sparse.values, batch.sparse.lengths)
    return rids


def _flat(batches: list[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(batches))


def _epoch(loader: Loader) -> list[list[int]]:
    return [_check(b) for b in loader]


def test_unshuffled_reads_every_row_in_order(data: Path) -> None:
    loader = load(data, SCHEMA, batch_size=96)
    assert len(loader) == 11 and loader.num_rows == 1000
    batches = _epoch(loader)
    assert [len(b) for b in batches] == [96] * 10 + [40]
    assert _flat(batches) == list(range(1000))
    assert loader.epoch == 1


def test_shuffle_is_a_permutation_deterministic_and_changes_per_epoch(data: Path) -> None:
    loader = load(str(data / "*.parquet"), SCHEMA, batch_size=100, shuffle=True, seed=7, shuffle_buffer=200)
    e0 = _epoch(loader)
    e1 = _epoch(loader)
    assert sorted(_flat(e0)) == list(range(1000)) == sorted(_flat(e1))
    assert _flat(e0) != list(range(1000)) and e0 != e1
    again = load(data, SCHEMA, batch_size=100, shuffle=True, seed=7, shuffle_buffer=200)
    assert _epoch(again) == e0
    again.set_epoch(0)
    assert _epoch(again) == e0
    other = load(data, SCHEMA, batch_size=100, shuffle=True, seed=8, shuffle_buffer=200)
    assert _epoch(other) != e0


def test_drop_last(data: Path) -> None:
    loader = load(data, SCHEMA, batch_size=96, drop_last=True)
    assert len(loader) == 10 and loader.rows_left_out == 40
    assert [len(b) for b in _epoch(loader)] == [96] * 10


@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_read_disjoint_rows_and_the_same_number_of_batches(data: Path, shuffle: bool) -> None:
    loaders = [load(data, SCHEMA, 50, shuffle=shuffle, seed=1, rank=r, world_size=3) for r in range(3)]
    epochs = [_epoch(ld) for ld in loaders]
    assert len({len(e) for e in epochs}) == 1 and len({len(ld) for ld in loaders}) == 1
    rows = [set(_flat(e)) for e in epochs]
    assert not (rows[0] & rows[1]) and not (rows[0] & rows[2]) and not (rows[1] & rows[2])
    served = sum(len(r) for r in rows)
    assert served + sum(ld.rows_left_out for ld in loaders) == 1000


@pytest.mark.parametrize(("shuffle", "stop_after"), [(False, 3), (True, 1), (True, 4), (True, 9)])
def test_resume_equals_continuous(data: Path, shuffle: bool, stop_after: int) -> None:
    def make() -> Loader:
        return load(data, SCHEMA, 96, shuffle=shuffle, seed=3, shuffle_buffer=150, prefetch=2)

    full = make()
    continuous = _epoch(full) + _epoch(full)
    first = make()
    got = []
    for i, b in enumerate(first):
        got.append(_check(b))
        if i + 1 == stop_after:
            break
    state = first.state_dict()
    assert state["batch"] == stop_after
    resumed = make()
    resumed.load_state_dict(state)
    got += _epoch(resumed) + _epoch(resumed)
    assert got == continuous


def test_state_dict_mismatch_is_rejected(data: Path) -> None:
    state = load(data, SCHEMA, 96).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        load(data, SCHEMA, 64).load_state_dict(state)
    with pytest.raises(ValueError, match="out of range"):
        load(data, SCHEMA, 96).load_state_dict({**state, "batch": 99})


def test_early_break_and_multiple_labels(tmp_path: Path) -> None:
    table = _table(np.arange(300)).append_column("label2", pa.array(np.ones(300, np.float32)))
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=50)
    schema = Schema.build(labels=["label", "label2"], dense=["rid"], sparse={"b": 1000})
    loader = load(tmp_path / "x.parquet", schema, 32, prefetch=1)
    for b in loader:
        assert b.labels.shape == (32, 2) and bool((b.labels[:, 1] == 1).all())
        break  # the background thread must stop
    assert loader.state_dict()["batch"] == 1
    assert sum(b.batch_size for b in loader) == 300 - 32


def test_bad_files_give_clear_errors(tmp_path: Path) -> None:
    good = _table(np.arange(10))
    pq.write_table(good.drop_columns(["x"]), tmp_path / "nox.parquet")
    with pytest.raises(ValueError, match=r"nox\.parquet: column 'x' of the schema is not in the file"):
        load(tmp_path / "nox.parquet", SCHEMA, 4)
    pq.write_table(good.set_column(3, "a", pa.array(["z"] * 10)), tmp_path / "str.parquet")
    with pytest.raises(ValueError, match=r"str\.parquet: column 'a' should hold integer ids, found type string"):
        load(tmp_path / "str.parquet", SCHEMA, 4)
    # Found from the Parquet statistics when the loader is made, or when the row group is read without them.
    for stats in (True, False):
        x = good.set_column(2, "x", pa.array([None] + [1.0] * 9))
        pq.write_table(x, tmp_path / "null.parquet", write_statistics=stats)
        with pytest.raises(ValueError, match=r"null\.parquet, row group 0: dense column 'x' has 1 missing values"):
            list(load(tmp_path / "null.parquet", SCHEMA, 4))
        pq.write_table(good.set_column(5, "b", pa.array([5000] * 10)), tmp_path / "big.parquet", write_statistics=stats)
        with pytest.raises(ValueError, match=r"big\.parquet, row group 0: column 'b' has id 5000 outside 0..1000-1"):
            list(load(tmp_path / "big.parquet", SCHEMA, 4))
    m = good.set_column(4, "m", pa.array([[1, None]] * 10, pa.list_(pa.int64())))
    pq.write_table(m, tmp_path / "m.parquet")
    with pytest.raises(ValueError, match=r"m\.parquet, row group 0: column 'm' has 10 missing ids inside its lists"):
        list(load(tmp_path / "m.parquet", SCHEMA, 4))
    pq.write_table(good, tmp_path / "one.parquet")
    with pytest.raises(ValueError, match="cannot be split over 4 ranks"):
        load(tmp_path / "one.parquet", SCHEMA, 4, rank=0, world_size=4)
    with pytest.raises(ValueError, match="no Parquet files match"):
        load(str(tmp_path / "nothing*.parquet"), SCHEMA, 4)
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        load(tmp_path / "one.parquet", SCHEMA, 0)


def test_prebatch_aligns_row_groups(data: Path, tmp_path: Path) -> None:
    paths = prebatch(data, tmp_path / "pre", batch_size=32, batches_per_row_group=2, row_groups_per_file=4)
    sizes = [
        pq.ParquetFile(p).metadata.row_group(i).num_rows for p in paths for i in range(pq.ParquetFile(p).num_row_groups)
    ]
    assert all(s == 64 for s in sizes[:-1]) and sum(sizes) == 1000
    assert _flat(_epoch(load(paths, SCHEMA, 32))) == list(range(1000))




@pytest.mark.shared_data("criteo/train_examples.txt.gz")
def test_loads_the_preprocessed_criteo_sample(tmp_path: Path, shared_data: Path) -> None:
    """Raw TSV -> fitted Workflow -> Parquet -> loader, the documented path for real data."""
    dense, sparse = list(criteo.DENSE_NAMES), list(criteo.SPARSE_NAMES)
    wf = Workflow([FillMissing(dense), LogOp(dense), Normalize(dense), Categorify(sparse)])
    wf.fit(Dataset.criteo(shared_data / "criteo" / "train_examples.txt.gz"), engine=1)
    out = wf.transform(Dataset.criteo(shared_data / "criteo" / "train_examples.txt.gz"), tmp_path, engine=1)
    schema = Schema.build(dense=dense, sparse=wf.cardinalities())
    batches = list(load(out.paths, schema, 4096))
    assert [b.batch_size for b in batches] == [4096, 4096, 1808]
    assert int(sum(float(b.labels.sum()) for b in batches)) == 2182
    assert all(b.sparse.lengths.eq(1).all() for b in batches)  # Categorify gives missing values id 0
    assert torch.isfinite(batches[0].dense).all()


def test_a_small_preprocessed_dataset_is_shared_by_two_ranks(tmp_path: Path) -> None:
    """Workflow.transform cuts a one-partition output into >= 8 row groups, so each rank gets rows."""
    raw = pl.DataFrame(
        {"label": np.arange(500) % 2, "x": np.arange(500) * 1.0, "c": [f"v{i % 13}" for i in range(500)]}
    )
    wf = Workflow([Normalize(("x",)), Categorify(("c",))])
    out = wf.fit(raw, engine=1).transform(raw, tmp_path, engine=1)
    assert pq.ParquetFile(out.paths[0]).num_row_groups == 8
    schema = Schema.build(dense=["x"], sparse=wf.cardinalities())
    seen, left_out = [], 0
    for rank in range(2):
        loader = load(out.paths, schema, 32, shuffle=True, rank=rank, world_size=2)
        served, left_out = loader.num_rows, left_out + loader.rows_left_out
        xs = [float(v) for b in loader for v in b.dense[:, 0].tolist()]
        assert xs and served == len(xs)
        seen.append(set(xs))
    assert not seen[0] & seen[1] and len(seen[0]) + len(seen[1]) + left_out == 500


def test_an_epoch_without_a_batch_is_an_error(data: Path) -> None:
    with pytest.raises(ValueError, match=r"rank \d of 3 gets \d+ rows in epoch 0, fewer than batch_size=400"):
        load(data, SCHEMA, 400, drop_last=True, rank=0, world_size=3)
    assert len(load(data, SCHEMA, 400, rank=0, world_size=3)) == 1  # without drop_last the short batch is served
