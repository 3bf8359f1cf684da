import gzip
from pathlib import Path

import polars as pl
import pytest

from hugerec.data import criteo
from hugerec.data.criteo import criteo_to_parquet, read_criteo
from hugerec.data.preprocess.errors import BadInputError
from hugerec.data.schema import Schema


def _line(label: str = "1", ints: list[str] | None = None, cats: list[str] | None = None) -> str:
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *ints, *cats]) + "\n"


def test_constants_match_the_schema() -> None:
    s = Schema.criteo()
    assert s.dense_names == criteo.DENSE_NAMES and s.sparse_names == criteo.SPARSE_NAMES
    assert len(criteo.KAGGLE_CARDINALITIES) == 26 == len(criteo.SPARSE_MISSING_RATES)
    assert len(criteo.DENSE_MISSING_RATES) == 13


def test_reads_plain_and_gzip_with_missing_values(tmp_path: Path) -> None:
    text = _line() + _line("0", [""] * 13, [""] * 26) + _line(cats=["ffffffff"] * 26)
    (tmp_path / "a.txt").write_text(text)
    with gzip.open(tmp_path / "a.txt.gz", "wt") as f:
        f.write(text)
    for name in ("a.txt", "a.txt.gz"):
        frame, report = read_criteo(tmp_path / name)
        assert frame.shape == (3, 40) and report.rows_skipped == 0
        assert frame["label"].to_list() == [1, 0, 1]
        assert frame["I13"].to_list() == [12, None, 12]
        assert frame["C2"].to_list() == [1, None, 0xFFFFFFFF]
        assert frame.schema["C2"] == pl.Int64


def test_bad_rows_name_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(_line() + _line() + "1\t2\t3\n")
    with pytest.raises(BadInputError, match=r"bad\.txt, line 3: 3 fields, expected 40"):
        read_criteo(path)
    path.write_text(_line() + _line(ints=["7", "x1", *["1"] * 11]))
    with pytest.raises(BadInputError, match=r"bad\.txt, line 2, column 'I2'.*'x1'"):
        read_criteo(path)
    path.write_text(_line() + _line() + _line(cats=["zz"] + ["0"] * 25))
    with pytest.raises(BadInputError, match=r"bad\.txt, line 3, column 'C1': not a hexadecimal number \(value 'zz'\)"):
        read_criteo(path)


def test_skip_mode_counts_and_reports(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text(_line() + "1\t2\n" + _line(ints=["q"] * 13) + _line(cats=["zz"] * 26) + _line())
    frame, report = read_criteo(path, on_error="skip")
    assert frame.height == 2
    assert report.rows_skipped == 3
    assert "3 of" in str(report) and "bad.txt" in str(report)


def test_to_parquet_streams_shards(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("".join(_line(str(i % 2)) for i in range(50)))
    out = criteo_to_parquet(tmp_path / "in.txt", tmp_path / "pq", rows_per_file=32, row_group_rows=16)
    assert out.num_rows == 50 and len(out.paths) == 2
    back = pl.read_parquet(out.paths)
    assert back.equals(read_criteo(tmp_path / "in.txt")[0])
    assert Schema.load(tmp_path / "pq" / "schema.json")["C1"].dtype.value == "int"


@pytest.mark.shared_data("criteo/train_examples.txt.gz")
def test_real_sample(tmp_path: Path, shared_data: Path) -> None:
    sample = shared_data / "criteo/train_examples.txt.gz"
    frame, report = read_criteo(sample)
    assert frame.height == 10_000 and report.rows_skipped == 0
    assert frame["label"].value_counts().sort("label")["count"].to_list() == [7818, 2182]
    first = frame.row(0)
    assert first[:14] == (0, 1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, None, 2)
    assert first[14:17] == (0x68FD1E64, 0x80E26C9B, 0xFB936136)
    assert frame["I1"].null_count() == 4481 and frame["I12"].null_count() == 7735
    assert frame["C22"].null_count() == 8182
    assert frame["C9"].n_unique() == 3 and frame["C3"].n_unique() == 5521  # the missing value counted as one
    out = criteo_to_parquet(sample, tmp_path / "pq", row_group_rows=4096)
    assert out.num_rows == 10_000 and pl.read_parquet(out.paths).equals(frame)
