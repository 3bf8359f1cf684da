"""Reading a GBM model file for serving: our parser checks it first, the library parses it only in a child
process (whose crashes and hangs on the issue's files are refusals here), and both must agree."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hugerec.models.gbm import Library
from hugerec.serving.bundles import gbm_file
from hugerec.serving.bundles.gbm_file import PROBE, probe_rows, read_gbm_file
from hugerec.serving.bundles.isolated_load import LoadRefused, run_child
from hugerec.serving.runtime.forest import Forest
from hugerec.serving.runtime.forest_check import ModelFileError

lightgbm = pytest.importorskip("lightgbm")
xgboost = pytest.importorskip("xgboost")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[Library, Path]:
    """A small LightGBM model.txt and XGBoost model.json with named features and categorical splits."""
    root = tmp_path_factory.mktemp("gbm_file")
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=800), rng.normal(size=800), rng.integers(0, 20, size=800)]).astype(np.float32)
    x[rng.random(x.shape) < 0.1] = np.nan
    y = ((np.nan_to_num(x[:, 0]) + (np.nan_to_num(x[:, 2]) % 4 == 0)) > 0.3).astype(np.float32)
    names = ["I1", "I2", "C1"]
    params = {"objective": "binary", "num_leaves": 8, "verbose": -1, "min_data_per_group": 5, "num_threads": 1}
    lgb = lightgbm.train(params, lightgbm.Dataset(x, y, feature_name=names, categorical_feature=[2]), num_boost_round=30)
    lgb.save_model(root / "model.txt")
    d = xgboost.DMatrix(x, y, feature_names=names, feature_types=["q", "q", "c"], enable_categorical=True)
    xgb = xgboost.train({"objective": "binary:logistic", "max_depth": 4, "nthread": 1}, d, num_boost_round=30)
    xgb.save_model(root / "model.json")
    return {Library.LIGHTGBM: root / "model.txt", Library.XGBOOST: root / "model.json"}


def _copy(models: dict[Library, Path], tmp_path: Path, library: Library, edit: Any) -> Path:
    out = tmp_path / library.model_file
    out.write_bytes(edit(models[library].read_bytes()))
    return out


def _truncated(raw: bytes) -> bytes:
    return raw[: raw.index(b"end of trees") // 2]


def _tree_sizes_off(raw: bytes) -> bytes:
    return re.sub(rb"tree_sizes=(\d+)", lambda m: b"tree_sizes=" + str(int(m.group(1)) + 7).encode(), raw, count=1)


@pytest.mark.parametrize("library", list(Library), ids=lambda lib: lib.value)
def test_a_good_file_is_read_checked_and_agreed_with(models: dict[Library, Path], library: Library) -> None:
    path = models[library]
    checked = read_gbm_file(path, library, 120.0, hashlib.sha256(path.read_bytes()).hexdigest())
    assert checked.feature_names == ("I1", "I2", "C1") and checked.forest.num_trees == 30
    x = probe_rows(checked.forest, seed=3)
    if library is Library.LIGHTGBM:
        want = lightgbm.Booster(model_file=path).predict(x, raw_score=True)
        np.testing.assert_array_equal(checked.forest.margin(x), want)
    else:
        want = xgboost.Booster(model_file=path).inplace_predict(x, predict_type="margin")
        np.testing.assert_allclose(checked.forest.margin(x), want, rtol=1e-5, atol=1e-5)


def test_the_library_is_never_imported_by_the_server_side_load(models: dict[Library, Path]) -> None:
    code = (
        "import sys; from hugerec.models.gbm import Library; from hugerec.serving.bundles.gbm_file import read_gbm_file\n"
        f"read_gbm_file({str(models[Library.LIGHTGBM])!r}, Library.LIGHTGBM, 120.0)\n"
        f"read_gbm_file({str(models[Library.XGBOOST])!r}, Library.XGBOOST, 120.0)\n"
        "print(sorted(m for m in ('lightgbm', 'xgboost') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def _library_child(path: Path, library: Library, tmp_path: Path, deadline_s: float = 120.0) -> str:
    """The library alone on `path`, in its child: what the server would have run in process before."""
    rows = tmp_path / "rows.npy"
    np.save(rows, np.zeros((4, 5), np.float32), allow_pickle=False)
    request = {"library": library.value, "model": str(path), "rows": str(rows), "memory_bytes": 4 << 30}
    with pytest.raises(LoadRefused) as caught:
        run_child(PROBE, request, deadline_s, str(path))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path)), message
    return message


def test_the_librarys_crashes_on_the_issues_files_stay_in_the_child(models: dict[Library, Path], tmp_path: Path) -> None:
    """LightGBM's parser dies (SIGSEGV on a truncated model.txt, SIGABRT on a tree_sizes mismatch) or
    runs for minutes (a long garbage line): each is a one-line refusal, and this process lives on."""
    truncated = _copy(models, tmp_path, Library.LIGHTGBM, _truncated)
    assert "SIGSEGV" in _library_child(truncated, Library.LIGHTGBM, tmp_path)
    sizes = _copy(models, tmp_path, Library.LIGHTGBM, _tree_sizes_off)
    assert "SIGABRT" in _library_child(sizes, Library.LIGHTGBM, tmp_path)
    garbage = _copy(models, tmp_path, Library.LIGHTGBM, lambda raw: raw.replace(b"Tree=0\n", b"Tree=0\n" + b"x" * 5_000_000 + b"\n", 1))
    message = _library_child(garbage, Library.LIGHTGBM, tmp_path, deadline_s=4.0)
    assert "no answer within 4 s" in message or "SIGABRT" in message  # killed at the deadline, or it gave up first
    xgb_bad = _copy(models, tmp_path, Library.XGBOOST, lambda raw: raw[: len(raw) // 2])
    assert "XGBoostError" in _library_child(xgb_bad, Library.XGBOOST, tmp_path)


@pytest.mark.parametrize(
    ("library", "edit", "needle"),
    [
        (Library.LIGHTGBM, _truncated, "a truncated model file"),
        (Library.LIGHTGBM, _tree_sizes_off, "tree 0: tree_sizes= says"),
        (Library.LIGHTGBM, lambda raw: bytes(range(256)) * 100, "not UTF-8"),
        (Library.LIGHTGBM, lambda raw: raw.replace(b"Tree=0\n", b"Tree=0\n" + b"x" * 5_000_000 + b"\n", 1), "tree_sizes"),
        (Library.XGBOOST, lambda raw: raw[: len(raw) // 2], "not JSON"),
        (Library.XGBOOST, lambda raw: b"\x00" * 1000, "not JSON"),
    ],
)
def test_damaged_files_are_refused_before_any_library_sees_them(
    models: dict[Library, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, library: Library, edit: Any, needle: str
) -> None:
    monkeypatch.setattr(gbm_file, "run_child", _no_child)
    path = _copy(models, tmp_path, library, edit)
    with pytest.raises(ModelFileError) as caught:
        read_gbm_file(path, library, 120.0)
    assert str(caught.value).startswith(str(path)) and needle in str(caught.value) and "\n" not in str(caught.value)


def _no_child(*args: object) -> dict[str, Any]:
    raise AssertionError("the library was started on a file our checks should have refused")


def test_a_reading_that_differs_from_the_librarys_is_refused(models: dict[Library, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def shifted(text: str, where: str) -> Forest:
        f = Forest.from_xgboost_json(models[Library.XGBOOST].read_bytes(), where)  # another model's trees
        return f

    monkeypatch.setattr(gbm_file.Forest, "from_lightgbm", staticmethod(shifted))
    with pytest.raises(ModelFileError, match=r"our reading differs from lightgbm's: probe row \d+ scores"):
        read_gbm_file(models[Library.LIGHTGBM], Library.LIGHTGBM, 120.0)


def test_checksum_and_missing_library(models: dict[Library, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelFileError, match="checksum mismatch"):
        read_gbm_file(models[Library.XGBOOST], Library.XGBOOST, 120.0, "0" * 64)
    monkeypatch.setattr(gbm_file.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"pip install 'hugerec\[gbm\]'"):
        read_gbm_file(models[Library.XGBOOST], Library.XGBOOST, 120.0)


def test_probe_rows_stay_small_for_wide_models() -> None:
    tree = {"num_leaves": 2, "split_feature": "999999", "threshold": "0.5", "decision_type": "2",
            "left_child": "-1", "right_child": "-2", "leaf_value": "1 2"}  # fmt: skip
    body = "\n".join(f"{k}={v}" for k, v in tree.items())
    forest = Forest.from_lightgbm(f"tree\nmax_feature_idx=999999\n\nTree=0\n{body}\n\nend of trees\n")
    rows = probe_rows(forest)
    assert rows.shape == (4, 1_000_000) and rows.dtype == np.float32  # 4 x 1M cells: the PROBE_CELLS bound
    split = rows[:, 999999]
    near = np.isin(split, np.array([0.5, np.nextafter(0.5, 0), np.nextafter(0.5, 1)], np.float32))
    assert (near | np.isnan(split) | (split == 0)).any()  # the split's own threshold is probed
