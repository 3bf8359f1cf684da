"""model.type = "lightgbm" | "xgboost" through the CLI: train, evaluate, predict, export on the tiny quickstart data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hugerec.cli import main
from hugerec.cli.commands import export_model
from hugerec.cli.config_file import ConfigError
from hugerec.cli.gbm_commands import evaluate_trees_cmd, predict_trees, train_trees
from hugerec.cli.run_config import load_run_config
from hugerec.data.matrix import read_matrix
from hugerec.data.schema import Schema
from hugerec.serving.bundles.any_bundle import load
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.served_model import ServedModel
from tests.cli.conftest import TINY

pytest.importorskip("lightgbm")
pytest.importorskip("xgboost")


@pytest.mark.parametrize("kind", ["lightgbm", "xgboost"])
def test_train_evaluate_predict_export(kind: str, prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    cfg = load_run_config(
        None,
        [*TINY, f"model.type={kind}", "model.num_trees=30", "model.threads=1", f"train.out_dir=runs/{kind}"],
    )
    history = train_trees(cfg)
    out = cfg.out_dir
    model_file = out / ("model.txt" if kind == "lightgbm" else "model.json")
    for name in ("metrics.jsonl", "curves.png", "config.json", "model.meta.json"):
        assert (out / name).is_file(), name
    assert model_file.is_file()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "eval"}
    assert history.final_eval is not None and 0.5 < history.final_eval["auc"] <= 1.0
    assert 1 <= history.best_round <= history.rounds <= 30

    metrics = evaluate_trees_cmd(cfg)
    assert metrics["auc"] == pytest.approx(history.final_eval["auc"], abs=1e-9)
    assert set(metrics) >= {"auc", "logloss", "calibration"}

    path, rows = predict_trees(cfg)
    table = pq.read_table(path)
    assert table.num_rows == rows and table.column_names == ["label", "probability"]

    bundle = export_model(cfg)
    loaded = load(bundle)
    assert isinstance(loaded, ServedModel) and loaded.kind == "gbm"
    loaded.close()  # its batcher: the trees are called directly below
    schema = Schema.load(prepared / "runs/quickstart/data/schema.json")
    m = read_matrix(cfg.data.eval or "", schema)
    x = m.x[:64]
    ids = {f: (x[:, m.num_dense + j].astype(np.int64), np.ones(64, np.int32)) for j, f in enumerate(schema.sparse_names)}
    served = loaded.model.predict(ModelInputs(np.ascontiguousarray(x[:, : m.num_dense]), ids))
    probability = table.column("probability").to_numpy()[:64]
    np.testing.assert_allclose(1 / (1 + np.exp(-served)), probability, rtol=1e-5, atol=1e-6)


def test_cli_errors_are_one_line(prepared: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(prepared)
    assert main(["train", "model.type=lightgbm", "model.num_leaves=0"]) == 2
    assert "num_leaves must be > 0, got 0" in capsys.readouterr().err
    assert main(["train", "model.type=xgboost", "model.max_dpth=3"]) == 2
    assert "model.max_depth" in capsys.readouterr().err  # the suggestion
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="trains in one process; sharded / distributed training"):
        train_trees(load_run_config(None, [*TINY, "model.type=lightgbm"]))


def test_missing_extra_is_one_line(prepared: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(prepared)
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # as if `pip install hugerec` without [gbm]
    assert main(["train", *TINY, "model.type=lightgbm", "train.out_dir=runs/noextra"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the note on the default [model]'s keys
    assert err == (
        "hugerec train: error: model.type = 'lightgbm' needs the lightgbm package: pip install 'hugerec[gbm]'"
    )


def test_multi_hot_schema_is_refused(tmp_path: Path) -> None:
    schema = Schema.build(["label"], ["d"], {"tags": 10}, multi_hot=["tags"])
    with pytest.raises(ValueError, match="'tags' is multi-hot; tree models take one id per example"):
        read_matrix(tmp_path, schema)


@pytest.mark.slow
def test_quickstart_with_trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["quickstart", *TINY, "model.type=lightgbm", "model.num_trees=10", "model.threads=1"]) == 0
    out = capsys.readouterr().out
    assert "eval AUC" in out and "runs/quickstart/model.txt" in out
    assert (tmp_path / "runs/quickstart/model.meta.json").is_file()


def _ranking_shards(root: Path, seed: int, queries: int, shuffle: bool) -> Path:
    """A small learning-to-rank set: queries of 1..11 rows, grades 0..3 from the features, a `query`
    column beside them (not a feature); `shuffle`: the queries' rows interleaved."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 12, queries)
    n = int(sizes.sum())
    query = np.repeat(np.arange(queries), sizes) * 7 + 1000  # any ids: not 0..Q-1
    dense = rng.normal(size=(n, 2)).astype(np.float32)
    ids = rng.integers(0, 20, size=(n, 2))
    signal = dense[:, 0] + (ids[:, 0] % 4 == 0) + 0.3 * rng.normal(size=n)
    label = np.digitize(signal, [0.5, 1.2, 2.0]).astype(np.float32)
    order = rng.permutation(n) if shuffle else np.arange(n)
    table = pa.table(
        {"label": label, "I1": dense[:, 0], "I2": dense[:, 1], "C1": ids[:, 0], "C2": ids[:, 1], "query": query}
    ).take(order)
    root.mkdir(parents=True)
    pq.write_table(table, root / "part-0.parquet")
    return root


@pytest.mark.parametrize(("kind", "objective"), [("lightgbm", "lambdarank"), ("xgboost", "rank:ndcg")])
def test_ranking_train_evaluate_export_serve(
    kind: str, objective: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hugerec train / evaluate / predict / export` with a ranking objective on shards with a query column;
    the served raw scores equal the library's predict."""
    from hugerec.models.gbm import Library, TreeModel
    from hugerec.training.query_metrics import query_metrics

    monkeypatch.chdir(tmp_path)
    _ranking_shards(tmp_path / "data/train", 0, 120, shuffle=False)
    _ranking_shards(tmp_path / "data/eval", 1, 40, shuffle=True)  # queries not contiguous: regrouped
    schema = Schema.build(["label"], ["I1", "I2"], {"C1": 20, "C2": 20})
    schema.save(tmp_path / "data/schema.json")
    args = [
        "data.train=data/train", "data.eval=data/eval", "data.schema=data/schema.json", "train.out_dir=runs/rank",
        "train.progress=false", "train.tensorboard=false", f"model.type={kind}", f"model.objective={objective}",
        "model.group=query", "model.eval_at=5", "model.num_trees=20", "model.threads=1",
    ]  # fmt: skip
    if kind == "lightgbm":
        args.append("model.min_data_in_leaf=5")
    assert main(["train", *args]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "eval ndcg@5" in out and "map@5" in out and "mrr@5" in out, out
    assert main(["evaluate", *args]) == 0, capsys.readouterr().err
    metrics = json.loads(capsys.readouterr().out)
    assert 0.5 < metrics["ndcg@5"] <= 1.0 and metrics["queries"] + metrics["queries_without_relevant"] == 40

    library = Library(kind)
    model = TreeModel.load(tmp_path / "runs/rank" / library.model_file, library)
    eval_ = read_matrix("data/eval", schema, group="query")
    assert metrics == pytest.approx(query_metrics(model.margin(eval_.x), eval_.labels, eval_.groups, 5))

    assert main(["predict", *args]) == 0, capsys.readouterr().err
    table = pq.read_table("runs/rank/predictions.parquet")
    rows = read_matrix("data/eval", schema, grades=True)  # the input's order
    assert table.column_names == ["label", "score"]
    np.testing.assert_allclose(table.column("score").to_numpy(), model.margin(rows.x), rtol=1e-6, atol=1e-6)

    assert main(["export", *args]) == 0, capsys.readouterr().err
    bundle = load("runs/rank/bundle")
    assert isinstance(bundle, ServedModel)
    bundle.close()  # its batcher: the trees are called directly below
    assert bundle.info["objective"] == objective and bundle.info["group"] == "query"
    served = bundle.model
    x = rows.x
    ids = {f: (x[:, 2 + j].astype(np.int64), np.ones(len(x), np.int32)) for j, f in enumerate(("C1", "C2"))}
    logits = served.predict(ModelInputs(np.ascontiguousarray(x[:, :2]), ids))
    if kind == "lightgbm":
        np.testing.assert_array_equal(logits, model.margin(x).astype(np.float32))
    else:
        np.testing.assert_allclose(logits, model.margin(x), rtol=1e-5, atol=1e-5)


def test_ranking_config_errors_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _ranking_shards(tmp_path / "data/train", 0, 10, shuffle=False)
    Schema.build(["label"], ["I1", "I2"], {"C1": 20, "C2": 20}).save(tmp_path / "data/schema.json")
    base = ["data.train=data/train", "data.eval=null", "data.schema=data/schema.json", "model.type=lightgbm"]
    assert main(["train", *base, "model.objective=lambdarank"]) == 2
    assert "set model.group to the column" in capsys.readouterr().err
    assert main(["train", *base, "model.objective=lambdarank", "model.group=session"]) == 2
    assert "data.train: model.group: column 'session' is not in" in capsys.readouterr().err
    assert main(["train", *base, "model.objective=rank:ndcg"]) == 2
    assert "objective must be one of ['binary', 'lambdarank'] for lightgbm, got 'rank:ndcg'" in capsys.readouterr().err
    assert main(["train", *base, "model.group=query"]) == 2
    assert "group 'query' is only for a ranking objective" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"label column 'label' must hold 0 or 1, got [23]"):  # grades, binary model
        read_matrix("data/train", Schema.load(tmp_path / "data/schema.json"))


def test_queries_are_made_contiguous() -> None:
    from hugerec.data.matrix import query_order

    order, sizes = query_order(np.array([5, 3, 5, 3, 9, 5]))
    assert order is not None and order.tolist() == [0, 2, 5, 1, 3, 4] and sizes.tolist() == [3, 2, 1]
    order, sizes = query_order(np.array(["b", "b", "a", "c", "c", "c"], dtype=object))
    assert order is None and sizes.tolist() == [2, 1, 3]


def test_trees_leave_out_multi_hot_columns_so_one_config_serves_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Paper cut 6: a config whose data has a multi-hot column trains a DLRM and, with model.type =
    "lightgbm", trees over the other columns (said on one line); evaluate, predict and export read the
    trees' own schema, and the exported bundle scores raw requests that still carry the multi-hot field."""
    from tests.cli.conftest import write_click_log

    monkeypatch.chdir(tmp_path)
    rows = write_click_log(tmp_path / "clicks.csv")
    assert main(["schema", "clicks.csv", "--out", "c.toml"]) == 0
    toml = (tmp_path / "c.toml").read_text().replace("[preprocess]", '[preprocess]\nout = "data"')
    toml += '\n[data]\ntrain = "data/train"\neval = "data/eval"\n\n[embedding]\ndim = 8\n\n[train]\nout_dir = "run"\n'
    (tmp_path / "c.toml").write_text(toml)
    fast = ["train.progress=false", "train.tensorboard=false", "train.plot=false"]
    assert main(["preprocess", "c.toml"]) == 0, capsys.readouterr().err
    assert main(["train", "c.toml", *fast, "train.max_steps=2", "model.bottom=[8]", "model.top=[8,1]"]) == 0
    capsys.readouterr()
    trees = [*fast, "model.type=lightgbm", "model.num_trees=5", "model.threads=1", "model.min_data_in_leaf=5", "train.out_dir=trees"]
    assert main(["train", "c.toml", *trees]) == 0, capsys.readouterr().err
    assert "train: trees take one id per feature; they leave out the multi-hot column(s) ['tags']" in capsys.readouterr().out
    for command in ("evaluate", "predict", "export"):
        assert main([command, "c.toml", *trees]) == 0, capsys.readouterr().err
    bundle = load(tmp_path / "trees" / "bundle")
    assert isinstance(bundle, ServedModel)
    bundle.close()  # its batcher: the trees are called directly below
    assert bundle.model.features == ("user_id", "category")
    raw = [{k: v for k, v in row.items() if k != "clicked"} for row in rows[:5]]
    assert all("tags" in r for r in raw)
    logits = bundle.model.predict(bundle.preprocess(raw))
    assert logits.shape == (5,) and np.isfinite(logits).all()
