"""Forest: the flattened trees of a LightGBM and an XGBoost model score what the library's own raw predict
scores (missing values and a categorical feature included), the kernel equals margin_reference (its NumPy
spec) and margin_columns equals margin; an empty batch and wrong shapes are handled, the arrays are read-only.
Needs lightgbm and xgboost (skipped without)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hugerec.serving.runtime.forest import Forest, margin_reference

lightgbm = pytest.importorskip("lightgbm")
xgboost = pytest.importorskip("xgboost")


def _data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack([rng.normal(size=n), rng.normal(size=n), rng.integers(0, 6, size=n)]).astype(np.float32)
    x[rng.random(n) < 0.1, 0] = np.nan  # missing values
    y = ((np.nan_to_num(x[:, 0]) + x[:, 1] + (x[:, 2] % 2)) > 0.5).astype(np.float32)
    return x, y


def _queries(seed: int = 1) -> np.ndarray:
    x, _ = _data(200, seed)
    x[:5, 1] = [np.nan, 0.0, -0.0, 1e-40, -1e-40]  # the edges the module docstring names
    x[5:8, 2] = [-0.5, 7.0, np.nan]  # a truncated category, an unseen one, a missing one
    return x


@pytest.fixture(scope="module")
def lightgbm_forest() -> tuple[Forest, np.ndarray]:
    x, y = _data()
    params = {"objective": "binary", "num_leaves": 7, "verbose": -1, "seed": 0, "min_data_in_leaf": 5}
    booster = lightgbm.train(params, lightgbm.Dataset(x, y, categorical_feature=[2]), num_boost_round=8)
    q = _queries()
    return Forest.from_lightgbm(booster.model_to_string()), booster.predict(q, raw_score=True)


@pytest.fixture(scope="module")
def xgboost_forest() -> tuple[Forest, np.ndarray]:
    x, y = _data()
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 3, "seed": 0}, xgboost.DMatrix(x, y), 8)
    q = _queries()
    model = json.loads(booster.save_raw("json").decode())
    return Forest.from_xgboost(model), booster.predict(xgboost.DMatrix(q), output_margin=True)


@pytest.mark.parametrize("which", ["lightgbm_forest", "xgboost_forest"])
def test_margin_equals_the_librarys_raw_score(request: pytest.FixtureRequest, which: str) -> None:
    forest, expected = request.getfixturevalue(which)
    q = _queries()
    got = forest.margin(q)
    assert got.dtype == np.float64 and forest.num_trees == 8
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got, margin_reference(forest, q))
    np.testing.assert_array_equal(forest.margin_columns(np.ascontiguousarray(q.T)), got)
    np.testing.assert_array_equal(forest.margin(q.astype(np.float64)), got)


def test_an_empty_batch_and_wrong_shapes(lightgbm_forest: tuple[Forest, np.ndarray]) -> None:
    forest, _ = lightgbm_forest
    assert forest.margin(np.zeros((0, 3), np.float32)).shape == (0,)
    with pytest.raises(ValueError, match=r"Forest.margin: x must be \[B, 3\], got \[4, 2\]"):
        forest.margin(np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"xt must be C-contiguous float32 \[3, B\], got float64 \[3, 4\]"):
        forest.margin_columns(np.zeros((3, 4), np.float64))
    with pytest.raises(ValueError, match=r"xt must be C-contiguous float32 \[3, B\], got float32 \[3, 4\]"):
        forest.margin_columns(np.zeros((4, 3), np.float32).T)


def test_the_arrays_are_read_only(xgboost_forest: tuple[Forest, np.ndarray]) -> None:
    forest, _ = xgboost_forest
    assert forest.split_features.max() < 3 and forest.thresholds.dtype == np.float32
    with pytest.raises(ValueError, match="read-only"):
        forest.nodes[0, 2] = 0


def test_garbage_text_is_refused_naming_where() -> None:
    with pytest.raises(ValueError, match=r"bundle/model\.txt"):
        Forest.from_lightgbm("not a model", where="bundle/model.txt")
    with pytest.raises(ValueError, match=r"bundle/model\.json"):
        Forest.from_xgboost_json(b"{", where="bundle/model.json")
