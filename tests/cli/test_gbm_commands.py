"""model.type = "lightgbm" | "xgboost" through the CLI: train, evaluate, predict, export on the tiny quickstart data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from hugerec.cli import main
from hugerec.cli.config_file import ConfigError
from hugerec.cli.gbm_commands import evaluate_trees_cmd, export_trees, predict_trees, train_trees
from hugerec.cli.run_config import load_run_config
from hugerec.data.matrix import read_matrix
from hugerec.data.schema import Schema
from hugerec.serving.gbm import load_gbm_bundle
from hugerec.serving.inference_model import ModelInputs
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

    bundle = export_trees(cfg)
    loaded = load_gbm_bundle(bundle)
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
