"""The tree models' data: configs validated naming the value (objectives and groups per library), the
FeatureMatrix's shapes and queries, and TreeModel's file round trip in the library's own format scoring the
same margins; a file of another kind refused naming it. Needs lightgbm and xgboost for the boosters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hugerec.models.gbm import (
    Categorical,
    FeatureMatrix,
    Library,
    LightGBMConfig,
    TreeModel,
    XGBoostConfig,
    is_ranking,
    library_of,
)


def test_configs_and_their_library() -> None:
    light = LightGBMConfig(categorical="codes")  # type: ignore[arg-type]  # as a TOML file gives it
    assert light.categorical is Categorical.CODES and library_of(light) is Library.LIGHTGBM and not is_ranking(light)
    ranked = XGBoostConfig(objective="rank:pairwise", group="user")
    assert library_of(ranked) is Library.XGBOOST and is_ranking(ranked)
    assert [lib.model_file for lib in Library] == ["model.txt", "model.json"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LightGBMConfig(num_trees=0), "LightGBMConfig: num_trees must be > 0, got 0"),
        (lambda: LightGBMConfig(num_trees=2.5), "LightGBMConfig: num_trees must be an integer, got 2.5"),
        (lambda: XGBoostConfig(learning_rate=True), "XGBoostConfig: learning_rate must be > 0, got True"),
        (lambda: LightGBMConfig(early_stopping_rounds=0), "early_stopping_rounds must be > 0, got 0"),
        (lambda: LightGBMConfig(threads=-1), r"threads must be >= 0 \(0: the library's default\), got -1"),
        (
            lambda: LightGBMConfig(categorical="onehot"),
            r"categorical must be one of \['native', 'codes'\], got 'onehot'",
        ),
        (lambda: LightGBMConfig(params={"x": [1]}), r"params.x must be a string, number or boolean, got \[1\]"),
        (
            lambda: LightGBMConfig(objective="rank:ndcg"),
            r"objective must be one of \['binary', 'lambdarank'\] for lightgbm, got 'rank:ndcg'",
        ),
        (
            lambda: XGBoostConfig(objective="rank:ndcg"),
            "objective 'rank:ndcg' ranks the rows of a query: set model.group",
        ),
        (
            lambda: XGBoostConfig(group="user"),
            r"group 'user' is only for a ranking objective \['rank:ndcg', 'rank:pairwise'\]",
        ),
        (lambda: LightGBMConfig(eval_at=0), "eval_at must be an integer >= 1, got 0"),
        (lambda: LightGBMConfig(num_leaves=0), "LightGBMConfig: num_leaves must be > 0, got 0"),
        (lambda: XGBoostConfig(max_depth=-2), "XGBoostConfig: max_depth must be > 0, got -2"),
    ],
)
def test_bad_configs_are_refused(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_feature_matrix_shapes_and_queries() -> None:
    x = np.zeros((4, 3), np.float32)
    m = FeatureMatrix(x, np.zeros(4, np.float32), ("d0", "c0", "c1"), 1, np.array([1, 3]))
    assert m.categorical == (1, 2)
    assert FeatureMatrix(x, np.zeros(0, np.float32), ("a", "b", "c"), 3).categorical == ()
    with pytest.raises(ValueError, match=r"x must be float32 \[N, 2\] \(one column per name\), got float32 \[4, 3\]"):
        FeatureMatrix(x, np.zeros(4, np.float32), ("a", "b"), 1)
    with pytest.raises(ValueError, match=r"x must be float32 \[N, 3\] .*got float64 \[4, 3\]"):
        FeatureMatrix(x.astype(np.float64), np.zeros(4, np.float32), ("a", "b", "c"), 1)
    with pytest.raises(ValueError, match=r"labels must be \[4\], got \[3\]"):
        FeatureMatrix(x, np.zeros(3, np.float32), ("a", "b", "c"), 1)
    with pytest.raises(ValueError, match="group sizes must be >= 1 and sum to 4 rows"):
        FeatureMatrix(x, np.zeros(4, np.float32), ("a", "b", "c"), 1, np.array([4, 0]))


def _booster(library: Library) -> tuple[Any, np.ndarray]:
    module = pytest.importorskip(library.value)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.float32)
    if library is Library.LIGHTGBM:
        data = module.Dataset(x, y, feature_name=["a", "b"])
        return module.train({"objective": "binary", "verbose": -1, "num_leaves": 4}, data, 5), x
    return module.train(
        {"objective": "binary:logistic", "max_depth": 2}, module.DMatrix(x, y, feature_names=["a", "b"]), 5
    ), x


@pytest.mark.parametrize("library", list(Library), ids=lambda lib: lib.value)
def test_a_saved_model_loads_and_scores_the_same(library: Library, tmp_path: Path) -> None:
    booster, x = _booster(library)
    model = TreeModel(library, booster)
    path = model.save(tmp_path / "sub" / library.model_file)
    again = TreeModel.load(path, library)
    assert again.num_trees == model.num_trees == 5 and again.feature_names == ("a", "b")
    margins = again.margin(x)
    assert margins.dtype == np.float64 and margins.shape == (300,)
    np.testing.assert_allclose(margins, model.margin(x), rtol=1e-6)
    assert ((margins > 0) == (x[:, 0] > 0)).mean() > 0.9


@pytest.mark.parametrize("library", list(Library), ids=lambda lib: lib.value)
def test_files_that_are_no_model_are_refused_naming_them(library: Library, tmp_path: Path) -> None:
    pytest.importorskip(library.value)
    with pytest.raises(FileNotFoundError, match=f"no {library.value} model at {tmp_path / 'absent'}"):
        TreeModel.load(tmp_path / "absent", library)
    junk = tmp_path / library.model_file
    junk.write_text("tree\nnot really\n" if library is Library.LIGHTGBM else '{"learner": 3}')
    with pytest.raises(ValueError, match=f"{junk}: not a {library.value} model"):
        TreeModel.load(junk, library)
