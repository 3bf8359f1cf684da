"""`hugerec train / evaluate / index / recommend` for retrieval (two_tower, mf) and sequential (sasrec, mlm, gru4rec, hstu)
models, end to end on tiny logs written here (no real data needed), plus the shipped configs on the real samples."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hugerec.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _write_ratings(path: Path, users: int = 40, items: int = 30, per_user: int = 12, seed: int = 0) -> None:
    """A MovieLens-like `user::item::rating::timestamp` log: each user walks through nearby items in time."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        start = rng.integers(0, items)
        for t in range(per_user):
            item = 100 + int((start + t + rng.integers(0, 2)) % items)  # raw ids 100.., not dense
            lines.append(f"{u}::{item}::{rng.integers(1, 6)}::{1_000_000 + u * 1000 + t}")
    path.write_text("\n".join(lines) + "\n")


def _write_sessions(path: Path, sessions: int, items: int = 25, seed: int = 0, first: int = 1) -> None:
    """A YOOCHOOSE-like `SessionId \\t ItemId \\t Time` file (header, fractional seconds)."""
    rng = np.random.default_rng(seed)
    lines = ["SessionId\tItemId\tTime"]
    for s in range(first, first + sessions):
        start, n = rng.integers(0, items), rng.integers(2, 7)
        for t in range(n):
            lines.append(f"{s}\t{5000 + (start + t) % items}\t{1_396_000_000 + s * 100 + t}.{rng.integers(0, 999)}")
    path.write_text("\n".join(lines) + "\n")


RETRIEVAL = """
[preprocess]
input = "ratings.dat"
format = "csv"
separator = "::"
header = false
columns = [
  {{ name = "user", type = "int", role = "user" }},
  {{ name = "item", type = "int", role = "item" }},
  {{ name = "rating", type = "int", role = "none" }},
  {{ name = "timestamp", type = "timestamp" }},
]
[interactions]
batch_size = 64
ks = [5, 10]
[embedding]
optimizer = {{ type = "adam", lr = 0.01 }}
[model]
type = "{model}"
dim = 16
num_negatives = 16
[train]
epochs = 2
max_steps = 6
out_dir = "run"
"""

SEQUENTIAL = """
[preprocess]
input = "train.tsv"
test_input = "test.tsv"
format = "csv"
separator = "\\t"
header = true
columns = [
  {{ name = "SessionId", type = "int", role = "session" }},
  {{ name = "ItemId", type = "int", role = "item" }},
  {{ name = "Time", type = "timestamp" }},
]
[sequences]
protocol = "every_prefix"
batch_size = 32
ks = [5, 10]
[embedding]
optimizer = {{ type = "adam", lr = 0.003 }}
[model]
type = "{model}"
max_len = 8
dim = 16
[train]
epochs = 1
max_steps = 4
out_dir = "run"
"""

# the same data in the old dialect: [interactions] / [sequences] reading their own files (read for one release)
OLD_RETRIEVAL = """
[interactions]
files = "ratings.dat"
columns = ["user", "item", "rating", "timestamp"]
separator = "::"
batch_size = 64
ks = [5, 10]
[embedding]
optimizer = { type = "adam", lr = 0.01 }
[model]
type = "mf"
dim = 16
num_negatives = 16
[train]
epochs = 2
max_steps = 6
out_dir = "run"
"""

OLD_SEQUENTIAL = """
[sequences]
files = "train.tsv"
test_files = "test.tsv"
columns = ["session", "item", "timestamp"]
separator = "\\t"
header = true
protocol = "every_prefix"
batch_size = 32
ks = [5, 10]
[embedding]
optimizer = { type = "adam", lr = 0.003 }
[model]
type = "sasrec"
max_len = 8
dim = 16
[train]
epochs = 1
max_steps = 4
out_dir = "run"
"""


@pytest.fixture
def retrieval_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _write_ratings(tmp_path / "ratings.dat")
    (tmp_path / "two_tower.toml").write_text(RETRIEVAL.format(model="two_tower").replace("dim = 16", "dim = 16\nembedding_dim = 16\nuser_layers = [16]"))
    (tmp_path / "mf.toml").write_text(RETRIEVAL.format(model="mf"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def sequential_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _write_sessions(tmp_path / "train.tsv", 120)
    _write_sessions(tmp_path / "test.tsv", 20, seed=1, first=1000)
    for m in ("sasrec", "mlm", "gru4rec", "hstu"):
        (tmp_path / f"{m}.toml").write_text(SEQUENTIAL.format(model=m))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _last_json(out: str) -> dict[str, float]:
    line = [ln for ln in out.splitlines() if ln.strip().startswith("{")][-1]
    return dict(json.loads(line))


def _one_line_error(capsys: pytest.CaptureFixture[str], command: str) -> str:
    err = "\n".join(ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith("note: "))
    assert err.startswith(f"hugerec {command}: error: ") and "\n" not in err, err
    return err


# -- retrieval -------------------------------------------------------------------------------------
def test_two_tower_train_evaluate_index_recommend(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml"]) == 0
    trained = _last_json(capsys.readouterr().out)
    for key in ("recall@5", "ndcg@5", "mrr@5", "hitrate@5", "coverage@5", "recall@10", "coverage@10"):
        assert key in trained and 0.0 <= trained[key] <= 1.0
    assert trained["users"] == 40  # every user has 12 events: one held out each
    assert json.loads((retrieval_dir / "run" / "metrics.json").read_text()) == pytest.approx(trained, abs=1e-6)

    assert main(["evaluate", "two_tower.toml"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(trained, abs=1e-6)  # the same split, the same model

    assert main(["recommend", "two_tower.toml", "--users", "1,2,777", "--k", "5"]) == 0
    captured = capsys.readouterr()
    assert "1 of 3 users unknown to the model (777) got the most popular items" in captured.err
    recs = pl.read_parquet(retrieval_dir / "run" / "recommendations.parquet")
    assert recs.columns == ["user", "rank", "item", "score", "source"]
    assert recs.height == 15 and recs["rank"].to_list()[:5] == [1, 2, 3, 4, 5]
    assert set(recs.filter(pl.col("user") == 777)["source"]) == {"popularity"}
    assert set(recs.filter(pl.col("user") == 1)["source"]) == {"model"}
    assert recs["item"].min() >= 100  # raw item ids, not dense ones
    # user 1's training items (all but the last) are excluded
    fields = [line.split("::") for line in (retrieval_dir / "ratings.dat").read_text().splitlines()]
    raw = pl.DataFrame({"user": [int(f[0]) for f in fields], "item": [int(f[1]) for f in fields]})
    train = raw.with_row_index().filter(pl.col("index") < pl.col("index").max().over("user"))
    seen_1 = set(train.filter(pl.col("user") == 1)["item"].to_list())
    assert not seen_1 & set(recs.filter(pl.col("user") == 1)["item"].to_list())
    # the popularity fallback lists the most frequent training items
    counts = train["item"].value_counts().sort("count", descending=True)
    assert recs.filter(pl.col("user") == 777)["item"][0] in set(counts.filter(pl.col("count") == counts["count"][0])["item"])

    for kind in ("exact", "hnsw"):
        assert main(["index", "two_tower.toml", f"index.kind={kind}", "index.dtype=f16"]) == 0
        assert f"{kind} index of 30 items x 16" in capsys.readouterr().out
        assert (retrieval_dir / "run" / "index" / "index.json").is_file()
        assert main(["recommend", "two_tower.toml", "--users", "1,2", "--k", "5", "recommend.use_index=true", "--out", f"{kind}.parquet"]) == 0
        capsys.readouterr()
        from_index = pl.read_parquet(retrieval_dir / f"{kind}.parquet")
        exact = recs.filter(pl.col("user") != 777)
        if kind == "exact":
            assert from_index["item"].to_list() == exact["item"].to_list()
            assert from_index["score"].to_numpy() == pytest.approx(exact["score"].to_numpy(), abs=1e-5)
        else:  # 30 items: the graph finds the exact top 5
            assert set(from_index["item"].to_list()) == set(exact["item"].to_list())


def test_mf_with_time_split_and_bpr(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "mf.toml", "preprocess.split=time", "preprocess.eval_fraction=0.2", "model.loss=bpr"]) == 0
    out = capsys.readouterr().out
    assert "(time)" in out
    metrics = _last_json(out)
    assert 0 < metrics["users"] <= 40 and "recall@10" in metrics


def test_retrieval_bad_input_is_one_line(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", "two_tower.toml", "--users", "1"]) == 2  # nothing trained yet
    assert "no model at run/model.pt" in _one_line_error(capsys, "recommend")
    assert main(["train", "two_tower.toml"]) == 0
    capsys.readouterr()
    assert main(["recommend", "two_tower.toml", "--users", "1", "--k", "31"]) == 2
    assert "recommend.k = 31 is larger than the catalogue (30 items)" in _one_line_error(capsys, "recommend")
    assert main(["recommend", "two_tower.toml"]) == 2
    assert "no users given" in _one_line_error(capsys, "recommend")
    assert main(["recommend", "two_tower.toml", "--users", "1,a"]) == 2
    assert "--users: 'a' is not an integer id" in _one_line_error(capsys, "recommend")
    assert main(["recommend", "two_tower.toml", "--users", "1", "recommend.use_index=true"]) == 2
    assert "build it with `hugerec index`" in _one_line_error(capsys, "recommend")
    assert main(["evaluate", "two_tower.toml", "interactions.max_users=10"]) == 2
    assert "not the 40 / 30" in _one_line_error(capsys, "evaluate")
    assert main(["evaluate", "two_tower.toml", "model.type=mf"]) == 2
    assert "holds a 'two_tower' model" in _one_line_error(capsys, "evaluate")
    # an index of another model's width is refused, not queried
    assert main(["index", "two_tower.toml"]) == 0
    assert main(["train", "two_tower.toml", "model.dim=8"]) == 0
    capsys.readouterr()
    assert main(["recommend", "two_tower.toml", "--users", "1", "recommend.use_index=true"]) == 2
    assert "vectors of dim 16" in _one_line_error(capsys, "recommend")


def test_bad_log_names_file_line_and_column(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (retrieval_dir / "ratings.dat").write_text("1::100::5::1000\n1::101::5::later\n")
    assert main(["train", "two_tower.toml"]) == 2
    err = _one_line_error(capsys, "train")
    assert "ratings.dat" in err and "line 2" in err and "column 'timestamp'" in err and "'later'" in err
    (retrieval_dir / "ratings.dat").write_text("1::100::5::1000\n1::x::5::1001\n")
    assert main(["train", "two_tower.toml"]) == 2
    err = _one_line_error(capsys, "train")
    assert "ratings.dat" in err and "line 2" in err and "item" in err
    assert main(["train", "two_tower.toml", "preprocess.input=nothing/*.dat"]) == 2
    assert "preprocess.input" in _one_line_error(capsys, "train")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("preprocess.split=random", 'preprocess.split = "random": retrieval holds out by user or by time'),
        ("preprocess.split=leave_one_out", "preprocess.split: 'leave_one_out' is not one of"),
        ("interactions.ks=[0]", "ks must be a non-empty list of K >= 1"),
        ("model.loss=hinge", "loss must be one of ['sampled_softmax', 'bpr']"),
        ("model.negatives=some", "negatives must be one of ['in_batch', 'uniform', 'popularity', 'mixed'], got 'some'"),
        ("model.dimm=3", "unknown key 'model.dimm'; did you mean 'model.dim'?"),
        ("index.kind=ivf", "index.kind: 'ivf' is not one of ['exact', 'hnsw']"),
        ("index.dtype=i8", "dtype must be one of ['f32', 'f16'], got 'i8'"),
        ("recommend.k=0", "k must be >= 1"),
    ],
)
def test_config_mistakes_name_the_key(
    retrieval_dir: Path, override: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "two_tower.toml", override]) == 2
    assert message in _one_line_error(capsys, "train")


def test_print_config_lists_the_task_sections(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml", "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["preprocess"]["separator"] == "::" and cfg["preprocess"]["time_cutoff"] is None
    assert cfg["preprocess"]["input"] in (str(retrieval_dir / "ratings.dat"), "ratings.dat")
    assert cfg["interactions"] == {"min_item_count": 1, "max_users": None, "batch_size": 64, "ks": [5, 10]}
    for section, key in [("sequences", "gap_seconds"), ("sequences", "min_item_count"), ("index", "expansion_search"), ("recommend", "history_file")]:
        assert key in cfg[section], f"{section}.{key}"
    assert cfg["model"]["type"] == "two_tower" and cfg["model"]["recent"] == [1, 5] and cfg["model"]["negatives"] == "mixed"
    assert main(["train", "two_tower.toml", "model.type=sasrec", "--print-config"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["model"]["max_len"] == 50
    assert "model.embedding_dim" in out.err  # the two-tower fields the sequential model does not have are named


def test_index_and_recommend_refuse_ranking_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["index"]) == 2
    assert "has no item vectors" in _one_line_error(capsys, "index")
    assert main(["recommend"]) == 2
    assert "use `hugerec predict`" in _one_line_error(capsys, "recommend")


# -- sequential ------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["sasrec", "mlm", "gru4rec", "hstu"])
def test_sequential_train_and_evaluate(sequential_dir: Path, model: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", f"{model}.toml"]) == 0
    out = capsys.readouterr().out
    assert "(every_prefix" in out
    trained = _last_json(out)
    assert set(trained) == {"queries", "recall@5", "mrr@5", "ndcg@5", "recall@10", "mrr@10", "ndcg@10"}
    assert trained["mrr@5"] <= trained["recall@5"] <= trained["recall@10"]
    assert main(["evaluate", f"{model}.toml"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(trained, abs=1e-6)


def test_hstu_with_times_trains_and_evaluates_on_timestamps(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """model.times = true: the windows, the validation and the test histories carry the events' timestamps
    (the metrics differ from the same HSTU without them, and evaluate reads them again: the same figures);
    recommend takes the history's times (--history-times; refused in one line naming the key without them, and
    by a model trained without times), answering what recommend_next gives in process and what the exported
    next-items bundle answers with "items.times"."""
    assert main(["train", "hstu.toml"]) == 0
    plain = _last_json(capsys.readouterr().out)
    assert main(["recommend", "hstu.toml", "--history", "5001,5002", "--history-times", "1,2"]) == 2
    assert "recommend.history_times: " in _one_line_error(capsys, "recommend")
    assert main(["train", "hstu.toml", "model.times=true"]) == 0
    trained = _last_json(capsys.readouterr().out)
    assert trained != plain
    assert main(["evaluate", "hstu.toml", "model.times=true"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(trained, abs=1e-6)
    assert main(["recommend", "hstu.toml", "model.times=true", "--history", "5001,5002", "--k", "3"]) == 2
    err = _one_line_error(capsys, "recommend")
    assert "recommend.history_times: " in err and "trained with model.times = true; give one time in seconds per recommend.history item (2 items, 0 times" in err
    assert main(["recommend", "hstu.toml", "--history", "5001,5002", "--history-times", "1," + "9" * 30]) == 2
    assert "--history-times: '999999999999999999999999999999' is not a time in seconds" in _one_line_error(capsys, "recommend")
    history, times = [5001, 5002, 99, 5003], [1_700_000_000, 1_700_000_600, 1_700_000_700, 1_700_090_000]  # 99: unknown
    args = ["--history", ",".join(map(str, history)), "--history-times", ",".join(map(str, times)), "--k", "4"]
    assert main(["recommend", "hstu.toml", "model.times=true", *args]) == 0
    capsys.readouterr()
    recs = pl.read_parquet(sequential_dir / "run" / "recommendations.parquet")

    from hugerec.serving.bundles.any_bundle import load
    from hugerec.serving.runtime.next_items_model import NextItemsModel
    from hugerec.training.model_file import load_model
    from hugerec.training.sequential import recommend_next

    saved = load_model(sequential_dir / "run" / "model.pt")
    known = np.array([h != 99 for h in history])
    dense = saved.lookup(np.array(history)[known])
    items, scores = recommend_next(saved.model, [dense], k=4, exclude_history=True, times=[np.array(times)[known]])  # type: ignore[arg-type]
    assert recs["item"].to_list() == saved.items_raw[items[0] - 1].tolist()
    np.testing.assert_allclose(recs["score"].to_numpy(), scores[0], rtol=1e-5)
    assert main(["export", "hstu.toml", "model.times=true"]) == 0
    capsys.readouterr()
    served = load(sequential_dir / "run" / "bundle")
    assert isinstance(served, NextItemsModel) and served.uses_times
    out = served.next_items(np.array(history), np.array([4]), k=4, times=np.array(times))
    assert out["items"][0].tolist() == recs["item"].to_list() and out["unknown_items"].tolist() == [1]
    assert main(["train", "hstu.toml", "model.times=1"]) == 2
    assert "model.times: expected true or false, got 1" in _one_line_error(capsys, "train")


def test_sequential_recommend_history(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "sasrec.toml"]) == 0
    capsys.readouterr()
    assert main(["recommend", "sasrec.toml", "--history", "5001,99,5002", "--k", "4"]) == 0
    err = capsys.readouterr().err
    assert "1 unknown item(s) skipped in 1 of 1 histories" in err
    recs = pl.read_parquet(sequential_dir / "run" / "recommendations.parquet")
    assert recs.columns == ["history", "rank", "item", "score", "source", "unknown_items"]
    assert recs.height == 4 and set(recs["unknown_items"]) == {1} and set(recs["source"]) == {"model"}
    assert not {5001, 5002} & set(recs["item"].to_list())  # the history's own items are excluded by default
    assert recs["score"].is_sorted(descending=True)

    (sequential_dir / "histories.txt").write_text("5001,5002,5003\n\n42\n" + ",".join(str(5000 + i % 25) for i in range(40)) + "\n")
    assert main(["recommend", "sasrec.toml", "recommend.history_file=histories.txt", "recommend.exclude_seen=false", "--k", "3"]) == 0
    assert "1 histories have no item the model knows" in capsys.readouterr().err
    recs = pl.read_parquet(sequential_dir / "run" / "recommendations.parquet")
    assert recs["history"].to_list() == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # the 40-item history is cut to max_len, not refused
    assert recs.filter(pl.col("history") == 1)["source"].to_list() == ["popularity"] * 3

    assert main(["index", "sasrec.toml"]) == 0
    capsys.readouterr()
    assert main(["recommend", "sasrec.toml", "--history", "5001,5002", "--k", "4", "recommend.use_index=true", "--out", "ix.parquet"]) == 0
    assert main(["recommend", "sasrec.toml", "--history", "5001,5002", "--k", "4", "--out", "exact.parquet"]) == 0
    capsys.readouterr()
    assert pl.read_parquet("ix.parquet")["item"].to_list() == pl.read_parquet("exact.parquet")["item"].to_list()

    assert main(["recommend", "sasrec.toml", "--k", "3"]) == 2
    assert "no history given" in _one_line_error(capsys, "recommend")
    assert main(["recommend", "sasrec.toml", "--history", "1", "--k", "26"]) == 2
    assert "larger than the catalogue (25 items)" in _one_line_error(capsys, "recommend")


def test_sessions_from_a_gap_and_a_day_split(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No session column: one user log cut by inactivity; no test file: the last day's sessions are the test."""
    rows = ["SessionId\tItemId\tTime"]
    for s in range(60):  # 60 sessions of one "user" 1, an hour apart, spread over ~2.5 days
        for t in range(4):
            rows.append(f"1\t{5000 + (s + t) % 20}\t{1_396_000_000 + s * 3600 + t * 10}")
    (sequential_dir / "log.tsv").write_text("\n".join(rows) + "\n")
    args = ["train", "sasrec.toml", "preprocess.input=log.tsv", "preprocess.test_input=none", "sequences.gap_seconds=600"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # 24 sessions in the last day, 3 prefixes each; of the 36 before it, the latest 3 are the validation split
    assert "33 training sequences" in out and "9 validation / 72 test queries" in out
    assert main([*args, "sequences.protocol=leave_last_out"]) == 0
    assert "60 training sequences" in capsys.readouterr().out


def test_sequential_config_mistakes(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "sasrec.toml", "sequences.min_length=1"]) == 2
    assert "min_length must be >= 2" in _one_line_error(capsys, "train")
    assert main(["train", "sasrec.toml", "model.loss=bpr"]) == 2
    assert "loss must be one of ['sampled_softmax', 'full_softmax', 'bce']" in _one_line_error(capsys, "train")
    assert main(["train", "sasrec.toml", "model.dim=10", "model.num_heads=3"]) == 2
    assert "dim 10 is not divisible by num_heads 3" in _one_line_error(capsys, "train")
    assert main(["train", "sasrec.toml", "sequences.group=user"]) == 2
    assert 'needs a column with role "user"' in _one_line_error(capsys, "train")
    assert main(["train", "sasrec.toml", "sequences.group=item"]) == 2
    assert "group must be 'session' or 'user' (or none), got 'item'" in _one_line_error(capsys, "train")
    assert main(["train", "sasrec.toml", "model.mask_prob=0.3"]) == 2
    assert "unknown key 'model.mask_prob'" in _one_line_error(capsys, "train")


def test_sampled_softmax_and_bce_train(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for loss in ("sampled_softmax", "bce"):
        assert main(["train", "sasrec.toml", f"model.loss={loss}", "model.num_negatives=8"]) == 0
        assert "recall@10" in _last_json(capsys.readouterr().out)


def test_sliding_windows_train_on_more_windows(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Sessions of up to 6 items, max_len 2: "last" trains one window per session, "sliding" several."""
    seen = {}
    for windows in ("last", "sliding"):
        assert main(["train", "sasrec.toml", "model.max_len=2", f"sequences.windows={windows}", "train.max_steps=none"]) == 0
        seen[windows] = int(capsys.readouterr().out.split(" steps,")[0].split()[-1].replace(",", ""))
    assert seen["sliding"] > seen["last"] >= 1


def test_reversed_augmentation_adds_a_window_per_sequence(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sequences.augment_reversed trains on every sequence and its reversed copy: twice the windows (batch 1 here)."""
    seen = {}
    for flag in ("false", "true"):
        args = ["train", "sasrec.toml", "sequences.batch_size=1", f"sequences.augment_reversed={flag}", "train.max_steps=none"]
        assert main(args) == 0
        seen[flag] = int(capsys.readouterr().out.split(" steps,")[0].split()[-1].replace(",", ""))
    assert seen["true"] == 2 * seen["false"]


# -- the shipped configs on the real samples -----------------------------------------------------------
FAST = ["train.max_steps=3", "train.epochs=1"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # a torchrun launch of 2 processes, each importing torch
@pytest.mark.parametrize(("model", "row_wise"), [("two_tower", ("user_id", "item_id")), ("sasrec", ("item",)), ("hstu", ("item",))])
def test_torchrun_two_ranks_shard_the_id_tables_and_write_the_whole_model(
    retrieval_dir: Path, model: str, row_wise: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`torchrun --nproc-per-node 2 -m hugerec train` of a two-tower, a SASRec and an HSTU (whose ranking
    head no step trains here: DDP is told of such parameters): rank 0 prints the plan with the id tables
    row-wise and the held-out metrics; model.pt holds the whole model (`evaluate` in one process gives the
    same metrics)."""
    if model in ("sasrec", "hstu"):  # the same ratings as user histories, leave-last-out
        config = SEQUENTIAL.format(model=model).replace('input = "train.tsv"\ntest_input = "test.tsv"', 'input = "ratings.dat"')
        config = config.replace('separator = "\\t"\nheader = true', 'separator = "::"\nheader = false')
        config = config.replace(
            '{ name = "SessionId", type = "int", role = "session" },\n  { name = "ItemId", type = "int", role = "item" },\n  { name = "Time", type = "timestamp" },',
            '{ name = "user", type = "int", role = "user" },\n  { name = "item", type = "int", role = "item" },\n'
            '  { name = "rating", type = "int", role = "none" },\n  { name = "timestamp", type = "timestamp" },',
        ).replace('protocol = "every_prefix"', 'protocol = "leave_last_out"')
        (retrieval_dir / f"{model}.toml").write_text(config)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "hugerec", "train", f"{model}.toml", "train.progress=false"]
    proc = subprocess.run(cmd, cwd=retrieval_dir, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for table in row_wise:
        assert re.search(rf"^{table}\s*\|\s*row_wise", proc.stdout, re.M), proc.stdout
    assert proc.stdout.count("train: done in") == 1  # rank 0 speaks for both ranks
    trained = _last_json(proc.stdout)
    assert main(["evaluate", f"{model}.toml"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(trained, abs=1e-6)


@pytest.mark.shared_data("movielens/ml-1m/ratings.dat.gz")
def test_movielens_two_tower_config_runs(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    small = [*FAST, "interactions.max_users=60", "model.num_negatives=64", "interactions.batch_size=256"]
    assert main(["train", "configs/movielens_two_tower.toml", *small]) == 0
    out = capsys.readouterr().out
    assert "60 users" in out and _last_json(out)["users"] == 60
    assert main(["recommend", "configs/movielens_two_tower.toml", "--users", "1,2,3", "--k", "10", *small]) == 0
    assert pl.read_parquet(tmp_path / "runs" / "movielens_two_tower" / "recommendations.parquet").height == 30


@pytest.mark.shared_data("movielens/ml-1m/ratings.dat.gz")
def test_movielens_sasrec_config_runs(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    small = [*FAST, "sequences.max_sequences=100"]
    assert main(["train", "configs/movielens_sasrec.toml", *small]) == 0
    out = capsys.readouterr().out
    assert "(leave_last_out)" in out and _last_json(out)["queries"] == 100
    assert main(["recommend", "configs/movielens_sasrec.toml", "--history", "1193,661,914", "--k", "10", *small]) == 0


@pytest.mark.shared_data("yoochoose/yoochoose-clicks-100k_train_full.txt.gz", "yoochoose/yoochoose-clicks-100k_test.txt.gz")
def test_yoochoose_sasrec_config_runs(shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", "configs/yoochoose_sasrec.toml", *FAST, "sequences.max_sequences=2000"]) == 0
    metrics = _last_json(capsys.readouterr().out)
    assert metrics["queries"] > 1000 and 0.0 <= metrics["mrr@20"] <= metrics["recall@20"] <= 1.0


def test_export_sequential_model_to_a_next_items_bundle(sequential_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hugerec.serving.bundles.any_bundle import load
    from hugerec.serving.runtime.next_items_model import NextItemsModel

    assert main(["train", "sasrec.toml"]) == 0
    assert main(["export", "sasrec.toml", "recommend.k=4"]) == 0
    assert "next-items bundle -> run/bundle" in capsys.readouterr().out
    served = load(sequential_dir / "run" / "bundle")
    assert isinstance(served, NextItemsModel) and served.name == "sasrec" and served.k == 4
    out = served.next_items(np.array([5001, 5002, 77]), np.array([3]))
    assert out["items"].shape == (1, 4) and out["unknown_items"].tolist() == [1]
    assert main(["recommend", "sasrec.toml", "--history", "5001,5002,77", "--k", "4"]) == 0
    capsys.readouterr()
    assert pl.read_parquet(sequential_dir / "run" / "recommendations.parquet")["item"].to_list() == out["items"][0].tolist()


def test_export_of_a_retrieval_model_says_what_to_use(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml"]) == 0
    capsys.readouterr()
    assert main(["export", "two_tower.toml"]) == 2
    assert "use `hugerec index` and `hugerec recommend`" in _one_line_error(capsys, "export")


def test_a_model_that_does_not_fit_the_roles_names_the_key(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A two-tower over an input without a user role is refused when the config is read, in one line."""
    text = (retrieval_dir / "two_tower.toml").read_text().replace('role = "user"', 'role = "none"')
    (retrieval_dir / "no_user.toml").write_text(text)
    assert main(["train", "no_user.toml"]) == 2
    err = _one_line_error(capsys, "train")
    assert "model.type = 'two_tower' (retrieval) needs a column with role \"user\" in preprocess.columns" in err
    assert "the declared roles are ['item', 'none', 'timestamp']" in err
    assert main(["train", "no_user.toml", "model.type=sasrec"]) == 2  # a sequential model groups by session or user
    assert 'needs a column with role "session | user"' in _one_line_error(capsys, "train")


def test_the_old_dialect_reads_for_one_release_with_one_line(
    retrieval_dir: Path, sequential_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """[interactions] / [sequences] with their own files train as before, saying once which keys replace them;
    the same model and metrics as the new dialect's config."""
    (retrieval_dir / "old_mf.toml").write_text(OLD_RETRIEVAL)
    assert main(["train", "old_mf.toml"]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "[interactions] files, columns, separator are the old dialect" in notes[0]
    assert "preprocess.input" in notes[0] and "preprocess.columns" in notes[0]
    old = _last_json(captured.out)
    assert main(["train", "mf.toml"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(old, abs=1e-6)

    (sequential_dir / "old_sasrec.toml").write_text(OLD_SEQUENTIAL)
    assert main(["train", "old_sasrec.toml"]) == 0
    captured = capsys.readouterr()
    assert "[sequences] files, columns, separator, header, test_files are the old dialect" in captured.err
    old = _last_json(captured.out)
    assert main(["train", "sasrec.toml"]) == 0
    assert _last_json(capsys.readouterr().out) == pytest.approx(old, abs=1e-6)


def test_a_config_mixing_the_dialects_is_refused(retrieval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "two_tower.toml", "interactions.files=ratings.dat"]) == 2
    err = _one_line_error(capsys, "train")
    assert "interactions.files and preprocess.input: the config mixes the old dialect" in err
