import gzip
from pathlib import Path

import polars as pl
import pytest

from hugerec.data.preprocess.dataset import CsvOptions, Dataset, Format, read_chunks, read_partition
from hugerec.data.preprocess.errors import BadInputError, OnError


def _read_all(dataset: Dataset, on_error: OnError = OnError.RAISE) -> pl.DataFrame:
    return pl.concat([read_partition(p, on_error)[0] for p in dataset.partitions()])


@pytest.mark.parametrize("partition_bytes", [37, 500, 4096, 1 << 30])
def test_byte_ranges_cover_every_line_once(tmp_path: Path, make_frame, tsv, partition_bytes: int):
    frame = make_frame(60)
    path = tsv(frame, tmp_path / "t.tsv")
    dataset = Dataset.criteo(path, partition_bytes=partition_bytes)
    assert len(dataset.partitions()) == -(-path.stat().st_size // partition_bytes)
    assert _read_all(dataset).equals(frame)


def test_gzip_reads_in_blocks_and_counts_lines(tmp_path: Path, make_frame, tsv):
    frame = make_frame(200)
    path = tmp_path / "t.tsv.gz"
    text = tsv(frame, tmp_path / "t.tsv").read_bytes()
    lines = text.split(b"\n")
    lines[150] = lines[150].replace(b"\t", b"", 1)  # one field short
    path.write_bytes(gzip.compress(b"\n".join(lines)))
    dataset = Dataset.criteo(path, partition_bytes=2000)  # gzip: one partition, blocks of ~2000 bytes
    (partition,) = dataset.partitions()
    with pytest.raises(BadInputError) as info:
        list(read_chunks(partition, OnError.RAISE))  # many blocks before the bad line
    assert info.value.error.line == 151 and info.value.error.path == str(path)
    chunks = list(read_chunks(partition, OnError.SKIP))
    assert len(chunks) > 5
    got = pl.concat([c.frame for c in chunks])
    assert got.equals(pl.concat([frame[:150], frame[151:]]))
    assert sum(c.report.rows_skipped for c in chunks) == 1


def test_wrong_field_count_reports_file_and_line_in_a_later_partition(tmp_path: Path, make_frame, tsv):
    frame = make_frame(300)
    path = tsv(frame, tmp_path / "t.tsv")
    lines = path.read_bytes().split(b"\n")
    lines[250] += b"\textra"
    path.write_bytes(b"\n".join(lines))
    dataset = Dataset.criteo(path, partition_bytes=10_000)
    with pytest.raises(BadInputError, match=r"line 251: 41 fields, expected 40") as info:
        _read_all(dataset)
    assert info.value.error.line == 251
    got = _read_all(dataset, OnError.SKIP)
    assert got.equals(pl.concat([frame[:250], frame[251:]]))


def test_non_numeric_value_names_line_column_and_value(tmp_path: Path, make_frame, tsv):
    frame = make_frame(100)
    path = tsv(frame, tmp_path / "t.tsv")
    lines = path.read_bytes().split(b"\n")
    fields = lines[41].split(b"\t")
    fields[3] = b"12abc"  # I3
    lines[41] = b"\t".join(fields)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(BadInputError) as info:
        _read_all(Dataset.criteo(path))
    error = info.value.error
    assert (error.line, error.column, error.value) == (42, "I3", "12abc")
    assert "line 42" in str(info.value) and "'I3'" in str(info.value)
    parts = [read_partition(p, OnError.SKIP) for p in Dataset.criteo(path).partitions()]
    assert pl.concat([f for f, _ in parts]).equals(pl.concat([frame[:41], frame[42:]]))
    report = parts[0][1]
    assert (report.rows_read, report.rows_skipped, report.examples[0].column) == (100, 1, "I3")


def test_csv_with_header_infers_schema_and_skips_header(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text('user,item,score\n1,"a,b",0.5\n2,,1.5\n3,c,\n')
    dataset = Dataset(path, partition_bytes=12)
    assert dataset.schema == {"user": pl.Int64(), "item": pl.String(), "score": pl.Float64()}
    got = _read_all(dataset)
    assert got.to_dict(as_series=False) == {"user": [1, 2, 3], "item": ["a,b", None, "c"], "score": [0.5, 1.5, None]}
    assert Dataset(path, csv=CsvOptions(null_values=("c",))).format is Format.CSV


def test_parquet_partitions_are_row_groups_and_bad_types_are_located(tmp_path: Path):
    frame = pl.DataFrame({"a": list(range(1000)), "b": [str(i) for i in range(1000)]})
    path = tmp_path / "t.parquet"
    frame.write_parquet(path, row_group_size=100)
    dataset = Dataset(path, partition_bytes=1)
    assert len(dataset.partitions()) == 10
    assert _read_all(dataset).equals(frame)
    typed = Dataset(path, schema={"a": pl.Int64, "b": pl.Int32})
    assert _read_all(typed)["b"].to_list() == list(range(1000))
    bad = frame.with_columns(pl.when(pl.col("a") == 345).then(pl.lit("x")).otherwise(pl.col("b")).alias("b"))
    bad.write_parquet(path, row_group_size=100)
    with pytest.raises(BadInputError) as info:
        _read_all(Dataset(path, schema={"a": pl.Int64, "b": pl.Int32}))
    assert (info.value.error.row_group, info.value.error.row, info.value.error.column) == (3, 45, "b")
    with pytest.raises(ValueError, match=r"columns \['c'\] of the schema are missing"):
        _read_all(Dataset(path, schema={"a": pl.Int64, "c": pl.Int64}))


def test_frames_and_argument_errors(tmp_path: Path):
    dataset = Dataset.from_frames(pl.DataFrame({"x": [1]}), pl.DataFrame({"x": [2, 3]}))
    assert [p.index for p in dataset.partitions()] == [0, 1]
    assert _read_all(dataset)["x"].to_list() == [1, 2, 3]
    with pytest.raises(FileNotFoundError, match="no input files"):
        Dataset(tmp_path / "missing-*.tsv")
    (tmp_path / "a.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot tell the format"):
        Dataset(tmp_path / "a.bin")
    with pytest.raises(ValueError, match="partition_bytes"):
        Dataset.from_frames(pl.DataFrame({"x": [1]})).__class__(frames=[pl.DataFrame({"x": [1]})], partition_bytes=0)
    with pytest.raises(ValueError, match="separator must be a non-empty string"):
        CsvOptions(separator="")
    with pytest.raises(ValueError, match="unknown encoding"):
        CsvOptions(encoding="no-such-codec")
    with pytest.raises(ValueError, match="ASCII-compatible"):
        CsvOptions(encoding="utf-16")


def test_multi_byte_separator_and_latin1(tmp_path: Path):
    """MovieLens' "::" and latin-1 titles read like any CSV; line numbers in errors stay the file's."""
    path = tmp_path / "movies.dat"
    path.write_bytes("1::Caf\xe9 (1995)::Comedy\n2::Heat (1995)::Action|Crime\n".encode("latin-1"))
    csv = CsvOptions(separator="::", has_header=False, quote_char=None, encoding="latin-1")
    ds = Dataset(path, format="csv", schema={"id": pl.Int64, "title": pl.String, "genres": pl.String}, csv=csv)
    frame = _read_all(ds)
    assert frame["title"].to_list() == ["Caf\u00e9 (1995)", "Heat (1995)"]
    assert frame["genres"].to_list() == ["Comedy", "Action|Crime"]
    path.write_bytes(b"1::a::b\n2::c\n")
    with pytest.raises(BadInputError, match=r"line 2.*2 fields, expected 3"):
        _read_all(Dataset(path, format="csv", schema={"id": pl.Int64, "t": pl.String, "g": pl.String}, csv=csv))
    path.write_bytes(b"1::a\x1fb::c\n")
    with pytest.raises(ValueError, match="0x1f"):
        _read_all(Dataset(path, format="csv", schema={"id": pl.Int64, "t": pl.String, "g": pl.String}, csv=csv))


def test_real_criteo_sample_reads(criteo_sample: Path):
    frame = _read_all(Dataset.criteo(criteo_sample, partition_bytes=300_000))
    assert frame.shape == (10_000, 40)
    assert frame["label"].is_in([0, 1]).all() and frame["C1"].str.len_chars().max() == 8


def test_a_directory_means_its_data_files_not_the_side_files(tmp_path: Path, make_frame, tsv):
    frame = make_frame(30)
    frame[:10].write_parquet(tmp_path / "part-0.parquet")
    frame[10:].write_parquet(tmp_path / "part-1.parquet")
    for side in ("schema.json", "synthetic.json", "_SUCCESS", ".hidden.parquet"):
        (tmp_path / side).write_text("{}")
    dataset = Dataset(tmp_path)
    assert dataset.format is Format.PARQUET and [Path(p).name for p in dataset.paths] == [
        "part-0.parquet",
        "part-1.parquet",
    ]
    assert _read_all(dataset).equals(frame)
    text = tmp_path / "text"
    text.mkdir()
    tsv(frame, text / "day_0")  # no suffix: taken when the format is given
    (text / "schema.json").write_text("{}")
    assert [Path(p).name for p in Dataset.criteo(text).paths] == ["day_0"]
    with pytest.raises(FileNotFoundError, match="is a folder with no input files"):
        Dataset(text, format="parquet")


SCHEMA = {"label": pl.Int64(), "x": pl.Int64(), "c": pl.String()}
TSV = CsvOptions(separator="\t", has_header=False, quote_char=None)


def _read(path: Path, on_error: OnError = OnError.RAISE) -> tuple[pl.DataFrame, int]:
    data = Dataset(str(path), format="csv", schema=SCHEMA, csv=TSV, binary=("label",))
    frames, skipped = [], 0
    for partition in data.partitions():
        frame, report = read_partition(partition, on_error)
        frames.append(frame)
        skipped += report.rows_skipped
    return pl.concat(frames), skipped


def test_invalid_utf8_names_file_and_line_or_is_skipped(tmp_path: Path):
    path = tmp_path / "u.tsv"
    path.write_bytes(b"0\t1\tab\n1\t2\tc\xffd\n0\t3\tok\n")
    with pytest.raises(BadInputError, match=r"u\.tsv, line 2: invalid UTF-8"):
        _read(path)
    frame, skipped = _read(path, OnError.SKIP)
    assert skipped == 1 and frame["x"].to_list() == [1, 3]
    gz = tmp_path / "u.tsv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(BadInputError, match=r"u\.tsv\.gz, line 2: invalid UTF-8"):
        _read(gz)


def test_valid_utf8_beyond_ascii_reads_unchanged(tmp_path: Path):
    path = tmp_path / "u.tsv"
    path.write_text("0\t1\tcafé\n1\t2\t東京\n", encoding="utf-8")
    frame, skipped = _read(path)
    assert skipped == 0 and frame["c"].to_list() == ["café", "東京"]


def test_truncated_gzip_is_one_error_naming_the_file(tmp_path: Path):
    whole = gzip.compress(b"".join(b"0\t%d\tabc\n" % i for i in range(20_000)))
    path = tmp_path / "cut.tsv.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.tsv\.gz: truncated or damaged gzip file"):
        _read(path)


@pytest.mark.parametrize("label", [b"2", b"-1"])
def test_labels_other_than_0_and_1_are_bad_input(tmp_path: Path, label: bytes):
    path = tmp_path / "l.tsv"
    path.write_bytes(b"0\t1\ta\n" + label + b"\t2\tb\n1\t3\tc\n")
    with pytest.raises(BadInputError, match=r"l\.tsv, line 2, column 'label': a label must be 0 or 1"):
        _read(path)
    frame, skipped = _read(path, OnError.SKIP)
    assert skipped == 1 and frame["label"].to_list() == [0, 1]


def test_parquet_labels_are_checked_with_their_row(tmp_path: Path):
    path = tmp_path / "l.parquet"
    pl.DataFrame({"label": [0, 1, 7], "x": [1, 2, 3], "c": ["a", "b", "c"]}).write_parquet(path)
    data = Dataset(str(path), format="parquet", schema=SCHEMA, binary=("label",))
    with pytest.raises(BadInputError, match=r"row group 0, row 2, column 'label'.*\(value '7'\)"):
        read_partition(data.partitions()[0], OnError.RAISE)


def test_an_empty_folder_is_named(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="is a folder with no input files"):
        Dataset(str(tmp_path / "empty"), format="csv", schema=SCHEMA)
