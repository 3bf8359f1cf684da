"""The GBM bundle: write_gbm_bundle copies the model file beside its schema with checksums; load_gbm_bundle
checks them, has the trees read and checked, and serves logits equal to the library's raw scores (the forest
kernel and the library predictor alike); a model whose features are not the schema's, an existing folder, a
changed file and a foreign manifest are refused naming them. Needs lightgbm (skipped without)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hugerec.data.schema import Schema
from hugerec.models.gbm import Library, TreeModel
from hugerec.serving.bundles.bundle_files import MANIFEST
from hugerec.serving.bundles.gbm_bundle import is_gbm_bundle, load_gbm_bundle, write_gbm_bundle
from hugerec.serving.runtime.gbm_model import GBMPredictor
from hugerec.serving.runtime.model_inputs import ModelInputs

lightgbm = pytest.importorskip("lightgbm")

SCHEMA = Schema.build(labels=("label",), dense=("d0",), sparse={"c0": 8})


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=400), rng.integers(0, 8, 400)]).astype(np.float32)
    y = ((x[:, 0] + (x[:, 1] > 4)) > 0.5).astype(np.float32)
    data = lightgbm.Dataset(x, y, feature_name=["d0", "c0"], categorical_feature=[1])
    booster = lightgbm.train({"objective": "binary", "verbose": -1, "num_leaves": 5, "min_data_in_leaf": 5}, data, 6)
    path = TreeModel(Library.LIGHTGBM, booster).save(tmp_path_factory.mktemp("gbm") / "model.txt")
    return path, x[:20]


def _inputs(x: np.ndarray) -> ModelInputs:
    ids = x[:, 1].astype(np.int64)
    return ModelInputs(x[:, :1].copy(), {"c0": (ids, np.ones(len(ids), np.int32))})


@pytest.mark.parametrize("predictor", list(GBMPredictor), ids=lambda p: p.value)
def test_written_then_loaded_serves_the_librarys_scores(
    model_file: tuple[Path, np.ndarray], tmp_path: Path, predictor: GBMPredictor
) -> None:
    path, x = model_file
    out = write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "bundle", SCHEMA, name="trees", version="2")
    assert is_gbm_bundle(out) and sorted(p.name for p in out.iterdir()) == sorted(
        [MANIFEST, "model.txt", "schema.json"]
    )
    loaded = load_gbm_bundle(out, predictor=predictor)
    assert (loaded.name, loaded.version) == ("trees", "2") and loaded.manifest["info"]["num_trees"] == 6
    want = TreeModel.load(path, Library.LIGHTGBM).margin(x)
    np.testing.assert_allclose(loaded.model.predict(_inputs(x)), want, rtol=1e-5, atol=1e-5)


def test_a_model_of_other_features_and_an_existing_folder_are_refused(
    model_file: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, _ = model_file
    other = Schema.build(labels=("label",), dense=("d0", "d1"), sparse={"c0": 8})
    with pytest.raises(
        ValueError, match=r"the model's features \['d0', 'c0'\] are not the schema's \['d0', 'd1', 'c0'\]"
    ):
        write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "b", other)
    write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "b", SCHEMA)
    with pytest.raises(FileExistsError, match="exists \\(pass overwrite=True to replace it\\)"):
        write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "b", SCHEMA)
    write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "b", SCHEMA, version="3", overwrite=True)
    assert json.loads((tmp_path / "b" / MANIFEST).read_text())["version"] == "3"


def test_damage_is_refused_naming_the_file(model_file: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    path, _ = model_file
    out = write_gbm_bundle(path, Library.LIGHTGBM, tmp_path / "b", SCHEMA)
    (out / "schema.json").write_text((out / "schema.json").read_text() + " ")
    with pytest.raises(ValueError, match=f"GBM bundle {out}: checksum mismatch for schema.json"):
        load_gbm_bundle(out)
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps({**manifest, "files": {"schema.json": "0"}}))
    with pytest.raises(ValueError, match=f"{out / MANIFEST}: lists no model.txt"):
        load_gbm_bundle(out)
    (out / MANIFEST).write_text(json.dumps({**manifest, "kind": "pipeline"}))
    with pytest.raises(ValueError, match="not a GBM bundle manifest \\(ValueError: kind 'pipeline' format 1\\)"):
        load_gbm_bundle(out)
    (out / MANIFEST).write_text(json.dumps({**manifest, "files": {"../model.txt": "0"}}))
    with pytest.raises(
        ValueError, match=r"not a GBM bundle manifest .*'\.\./model\.txt' is not a relative path inside the bundle"
    ):
        load_gbm_bundle(out)
    with pytest.raises(ValueError, match=f"{tmp_path / MANIFEST}: not a GBM bundle manifest \\(FileNotFoundError"):
        load_gbm_bundle(tmp_path)
