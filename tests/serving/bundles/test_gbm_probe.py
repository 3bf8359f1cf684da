"""The GBM probe, the child side of a model load: probe() scores the rows with the library (its raw scores, its
feature names and count); run as `python -I gbm_probe.py REQUEST.json` it writes the answer as JSON and exits 0,
or writes the library's error and exits 1. Needs lightgbm (skipped without)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hugerec.serving.bundles import gbm_probe

lightgbm = pytest.importorskip("lightgbm")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, np.ndarray]:
    folder = tmp_path_factory.mktemp("probe")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2)).astype(np.float32)
    booster = lightgbm.train(
        {"objective": "binary", "verbose": -1, "num_leaves": 4},
        lightgbm.Dataset(x, (x[:, 0] > 0).astype(float), feature_name=["a", "b"]),
        4,
    )
    booster.save_model(str(folder / "model.txt"))
    np.save(folder / "rows.npy", x[:7])
    return folder / "model.txt", folder / "rows.npy", booster.predict(x[:7], raw_score=True)


def test_probe_scores_with_the_library(model: tuple[Path, Path, np.ndarray]) -> None:
    path, rows, want = model
    answer = gbm_probe.probe({"library": "lightgbm", "model": str(path), "rows": str(rows)})
    assert answer["num_features"] == 2 and answer["feature_names"] == ["a", "b"]
    np.testing.assert_allclose(answer["margins"], want, rtol=1e-12)
    with pytest.raises(ValueError, match="unknown library 'catboost'"):
        gbm_probe.probe({"library": "catboost", "model": str(path), "rows": str(rows)})


def _run(tmp_path: Path, model_path: Path, rows: Path) -> tuple[int, dict[str, object]]:
    request = {
        "library": "lightgbm",
        "model": str(model_path),
        "rows": str(rows),
        "result": str(tmp_path / "answer.json"),
        "memory_bytes": 4 << 30,
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run(
        [sys.executable, "-I", gbm_probe.__file__, str(tmp_path / "request.json")], capture_output=True, timeout=120
    )
    assert not (tmp_path / "answer.tmp").exists()
    return done.returncode, json.loads((tmp_path / "answer.json").read_text())


def test_the_child_answers_in_json(model: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    path, rows, want = model
    code, answer = _run(tmp_path, path, rows)
    assert code == 0
    np.testing.assert_allclose(answer["margins"], want, rtol=1e-12)  # type: ignore[arg-type]


def test_the_child_reports_the_librarys_error(model: tuple[Path, Path, np.ndarray], tmp_path: Path) -> None:
    _, rows, _ = model
    junk = tmp_path / "junk.txt"
    junk.write_text("tree\nversion=v4\n")
    code, answer = _run(tmp_path, junk, rows)
    assert code == 1 and set(answer) == {"error"} and "LightGBMError" in str(answer["error"])
