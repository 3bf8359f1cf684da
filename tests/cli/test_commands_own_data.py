"""Your own data from a config file (#13): `hugerec schema` infers a CSV's columns, the test edits the
TOML as a user would, and preprocess -> train -> evaluate (on the raw file) run from it, with a header,
without one, with a "::" separator and with a timestamp turned into cyclic features. Then the shipped
configs for the real samples (skipped without the data folder)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from hugerec.cli import main
from hugerec.training.model_file import load_model
from tests.cli.conftest import write_click_log

WriteLog = Callable[..., list[dict[str, object]]]

ROOT = Path(__file__).resolve().parents[2]
FAST = ["train.progress=false", "train.tensorboard=false", "train.plot=false", "train.max_steps=4", "train.log_every=2"]
TAIL = """
[data]
train = "data/train"
eval = "data/eval"
batch_size = 64

[embedding]
dim = 8

[model]
type = "dlrm"
bottom = [16, 8]
top = [16, 1]

[train]
epochs = 1
out_dir = "run"
"""


def _schema(tmp_path: Path, data: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["schema", data, "--out", "c.toml", *extra]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return (tmp_path / "c.toml").read_text()


def _run_all(config: str, raw_eval: str, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, float]:
    assert main(["preprocess", config]) == 0, capsys.readouterr().err
    assert main(["train", config, *FAST, *extra]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["evaluate", config, f"data.eval={raw_eval}"]) == 0, capsys.readouterr().err
    metrics: dict[str, float] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= metrics["auc"] <= 1.0 and metrics["count"] > 0
    return metrics


def test_csv_with_a_header_inferred_edited_and_trained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
, click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv")
    toml = _schema(tmp_path, "clicks.csv", capsys)
    assert 'separator = ","' in toml and "header = true" in toml
    assert '{ name = "clicked", type = "int", role = "label" }' in toml
    assert '{ name = "user_id", type = "int", role = "categorical" }' in toml
    assert '{ name = "tags", type = "list", role = "categorical", separator = "|" }' in toml
    assert '{ name = "time", type = "timestamp", role = "timestamp", format = "%Y-%m-%d %H:%M:%S" }' in toml
    # the user's edit: the rows are the same log sampled again, evaluate on the raw file itself
    (tmp_path / "c.toml").write_text(toml.replace('input = "clicks.csv"', 'input = "clicks.csv"\nout = "data"') + TAIL)
    metrics = _run_all("c.toml", "clicks.csv", capsys)
    assert metrics["count"] == 400
    schema = json.loads((tmp_path / "data" / "schema.json").read_text())
    kinds = {c["name"]: (c["kind"], c.get("multi_hot")) for c in schema["columns"]}
    assert kinds == {
        "clicked": ("label", None),
        "price": ("dense", None),
        "user_id": ("sparse", False),
        "category": ("sparse", False),
        "tags": ("sparse", True),
    }


def test_csv_without_a_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.tsv", sep="\t", header=False)
    toml = _schema(tmp_path, "clicks.tsv", capsys)
    assert 'separator = "\\t"' in toml and "header = false" in toml
    assert '{ name = "c5", type = "int", role = "dense" }' in toml  # a 0/1 column, not first: the user says
    toml = toml.replace('{ name = "c5", type = "int", role = "dense" }', '{ name = "c5", type = "int", role = "label" }')
    toml = toml.replace('{ name = "c0", type = "int", role = "dense" }', '{ name = "c0", type = "int", role = "user" }')
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"') + TAIL)
    _run_all("c.toml", "clicks.tsv", capsys)
    names = [c["name"] for c in json.loads((tmp_path / "data" / "schema.json").read_text())["columns"]]
    assert names[0] == "c5" and "c0" in names and "c4" not in names  # the raw timestamp is no feature


def test_double_colon_separator_movielens_style(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    lines = [f"{u}::{i}::{int(rng.integers(1, 6))}::{978300760 + 37 * k}" for k, (u, i) in
             enumerate(zip(rng.integers(1, 30, 500), rng.integers(1, 60, 500), strict=True))]
    (tmp_path / "ratings.dat").write_text("\n".join(lines) + "\n")
    toml = _schema(tmp_path, "ratings.dat", capsys)
    assert 'separator = "::"' in toml and '{ name = "c3", type = "timestamp", role = "timestamp", format = "unix" }' in toml
    toml = toml.replace('{ name = "c0", type = "int", role = "dense" }', '{ name = "c0", type = "int", role = "user" }')
    toml = toml.replace('{ name = "c1", type = "int", role = "dense" }', '{ name = "c1", type = "int", role = "item" }')
    toml = toml.replace(
        '{ name = "c2", type = "int", role = "dense" }', '{ name = "c2", type = "int", role = "label", threshold = 4 }'
    )
    split = '[preprocess]\nout = "data"\nsplit = "leave_last_out"\nholdout = 2'
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", split) + TAIL)
    _run_all("c.toml", "ratings.dat", capsys, "model.bottom=[]")  # ids only: no dense arch
    assert main(["predict", "c.toml", "predict.input=ratings.dat", "predict.out=p.parquet"]) == 0
    import pyarrow.parquet as pq

    scored = pq.read_table(tmp_path / "p.parquet")
    assert scored.num_rows == 500 and set(scored.column("c2").to_pylist()) <= {0.0, 1.0}


def test_timestamp_turned_into_cyclic_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
, click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv")
    toml = _schema(tmp_path, "clicks.csv", capsys)
    ops = """
[[preprocess.ops]]
op = "CyclicTime"
columns = ["time"]

[[preprocess.ops]]
op = "Categorify"
columns = ["user_id", "category", "tags"]
freq_threshold = 2

[[preprocess.ops]]
op = "LogOp"
columns = ["price"]
"""
    header = '[preprocess]\nout = "data"\nsplit = "time"\ntime_cutoff = "2024-03-25"'
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", header) + ops + TAIL)
    _run_all("c.toml", "clicks.csv", capsys)
    dense = [c["name"] for c in json.loads((tmp_path / "data" / "schema.json").read_text())["columns"] if c["kind"] == "dense"]
    assert dense == ["price", "time_hour_sin", "time_hour_cos", "time_dow_sin", "time_dow_cos"]
    import pyarrow.parquet as pq

    eval_rows = sum(pq.read_metadata(f).num_rows for f in (tmp_path / "data" / "eval").glob("*.parquet"))
    assert eval_rows == sum(1 for i in range(400) if 1 + i % 28 >= 25)  # the days at or after the cutoff


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (['[[preprocess.ops]]\nop = "Categorify"\ncolumns = ["category"]\nfreq = 2\n'],
         "preprocess: ops[0].freq: Categorify has no parameter 'freq'"),
        (['[[preprocess.ops]]\nop = "Categorise"\ncolumns = ["category"]\n'], "preprocess: ops[0].op: 'Categorise' is not one of"),
        (['[[preprocess.ops]]\nop = "Bucketize"\ncolumns = ["price"]\nboundaries = [3.0, 1.0]\n'], "preprocess: ops[0] (Bucketize)"),
    ],
)
def test_workflow_mistakes_name_the_key(
    extra: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
, click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv", 20)
    toml = _schema(tmp_path, "clicks.csv", capsys)
    (tmp_path / "c.toml").write_text(toml + "".join(extra))
    assert main(["preprocess", "c.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("preprocess.columns=[{name='x', type='int', role='labl'}]", "preprocess.columns[0].role: 'labl' is not one of"),
        ("preprocess.columns=[{name='x', type='text'}]", "preprocess.columns[0].type: 'text' is not one of"),
        ("preprocess.columns=[{name='x', type='string', role='dense'}]", "a dense column must be int or float"),
        ("preprocess.last_days=-1", "last_days must be > 0, got -1"),
        ("preprocess.time_cutoff=yesterday", "neither epoch seconds nor a date"),
        ("preprocess.encoding=utf-16", "ASCII-compatible"),
    ],
)
def test_input_mistakes_name_the_key(
    override: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["preprocess", "preprocess.format=csv", "preprocess.columns=[{name='x', type='int', role='label'}]"]
    assert main([*args, override]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


def test_parquet_format_pointed_at_a_csv_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
, click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.parquet", 20)  # text under a Parquet name
    assert main(["preprocess", "preprocess.input=clicks.parquet", "preprocess.format=parquet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "clicks.parquet is not a Parquet file" in err and 'format = "csv"' in err and "\n" not in err, err


def test_parquet_needs_no_schema_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], click_log: WriteLog) -> None:
    import polars as pl

    monkeypatch.chdir(tmp_path)
    (tmp_path / "raw").mkdir()
    pl.DataFrame(click_log(tmp_path / "log.csv")).drop("tags", "time").write_parquet(tmp_path / "raw" / "part-0.parquet")
    (tmp_path / "c.toml").write_text('[preprocess]\ninput = "raw"\nformat = "parquet"\nout = "data"\n' + TAIL)
    _run_all("c.toml", "raw", capsys)
    kinds = {c["name"]: c["kind"] for c in json.loads((tmp_path / "data" / "schema.json").read_text())["columns"]}
    assert kinds == {"clicked": "label", "user_id": "sparse", "category": "sparse", "price": "dense"}
    pl.DataFrame({"clicked": [0, 1], "genres": [["a", "b"], []]}).write_parquet(tmp_path / "lists.parquet")
    toml = _schema(tmp_path, "lists.parquet", capsys)
    assert 'format = "parquet"' in toml and '{ name = "genres", type = "list", role = "categorical"' in toml


def test_on_error_skip_counts_bad_rows_of_a_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
, click_log: WriteLog) -> None:
    monkeypatch.chdir(tmp_path)
    click_log(tmp_path / "clicks.csv", 50)
    toml = _schema(tmp_path, "clicks.csv", capsys)
    with open(tmp_path / "clicks.csv", "a") as f:
        f.write("7,books,new,notaprice,2024-03-02 00:00:00,1\n7,books,new,1.0,2024-03-02 00:00:00,3\n")
        f.write("7,books,new,1.0,2024-03-02 25:61:00,1\n")
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"'))
    assert main(["preprocess", "c.toml"]) == 2
    assert "clicks.csv, line 52, column 'price'" in capsys.readouterr().err
    assert main(["preprocess", "c.toml", "preprocess.on_error=skip"]) == 0
    out = capsys.readouterr().out
    assert "3 of 53 rows skipped as bad input" in out and "line 53, column 'clicked'" in out, out
    # after rows were dropped the line is no longer known exactly: the file, column and value still are
    assert "clicks.csv, column 'time': does not match the time format '%Y-%m-%d %H:%M:%S'" in out, out
    (tmp_path / "t.csv").write_text("user_id,category,tags,price,time,clicked\n1,a,b,1.0,2024-03-02 25:61:00,1\n")
    assert main(["preprocess", "c.toml", "preprocess.input=t.csv"]) == 2
    assert "t.csv, line 2, column 'time': does not match the time format" in capsys.readouterr().err


# -- the shipped configs for the real samples ------------------------------------------------------
REAL = [
    ("configs/criteo_sample.toml", "criteo/train_examples.txt.gz"),
    ("configs/movielens_100k_ctr.toml", "movielens/ml-100k/ua.base.gz"),
    ("configs/movielens_1m_ctr.toml", "movielens/ml-1m/ratings.dat.gz"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=pytest.mark.shared_data(needs), id=c) for c, needs in REAL]
)
def test_real_sample_trains_from_its_config_alone(
    config: str, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each real sample: preprocess, a short training and evaluate from the shipped config, run from another
    directory; prints the AUC / logloss (a full run: the same commands without the size overrides)."""
    monkeypatch.chdir(tmp_path)
    assert main(["preprocess", config]) == 0, capsys.readouterr().err
    assert main(["train", config, *FAST, "train.max_steps=40", "train.eval_every=20"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["evaluate", config]) == 0, capsys.readouterr().err
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with capsys.disabled():
        print(f"\n{config}: 40 steps: eval AUC {metrics['auc']:.4f} logloss {metrics['logloss']:.4f} ({metrics['count']:.0f} rows)")
    assert metrics["auc"] > 0.6 and metrics["logloss"] < 0.7


def test_raw_parquet_of_integer_ids_is_not_mistaken_for_shards(
    prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The synthetic raw Parquet has the shards' column names and integer ids, but raw ones: evaluate
    runs it through the fitted workflow (its schema.json is not the model's) instead of reading raw ids
    as embedding rows."""
    from hugerec.cli.commands import is_shards, read_model

    monkeypatch.chdir(prepared)
    run = [f"train.out_dir={tmp_path / 'run'}", "data.batch_size=512"]
    assert main(["train", *FAST, *run]) == 0, capsys.readouterr().err
    _, schema = read_model(tmp_path / "run" / "best.pt")
    assert is_shards("runs/quickstart/data/eval", schema) and not is_shards("runs/quickstart/raw", schema)
    capsys.readouterr()
    assert main(["evaluate", *run, "data.eval=runs/quickstart/raw"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["count"] == 6000  # every raw row, transformed


def test_schema_and_preprocess_of_a_truncated_gz_say_where_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28: `hugerec schema` printed a traceback for a truncated .gz; now one line naming the file, the
    byte of its text and the line where it breaks off (preprocess too), and a .gz that is no gzip at all."""
    import gzip
    import zlib

    monkeypatch.chdir(tmp_path)
    text = b"label,user_id,item\n" + b"".join(b"%d,%d,ab%d\n" % (i % 2, i, i % 50) for i in range(20_000))
    whole = gzip.compress(text)
    (tmp_path / "cut.csv.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "tiny.csv.gz").write_bytes(whole[:30])
    (tmp_path / "plain.csv.gz").write_bytes(b"label,user_id\n1,2\n")
    readable = zlib.decompressobj(31).decompress(whole[: len(whole) // 2])  # what the cut file still holds
    lines = readable.count(b"\n") + 1
    where = f"its text breaks off at byte {len(readable):,} (line {lines:,})"
    expected = {"cut.csv.gz": where, "tiny.csv.gz": "at byte 0 (line 1)", "plain.csv.gz": "Not a gzipped file"}
    for name, message in expected.items():
        assert main(["schema", name]) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"hugerec schema: error: {name}: truncated or damaged gzip file") and message in err, err
        assert "\n" not in err and "Traceback" not in err
    whole_file = tmp_path / "whole.csv.gz"
    whole_file.write_bytes(whole)
    config = _schema(tmp_path, "whole.csv.gz", capsys).replace('"whole.csv.gz"', '"cut.csv.gz"') + '\nout = "shards"\n'
    (tmp_path / "cut.toml").write_text(config)
    assert main(["preprocess", "cut.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hugerec preprocess: error: cut.csv.gz: truncated or damaged gzip file") and where in err, err
    assert "\n" not in err


@pytest.mark.parametrize("header", [True, False])
def test_predict_scores_unlabelled_traffic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], header: bool
) -> None:
    """Paper cut 1: predict on raw rows without the label column (traffic to score) gives each row's
    probability, the same as for the labelled rows, and writes no label column."""
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    rows = write_click_log(tmp_path / "clicks.csv", header=header)
    toml = _schema(tmp_path, "clicks.csv", capsys)
    if not header:  # headerless: the user names the label (the 0/1 column is not first)
        toml = toml.replace('{ name = "c5", type = "int", role = "dense" }', '{ name = "c5", type = "int", role = "label" }')
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"') + TAIL)
    assert main(["preprocess", "c.toml"]) == 0, capsys.readouterr().err
    assert main(["train", "c.toml", *FAST]) == 0, capsys.readouterr().err
    names = [k for k in rows[0] if k != "clicked"]
    lines = [",".join(names)] if header else []
    (tmp_path / "traffic.csv").write_text("\n".join(lines + [",".join(str(r[k]) for k in names) for r in rows]) + "\n")
    assert main(["predict", "c.toml", "predict.input=traffic.csv", "predict.out=traffic.parquet"]) == 0, capsys.readouterr().err
    assert main(["predict", "c.toml", "predict.input=clicks.csv", "predict.out=clicks.parquet"]) == 0, capsys.readouterr().err
    traffic, labelled = pq.read_table(tmp_path / "traffic.parquet"), pq.read_table(tmp_path / "clicks.parquet")
    assert traffic.column_names == ["probability"]
    assert labelled.column_names == ["clicked" if header else "c5", "probability"]
    assert traffic.column("probability").to_pylist() == labelled.column("probability").to_pylist()
    assert traffic.num_rows == len(rows)
    # evaluate still needs labels: the unlabelled file there is the usual one-line error
    assert main(["evaluate", "c.toml", "data.eval=traffic.csv"]) == 2
    assert "traffic.csv" in capsys.readouterr().err


def test_three_way_split_from_one_file_is_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paper cut 7: preprocess.test_split holds out train / eval / test from one file, the summary counts
    all three, and the test shards evaluate like the eval ones."""
    monkeypatch.chdir(tmp_path)
    write_click_log(tmp_path / "clicks.csv")
    toml = _schema(tmp_path, "clicks.csv", capsys)
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"') + TAIL)
    assert main(["preprocess", "c.toml", "preprocess.test_split=true", "preprocess.eval_fraction=0.2"]) == 0
    out = capsys.readouterr().out
    counts = {part: sum(1 for _ in (tmp_path / "data" / part).glob("*.parquet")) for part in ("train", "eval", "test")}
    assert all(counts.values()), counts
    import pyarrow.parquet as pq

    rows = {p: sum(pq.read_metadata(f).num_rows for f in (tmp_path / "data" / p).glob("*.parquet")) for p in counts}
    assert f"preprocess: {rows['train']:,} train + {rows['eval']:,} eval + {rows['test']:,} test rows" in out
    assert sum(rows.values()) == 400
    assert main(["train", "c.toml", *FAST]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["evaluate", "c.toml", "data.eval=data/test"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["count"] == rows["test"]


def test_a_headered_train_file_beside_headerless_dev_and_test_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paper cut 2: each input says whether it has a header line (header, eval_header, test_header), so
    the common layout needs no on_error = "skip"; a mismatch is one line naming the key to set."""
    monkeypatch.chdir(tmp_path)
    write_click_log(tmp_path / "train.csv", n=300, seed=0)
    write_click_log(tmp_path / "dev.csv", n=60, header=False, seed=1)
    write_click_log(tmp_path / "test.csv", n=70, header=False, seed=2)
    toml = _schema(tmp_path, "train.csv", capsys)
    files = '[preprocess]\nout = "data"\neval_input = "dev.csv"\ntest_input = "test.csv"'
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", files) + TAIL)
    assert main(["preprocess", "c.toml"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "preprocess.eval_input: dev.csv header" in err
    assert "(a file without a header line: preprocess.eval_header = false)" in err
    assert main(["preprocess", "c.toml", "preprocess.eval_header=false", "preprocess.test_header=false"]) == 0
    assert "300 train + 60 eval + 70 test rows" in capsys.readouterr().out
    # the other way round: headerless files declared so, one dev file with a header line
    write_click_log(tmp_path / "train.csv", n=300, header=False, seed=0)
    write_click_log(tmp_path / "dev.csv", n=60, seed=1)
    assert main(["preprocess", "c.toml", "preprocess.header=false", "preprocess.test_header=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert "preprocess.eval_input: dev.csv starts with a header line" in err and "set preprocess.eval_header = true" in err
    args = ["preprocess.header=false", "preprocess.eval_header=true", "preprocess.test_header=false"]
    assert main(["preprocess", "c.toml", *args]) == 0, capsys.readouterr().err
    assert "300 train + 60 eval + 70 test rows" in capsys.readouterr().out


def test_train_fits_default_widths_to_the_data_and_says_what_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paper cuts 5 and 8: a DLRM on data without dense features needs no `bottom = []`, the default
    widths shrink to the data, each change is one line, and a line before training gives the model's
    parameters, the rows, the batch and the steps; keys the user sets stay as set."""
    monkeypatch.chdir(tmp_path)
    write_click_log(tmp_path / "clicks.csv")
    toml = _schema(tmp_path, "clicks.csv", capsys).replace(
        '{ name = "price", type = "float", role = "dense" }', '{ name = "price", type = "float", role = "none" }'
    )
    tail = TAIL.replace("bottom = [16, 8]\ntop = [16, 1]\n", "")
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"') + tail)
    assert main(["preprocess", "c.toml"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["train", "c.toml", *FAST]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "train: model.bottom = [] (default [512, 256, 64]: no dense features); set the key to choose"
    assert lines[1] == (
        "train: model.top = [64, 64, 64, 64, 1] (default [1024, 1024, 512, 256, 1]: widths <= 64 for 3"
        + lines[1].split("widths <= 64 for 3")[1]
    )
    summary = next(line for line in lines if line.startswith("train: dlrm, "))
    assert "embedding tables of dim 8" in summary and "batch 64, " in summary and "steps per epoch x 1 epoch, at most 4 steps" in summary
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["bottom"] == [] and saved["model"]["top"] == [64, 64, 64, 64, 1] and "model_keys" not in saved
    assert main(["train", "c.toml", *FAST, "model.top=[32,1]", "model.bottom=[]"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "model.top =" not in out and "model.bottom =" not in out


def test_train_fits_embedding_widths_to_the_cardinalities_unless_the_config_sets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, defaults that scale: embedding.dim = "auto" (the default) gives each table of a DCN-v2 its
    width from its cardinality and one width to a DLRM, printed before training and by --print-config with
    the batch size; an explicit embedding.dim (or a DLRM's model.bottom) is kept."""
    monkeypatch.chdir(tmp_path)
    write_click_log(tmp_path / "clicks.csv")
    toml = _schema(tmp_path, "clicks.csv", capsys)
    tail = TAIL.replace("[embedding]\ndim = 8\n", "").replace("batch_size = 64\n", "")
    tail = tail.replace('type = "dlrm"\nbottom = [16, 8]\ntop = [16, 1]\n', 'type = "dcn_v2"\ndeep = [16]\n')
    (tmp_path / "c.toml").write_text(toml.replace("[preprocess]", '[preprocess]\nout = "data"') + tail)
    assert main(["train", "c.toml", "--print-config"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["embedding"]["dim"] == "auto"
    assert 'embedding.dim and data.batch_size "auto": `hugerec train` fits them to the data' in printed.err
    assert main(["preprocess", "c.toml"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["train", "c.toml", "--print-config"]) == 0
    err = capsys.readouterr().err
    assert "# embedding.dim auto (6 x ids^0.25 up to a multiple of 8, 8..64): " in err and "data.batch_size auto" in err
    cards = json.loads((tmp_path / "data" / "schema.json").read_text())["columns"]
    sparse = {c["name"]: c["cardinality"] for c in cards if c.get("cardinality")}
    assert len(sparse) >= 2
    assert main(["train", "c.toml", *FAST]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    want = {name: max(8, min(64, 8 * -(-6 * card**0.25 // 8))) for name, card in sparse.items()}
    for name, dim in want.items():
        assert f"{name} {int(dim)} ({sparse[name]:,} ids)" in out
    assert "(auto)); " in next(line for line in out.splitlines() if line.startswith("train: dcn_v2, "))
    saved = {t.name: t.dim for t in load_model(tmp_path / "run" / "model.pt").tables}
    assert saved == {n: int(d) for n, d in want.items()}
    assert main(["train", "c.toml", *FAST, "embedding.dim=12"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "embedding.dim auto" not in out and "embedding tables of dim 12); " in out
    assert {t.dim for t in load_model(tmp_path / "run" / "model.pt").tables} == {12}
    assert main(["train", "c.toml", *FAST, "model.type=dlrm", "model.bottom=[16,24]"]) == 0, capsys.readouterr().err
    assert "embedding tables of dim 24 (auto)" in capsys.readouterr().out
    assert main(["train", "c.toml", "embedding.dim=wide"]) == 2
    assert """embedding: dim must be an int >= 1 or "auto", got 'wide'""" in capsys.readouterr().err
