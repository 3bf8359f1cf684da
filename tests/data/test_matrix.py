"""read_matrix: preprocessed shards -> one FeatureMatrix (dense columns, then one id per sparse feature; nulls as
NaN), every file and row group in order; ranking queries made contiguous (stably, by first appearance) with
their sizes; labels checked (0/1, or integer grades for ranking); what trees cannot take refused naming the
column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.data.matrix import check_tree_schema, query_order, read_matrix
from hugerec.data.schema import Column, ColumnKind, Schema

SCHEMA = Schema(
    (Column("label", ColumnKind.LABEL), Column("d0", ColumnKind.DENSE), Column("c0", ColumnKind.SPARSE, cardinality=10))
)


def _shards(tmp_path: Path, *tables: pa.Table) -> Path:
    folder = tmp_path / "shards"
    folder.mkdir(parents=True)
    for i, table in enumerate(tables):
        pq.write_table(table, folder / f"part-{i}.parquet", row_group_size=2)
    return folder


def test_rows_of_every_shard_in_order_with_nulls_as_nan(tmp_path: Path) -> None:
    a = pa.table({"label": [0.0, 1.0, 1.0], "d0": [0.5, None, 2.5], "c0": pa.array([3, 4, None], pa.int32())})
    b = pa.table({"label": [0.0], "d0": [9.0], "c0": pa.array([7], pa.int32())})
    m = read_matrix(_shards(tmp_path, a, b), SCHEMA)
    assert m.names == ("d0", "c0") and m.num_dense == 1 and m.x.dtype == np.float32
    np.testing.assert_array_equal(m.x, [[0.5, 3], [np.nan, 4], [2.5, np.nan], [9.0, 7]])
    assert m.labels.tolist() == [0.0, 1.0, 1.0, 0.0] and m.groups.shape == (0,)
    unlabelled = read_matrix(_shards(tmp_path / "u", a.drop(["label"])), SCHEMA, labels=False)
    assert unlabelled.labels.shape == (0,) and unlabelled.x.shape == (3, 2)


def test_query_order() -> None:
    order, sizes = query_order(np.array([5, 5, 2, 2, 2, 9]))
    assert order is None and sizes.tolist() == [2, 3, 1]  # contiguous already: the shards' order stays
    order, sizes = query_order(np.array(["b", "a", "b", "c", "a"]))
    assert order is not None and order.tolist() == [0, 2, 1, 4, 3] and sizes.tolist() == [2, 2, 1]
    order, sizes = query_order(np.array([1]))
    assert order is None and sizes.tolist() == [1]


def test_ranking_groups_move_rows_next_to_their_query(tmp_path: Path) -> None:
    table = pa.table(
        {"label": [2.0, 0.0, 1.0, 3.0], "d0": [0.0, 1.0, 2.0, 3.0], "c0": [1, 2, 3, 4], "user": [7, 8, 7, 9]}
    )
    m = read_matrix(_shards(tmp_path, table), SCHEMA, group="user")
    assert m.x[:, 0].tolist() == [0.0, 2.0, 1.0, 3.0] and m.labels.tolist() == [2.0, 1.0, 0.0, 3.0]
    assert m.groups.tolist() == [2, 1, 1]
    with pytest.raises(
        ValueError, match=r"label column 'label' must hold relevance grades \(integers >= 0\) for ranking, got 0\.5"
    ):
        read_matrix(
            _shards(tmp_path / "g", table.set_column(0, "label", pa.array([0.5, 0.0, 1.0, 3.0]))), SCHEMA, group="user"
        )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            Schema((Column("a", ColumnKind.LABEL), Column("b", ColumnKind.LABEL))),
            r"tree models take one label column, the schema has \['a', 'b'\]",
        ),
        (
            Schema((Column("label", ColumnKind.LABEL), Column("c0", ColumnKind.SPARSE, multi_hot=True))),
            "sparse column 'c0' is multi-hot",
        ),
        (
            Schema((Column("label", ColumnKind.LABEL), Column("c0", ColumnKind.SPARSE, cardinality=(1 << 24) + 1))),
            "sparse column 'c0' has 16,777,217 ids; tree models take at most 16,777,216",
        ),
    ],
)
def test_schemas_trees_cannot_take_are_refused(schema: Schema, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_tree_schema(schema)


def test_bad_data_is_refused_naming_the_column(tmp_path: Path) -> None:
    good = {"label": [0.0, 1.0], "d0": [0.5, 1.5], "c0": [1, 2]}
    with pytest.raises(ValueError, match=r"label column 'label' must hold 0 or 1, got 2\.0"):
        read_matrix(_shards(tmp_path / "a", pa.table({**good, "label": [0.0, 2.0]})), SCHEMA)
    with pytest.raises(ValueError, match=r"column 'd0' has type string; tree models read numbers and ids$"):
        read_matrix(_shards(tmp_path / "b", pa.table({**good, "d0": ["x", "y"]})), SCHEMA)
    with pytest.raises(ValueError, match=r"model\.group: column 'user' is not in"):
        read_matrix(_shards(tmp_path / "c", pa.table(good)), SCHEMA, group="user")
    with pytest.raises(ValueError, match=r"model\.group: column 'user' has a null"):
        read_matrix(_shards(tmp_path / "d", pa.table({**good, "user": [1, None]})), SCHEMA, group="user")


def test_shards_of_zero_rows_are_refused_as_an_empty_dataset(tmp_path: Path) -> None:
    """A file with no row group and files whose row groups hold no rows are the same empty dataset: refused in
    one line naming the paths, not an empty matrix that a GBM would fit to nothing."""
    empty = pa.table({"label": pa.array([], pa.float64()), "d0": pa.array([], pa.float64()), "c0": pa.array([], pa.int32())})
    folder = _shards(tmp_path, empty, empty)
    assert pq.ParquetFile(next(folder.glob("*.parquet"))).metadata.num_row_groups == 1  # a row group of zero rows
    with pytest.raises(ValueError, match=r"shards holds no rows \(empty dataset\)"):
        read_matrix(folder, SCHEMA)
