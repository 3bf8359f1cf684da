from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.data.preprocess.dataset import CsvOptions
from hugerec.data.preprocess.errors import BadInputError
from hugerec.data.readers import polars_dtype, read, to_parquet
from hugerec.data.schema import Column, ColumnKind, Schema, ValueType

SCHEMA = Schema(
    (
        Column("click", ColumnKind.LABEL, ValueType.INT),
        Column("price", ColumnKind.DENSE),
        Column("user", ColumnKind.SPARSE, ValueType.STRING),
        Column("ad", ColumnKind.SPARSE, ValueType.HEX),
    )
)


def test_polars_dtypes() -> None:
    assert polars_dtype(SCHEMA["click"]) == pl.Int64
    assert polars_dtype(SCHEMA["price"]) == pl.Float32
    assert polars_dtype(SCHEMA["ad"]) == pl.String
    assert polars_dtype(Column("m", ColumnKind.SPARSE, multi_hot=True)) == pl.List(pl.Int64)


def test_csv_with_header(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("click,price,user,ad\n1,2.5,alice,ff\n0,,bob,\n")
    frame, report = read(path, SCHEMA)
    assert frame.to_dict(as_series=False) == {
        "click": [1, 0],
        "price": [2.5, None],
        "user": ["alice", "bob"],
        "ad": [255, None],
    }
    assert report.rows_skipped == 0


def test_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("click,price,user\n1,2.5,alice\n")
    with pytest.raises(ValueError, match=r"x\.csv: header .* schema columns \['ad'\] are not in it"):
        read(path, SCHEMA)
    path.write_text("click,price,user,ad\n1,2.5,alice,ff\n1,cheap,bob,0\n")
    with pytest.raises(BadInputError, match=r"x\.csv, line 3, column 'price'.*'cheap'"):
        read(path, SCHEMA)
    frame, report = read(path, SCHEMA, on_error="skip")
    assert frame.height == 1 and report.rows_skipped == 1
    multi = Schema.build(sparse=["m"], multi_hot=["m"])
    with pytest.raises(ValueError, match="multi-hot columns"):
        read(path, multi)


def test_tsv_without_header_and_parquet_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_text("".join(f"{i % 2}\t{i}.5\tu{i}\t{i:x}\n" for i in range(40)))
    tsv = CsvOptions(separator="\t", has_header=False)
    out = to_parquet(path, SCHEMA, tmp_path / "pq", csv=tsv, rows_per_file=32, row_group_rows=8)
    assert out.num_rows == 40 and len(out.paths) == 2
    assert Schema.load(tmp_path / "pq" / "schema.json")["ad"].dtype is ValueType.INT
    back, _ = read(str(tmp_path / "pq" / "*.parquet"), Schema.load(tmp_path / "pq" / "schema.json"))
    assert back["ad"].to_list() == list(range(40)) and back["user"][3] == "u3"


def test_parquet_missing_column_and_bad_type(tmp_path: Path) -> None:
    pq.write_table(pa.table({"click": [1], "price": [1.0], "user": ["a"]}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet: columns \['ad'\] of the schema are missing"):
        read(tmp_path / "p.parquet", SCHEMA)
    pq.write_table(pa.table({"click": ["yes"], "price": [1.0], "user": ["a"], "ad": ["f"]}), tmp_path / "q.parquet")
    with pytest.raises(BadInputError, match=r"q\.parquet, row group 0, row 0, column 'click'"):
        read(tmp_path / "q.parquet", SCHEMA)
