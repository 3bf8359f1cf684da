"""Vector side tables: reading, validation, normalisation, PCA and alignment to a feature's ids."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.data.preprocess.categorical import Categorify, HashBucket
from hugerec.data.preprocess.workflow import Workflow
from hugerec.data.vector_tables import VectorTable, encode_ids


def _table(ids: list[object], vectors: list[list[float]]) -> VectorTable:
    return VectorTable(pl.Series("id", ids), np.asarray(vectors, dtype=np.float32), "t")


def test_parquet_and_npz_round_trip(tmp_path: Path) -> None:
    frame = pl.DataFrame({"item": ["a", "b", "c"], "vec": [[1.0, 2.0], [3.0, 4.0], [0.0, 0.5]]})
    frame.write_parquet(tmp_path / "v.parquet")
    table = VectorTable.read(tmp_path / "v.parquet", id_column="item", vector_column="vec", dim=2)
    assert table.ids.to_list() == ["a", "b", "c"]
    np.testing.assert_array_equal(table.vectors, np.asarray([[1, 2], [3, 4], [0, 0.5]], dtype=np.float32))
    table.write(tmp_path / "v.npz")
    again = VectorTable.read(tmp_path / "v.npz", dim=2)
    assert again.ids.to_list() == ["a", "b", "c"]
    np.testing.assert_array_equal(again.vectors, table.vectors)


@pytest.mark.parametrize(
    ("vectors", "message"),
    [
        ([[1.0, 2.0], [3.0]], r"row 1: the vector in 'vec' has length 1, the config says dim 2"),
        ([[1.0, 2.0], None], r"row 1: the vector in 'vec' is null"),
        ([[1.0, 2.0], [float("nan"), 1.0]], r"row 1 \(id 'b'\): the vector holds NaN or infinity"),
        ([[1.0, 2.0], [1.0, None]], r"row 1: the vector in 'vec' holds a null"),
    ],
)
def test_bad_vectors_name_the_file_and_row(tmp_path: Path, vectors: list[object], message: str) -> None:
    path = tmp_path / "v.parquet"
    pl.DataFrame({"item": ["a", "b"], "vec": vectors}).write_parquet(path)
    with pytest.raises(ValueError, match=rf"vector table {path}|VectorTable {path}") as e:
        VectorTable.read(path, id_column="item", vector_column="vec", dim=2)
    assert e.match(message)


def test_duplicate_or_null_ids_and_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="row 2: id 'a' appears more than once"):
        _table(["a", "b", "a"], [[1.0], [2.0], [3.0]])
    with pytest.raises(ValueError, match="row 1: the id is null"):
        _table(["a", None], [[1.0], [2.0]])
    path = tmp_path / "v.parquet"
    pl.DataFrame({"item": ["a"], "vec": [[1.0]]}).write_parquet(path)
    with pytest.raises(ValueError, match="column not found"):
        VectorTable.read(path, id_column="nope", vector_column="vec")
    with pytest.raises(FileNotFoundError, match="no such file"):
        VectorTable.read(tmp_path / "absent.parquet")
    np.savez(tmp_path / "bad.npz", keys=np.arange(2))
    with pytest.raises(ValueError, match=r"has no \['ids', 'vectors'\] array"):
        VectorTable.read(tmp_path / "bad.npz")


def test_l2_normalisation_matches_torch() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(20, 7)).astype(np.float32)
    vectors[3] = 0.0  # a zero vector stays zero
    table = _table(list(range(20)), vectors.tolist()).l2_normalized()
    expected = torch.nn.functional.normalize(torch.from_numpy(vectors), dim=1).numpy()
    np.testing.assert_allclose(table.vectors, expected, rtol=1e-6, atol=1e-7)


def test_pca_keeps_the_variance_of_the_fit_rows() -> None:
    rng = np.random.default_rng(1)
    basis = rng.normal(size=(2, 6))
    vectors = (rng.normal(size=(50, 2)) @ basis).astype(np.float32)  # rank 2
    table = _table(list(range(50)), vectors.tolist())
    reduced = table.pca(2, fit_ids=pl.Series(list(range(40))))
    assert reduced.vectors.shape == (50, 2)
    # a rank-2 cloud loses nothing: distances between rows are kept
    d_before = np.linalg.norm(vectors[:, None] - vectors[None], axis=2)
    d_after = np.linalg.norm(reduced.vectors[:, None] - reduced.vectors[None], axis=2)
    np.testing.assert_allclose(d_after, d_before, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match=r"dim must be in \[1, 6\]"):
        table.pca(7)


@settings(max_examples=50, deadline=None)
@given(
    codes=st.lists(st.integers(-1, 9), min_size=0, max_size=12),  # -1: an id without a row of its own
    num_rows=st.integers(10, 14),
)
def test_aligned_rows_against_a_loop(codes: list[int], num_rows: int) -> None:
    """Row c holds the vector of the only id encoded as c; rows without one or shared by several ids
    are zeros with the missing flag; ids encoded -1 are left out."""
    vectors = np.arange(len(codes) * 3, dtype=np.float32).reshape(len(codes), 3) + 1
    table = VectorTable(pl.Series("id", list(range(len(codes))), dtype=pl.Int64), vectors, "t")
    rows = table.aligned(np.asarray(codes, dtype=np.int64), num_rows)
    for c in range(num_rows):
        holders = [i for i, code in enumerate(codes) if code == c]
        if len(holders) == 1:
            assert rows[c].tolist() == [*vectors[holders[0]].tolist(), 0.0]
        else:
            assert rows[c].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_aligned_refuses_codes_outside_the_table() -> None:
    table = _table(["a", "b"], [[1.0], [2.0]])
    with pytest.raises(ValueError, match=r"row 1 \(id 'b'\) encodes to 5, outside the feature's 3 rows"):
        table.aligned(np.asarray([1, 5]), 3)


def test_encode_ids_uses_the_fitted_vocabulary() -> None:
    frame = pl.DataFrame({"item": ["x", "y", "y", "z", "z", "z"], "user": ["u"] * 6})
    workflow = Workflow([Categorify(["item", "user"]), HashBucket(["user"], 5)])
    workflow.fit(frame)
    encoded = workflow.transform_frame(frame)["item"].to_list()
    codes = encode_ids(workflow, "item", pl.Series(["z", "x", "unseen"]))
    assert codes.tolist() == [encoded[3], encoded[0], -1]  # -1: out of vocabulary, no row of its own
    with pytest.raises(ValueError, match="no Categorify or HashBucket op of the workflow writes column 'nope'"):
        encode_ids(workflow, "nope", pl.Series(["z"]))
    ints = Workflow([Categorify(["item"])])
    ints.fit(pl.DataFrame({"item": [10, 20, 20]}))
    with pytest.raises(ValueError, match="id 'abc' \\(row 0\\) does not convert to the type of column 'item'"):
        encode_ids(ints, "item", pl.Series(["abc"]))


def test_load_vectors_fills_the_models_tables(tmp_path: Path) -> None:
    """load_vectors: the side table read, L2-normalised, encoded by the workflow and loaded, so that an
    item's looked-up row is its normalised vector; without a workflow integer ids are row ids."""
    from hugerec.data.vector_tables import load_vectors
    from hugerec.embedding.optimizers import RowWiseAdagrad
    from hugerec.embedding.table_config import TableConfig
    from hugerec.models.model_config import DLRMConfig, build_ranking
    from hugerec.models.vector_features import VectorFeature
    from hugerec.sparse.features import SparseFeatures

    frame = pl.DataFrame({"item": ["x", "y", "y", "z", "z", "z"]})
    workflow = Workflow([Categorify(["item"])])
    workflow.fit(frame)
    codes = workflow.transform_frame(frame)["item"].to_list()  # x, y, y, z, z, z
    path = tmp_path / "v.parquet"
    pl.DataFrame({"item": ["z", "x", "w"], "vec": [[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]]}).write_parquet(path)
    feature = VectorFeature("text", "item", 2, path=str(path), id_column="item", vector_column="vec")
    tables = [TableConfig("item", 5, 4, features=("item",))]
    model = build_ranking(DLRMConfig(bottom=(4,), top=(1,), vectors=(feature,)), tables, 1, RowWiseAdagrad())
    lines = load_vectors(model, workflow)
    assert lines == [f"vectors text: 2 of the 5 rows of feature 'item' have a vector (3 in {path}, l2 normalised)"]
    arch = model.vector_arch
    assert arch is not None
    rows = arch.lookup(SparseFeatures.from_lists({"item": [[codes[3]], [codes[0]], [codes[1]], [1]]}))
    expected = [[0.6, 0.8, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]  # z, x, y (none), OOV ("w")
    torch.testing.assert_close(rows, torch.tensor(expected))
    with pytest.raises(ValueError, match="ids in 'item' are not integers and there is no fitted workflow"):
        load_vectors(model, None)
    ints = tmp_path / "ints.parquet"
    pl.DataFrame({"item": [4, 2], "vec": [[0.0, 1.0], [2.0, 0.0]]}).write_parquet(ints)
    model2 = build_ranking(
        DLRMConfig(bottom=(4,), top=(1,), vectors=(dataclasses_replace(feature, path=str(ints)),)),
        tables,
        1,
        RowWiseAdagrad(),
    )
    load_vectors(model2, None)
    assert model2.vector_arch is not None
    got = model2.vector_arch.lookup(SparseFeatures.from_lists({"item": [[4], [2], [0]]}))
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))


def dataclasses_replace(obj: object, **changes: object) -> object:
    import dataclasses

    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.shared_data("movielens/ml-100k/u.item.gz", "movielens/ml-100k/u.data.gz")
def test_the_movielens_vectors_example_runs(tmp_path: Path, shared_data: Path) -> None:
    """examples/movielens_vectors.py as documented, one epoch, from another directory."""
    env = {**os.environ, "HUGEREC_DATA": str(shared_data.resolve())}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "movielens_vectors.py"), "--epochs", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "with item vectors: test AUC" in done.stdout and "without item vectors: test AUC" in done.stdout
    assert "have a vector" in done.stdout
