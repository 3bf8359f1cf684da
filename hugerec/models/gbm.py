"""Gradient-boosted trees (LightGBM, XGBoost) beside the deep models: configs, feature matrix, the model.

    [model]
    type = "lightgbm"        # or "xgboost"; needs the optional extra: pip install 'hugerec[gbm]'
    objective = "lambdarank" # learning to rank (XGBoost: "rank:ndcg" | "rank:pairwise"); default: binary
    group = "user_id"        # the column whose equal values make a query (ranking objectives only)
    eval_at = 10             # K of the ranking metrics NDCG@K, MAP@K, MRR@K (early stopping on NDCG@K)

    FeatureMatrix(x [N, Dd + F] float32, labels [N], names, num_dense, categorical)
        columns: the dense features as they are, then one column per sparse feature holding its id
        (the id's code as a float; exact up to 2^24). A missing value is NaN: both libraries send it
        down the branch they learned for missing values (LightGBM: missing_type NaN, XGBoost: the
        default direction of each split).
    TreeModel(library, booster).margin(x) -> raw scores [N] (logits for the binary objective)

The model files are the libraries' own formats (LightGBM's text model, XGBoost's JSON); nothing is
pickled. Training lives in hugerec.training.gbm_fit, the matrix reader in hugerec.data.matrix, serving in
hugerec.serving.bundles.gbm_bundle.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

EXTRA = "gbm"  # pip install 'hugerec[gbm]'
MAX_EXACT_ID = 1 << 24  # float32 holds every integer up to here exactly


class Library(enum.Enum):
    LIGHTGBM = "lightgbm"
    XGBOOST = "xgboost"

    @property
    def model_file(self) -> str:
        """The file name of a trained model in the library's own format."""
        match self:
            case Library.LIGHTGBM:
                return "model.txt"
            case Library.XGBOOST:
                return "model.json"


class Categorical(enum.Enum):
    NATIVE = "native"  # sparse ids as categorical features (LightGBM categorical splits, XGBoost enable_categorical)
    CODES = "codes"  # sparse ids as numbers (Categorify numbers values by frequency: a meaningful order)


def require(library: Library) -> ModuleType:
    """The library's module, or ImportError saying which extra to install."""
    try:
        return importlib.import_module(library.value)
    except ImportError:
        raise ImportError(
            f"model.type = {library.value!r} needs the {library.value} package: pip install 'hugerec[{EXTRA}]'"
        ) from None


def _positive(where: str, **values: Any) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ValueError(f"{where}: {name} must be > 0, got {v!r}")


BINARY_OBJECTIVES = {"lightgbm": "binary", "xgboost": "binary:logistic"}
RANKING_OBJECTIVES = {"lightgbm": ("lambdarank",), "xgboost": ("rank:ndcg", "rank:pairwise")}


def _objective(config: Any, where: str, library: str) -> None:
    """The objective is the library's binary one or one of its ranking ones; a ranking one needs `group`."""
    allowed = (BINARY_OBJECTIVES[library], *RANKING_OBJECTIVES[library])
    if config.objective not in allowed:
        raise ValueError(f"{where}: objective must be one of {list(allowed)} for {library}, got {config.objective!r}")
    ranking = config.objective in RANKING_OBJECTIVES[library]
    if ranking and not (isinstance(config.group, str) and config.group):
        raise ValueError(
            f"{where}: objective {config.objective!r} ranks the rows of a query: set model.group to the column "
            "that names each row's query (e.g. a user or request id)"
        )
    if not ranking and config.group is not None:
        raise ValueError(f"{where}: group {config.group!r} is only for a ranking objective {list(RANKING_OBJECTIVES[library])}")
    if isinstance(config.eval_at, bool) or not isinstance(config.eval_at, int) or config.eval_at < 1:
        raise ValueError(f"{where}: eval_at must be an integer >= 1, got {config.eval_at!r}")


def _common(config: Any, where: str) -> None:
    _positive(where, num_trees=config.num_trees, learning_rate=config.learning_rate)
    if not isinstance(config.num_trees, int):
        raise ValueError(f"{where}: num_trees must be an integer, got {config.num_trees!r}")
    if config.early_stopping_rounds is not None:
        _positive(where, early_stopping_rounds=config.early_stopping_rounds)
    if isinstance(config.threads, bool) or not isinstance(config.threads, int) or config.threads < 0:
        raise ValueError(f"{where}: threads must be >= 0 (0: the library's default), got {config.threads!r}")
    if isinstance(config.categorical, str):
        try:
            object.__setattr__(config, "categorical", Categorical(config.categorical))
        except ValueError:
            choices = [c.value for c in Categorical]
            raise ValueError(f"{where}: categorical must be one of {choices}, got {config.categorical!r}") from None
    for key, v in config.params.items():
        if not isinstance(v, str | int | float | bool):
            raise ValueError(f"{where}: params.{key} must be a string, number or boolean, got {v!r}")


@dataclass(frozen=True)
class LightGBMConfig:
    """LightGBM's gbdt with the binary objective, or "lambdarank" over the queries of the `group` column
    (labels: relevance grades 0, 1, 2, ...). `params`: further LightGBM parameters, passed as they are
    (they win over the fields here)."""

    num_trees: int = 500  # boosting rounds at most (early stopping usually ends sooner)
    learning_rate: float = 0.05  # shrinkage of each tree's contribution
    num_leaves: int = 63  # leaves per tree at most
    min_data_in_leaf: int = 20  # rows a leaf needs at least
    categorical: Categorical = Categorical.NATIVE  # how the sparse ids go in: "native" categorical splits or "codes" (numbers)
    early_stopping_rounds: int | None = 50  # stop after this many rounds without a better eval metric
    threads: int = 0  # the library's threads (0: its default)
    params: dict[str, Any] = field(default_factory=dict)
    objective: str = "binary"  # "binary" (clicks) or "lambdarank" (ranking the rows of each query by relevance)
    group: str | None = None  # the column whose equal values make one query (a ranking objective only)
    eval_at: int = 10  # the K of the ranking metrics (NDCG@K early stopping, evaluate's NDCG/MAP/MRR@K)

    def __post_init__(self) -> None:
        _common(self, "LightGBMConfig")
        _objective(self, "LightGBMConfig", "lightgbm")
        _positive("LightGBMConfig", num_leaves=self.num_leaves, min_data_in_leaf=self.min_data_in_leaf)


@dataclass(frozen=True)
class XGBoostConfig:
    """XGBoost's hist trees with the binary:logistic objective, or "rank:ndcg" / "rank:pairwise" over the
    queries of the `group` column; `params` as for LightGBMConfig."""

    num_trees: int = 500  # boosting rounds at most (early stopping usually ends sooner)
    learning_rate: float = 0.1  # shrinkage of each tree's contribution (XGBoost's eta)
    max_depth: int = 6  # depth of each tree at most
    min_child_weight: float = 1.0  # the hessian sum a child needs at least
    categorical: Categorical = Categorical.NATIVE  # how the sparse ids go in: "native" categorical splits or "codes" (numbers)
    early_stopping_rounds: int | None = 50  # stop after this many rounds without a better eval metric
    threads: int = 0  # the library's threads (0: its default)
    params: dict[str, Any] = field(default_factory=dict)  # further XGBoost parameters, passed as they are (they win over the fields here)
    objective: str = "binary:logistic"  # "binary:logistic" (clicks), "rank:ndcg" or "rank:pairwise" (ranking the rows of each query)
    group: str | None = None  # the column whose equal values make one query (a ranking objective only)
    eval_at: int = 10  # the K of the ranking metrics (NDCG@K early stopping, evaluate's NDCG/MAP/MRR@K)

    def __post_init__(self) -> None:
        _common(self, "XGBoostConfig")
        _objective(self, "XGBoostConfig", "xgboost")
        _positive("XGBoostConfig", max_depth=self.max_depth, min_child_weight=self.min_child_weight)


GBMConfig = LightGBMConfig | XGBoostConfig


def is_ranking(config: GBMConfig) -> bool:
    """Whether `config` trains a ranking objective (over the queries of its group column)."""
    return config.objective in RANKING_OBJECTIVES[library_of(config).value]


def library_of(config: GBMConfig) -> Library:
    match config:
        case LightGBMConfig():
            return Library.LIGHTGBM
        case XGBoostConfig():
            return Library.XGBOOST


@dataclass(frozen=True, eq=False)
class FeatureMatrix:
    """Rows for the trees: x [N, num_dense + F] float32 (dense columns first, then one id per sparse feature),
    labels [N] float32 (empty [0] when unknown), the column names, and which columns are categorical.
    For ranking, `groups` [Q] int64 holds the sizes of the queries, whose rows are contiguous and in order
    (empty: no queries)."""

    x: np.ndarray
    labels: np.ndarray
    names: tuple[str, ...]
    num_dense: int
    groups: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        if self.x.ndim != 2 or self.x.dtype != np.float32 or self.x.shape[1] != len(self.names):
            raise ValueError(
                f"FeatureMatrix: x must be float32 [N, {len(self.names)}] (one column per name), got "
                f"{self.x.dtype} {list(self.x.shape)}"
            )
        if self.labels.size and self.labels.shape != (self.x.shape[0],):
            raise ValueError(f"FeatureMatrix: labels must be [{self.x.shape[0]}], got {list(self.labels.shape)}")
        if self.groups.size and (int(self.groups.sum()) != self.x.shape[0] or int(self.groups.min()) < 1):
            raise ValueError(f"FeatureMatrix: group sizes must be >= 1 and sum to {self.x.shape[0]} rows")

    @property
    def categorical(self) -> tuple[int, ...]:
        """Column indices of the sparse features."""
        return tuple(range(self.num_dense, len(self.names)))


class TreeModel:
    """A trained booster of `library`: raw scores, and its file in the library's own format."""

    def __init__(self, library: Library, booster: Any) -> None:
        self.library = library
        self.booster = booster

    @property
    def num_trees(self) -> int:
        match self.library:
            case Library.LIGHTGBM:
                return int(self.booster.num_trees())
            case Library.XGBOOST:
                return int(self.booster.num_boosted_rounds())

    @property
    def feature_names(self) -> tuple[str, ...]:
        match self.library:
            case Library.LIGHTGBM:
                return tuple(self.booster.feature_name())
            case Library.XGBOOST:
                return tuple(self.booster.feature_names or ())

    def margin(self, x: np.ndarray, threads: int = 1) -> np.ndarray:
        """Raw scores [N] float64 of the rows x [N, F] (NaN: missing); the logit for the binary objective."""
        match self.library:
            case Library.LIGHTGBM:
                return np.asarray(self.booster.predict(x, raw_score=True, num_threads=threads), np.float64)
            case Library.XGBOOST:
                return np.asarray(self.booster.inplace_predict(x, predict_type="margin"), np.float64).reshape(-1)

    def save(self, path: str | Path) -> Path:
        """Write the model in the library's own format (LightGBM text, XGBoost JSON)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(out))
        return out

    @staticmethod
    def load(path: str | Path, library: Library, threads: int = 1) -> TreeModel:
        """Read a model file written by `save` (or by the library itself); ValueError naming the file if it is not one."""
        module = require(library)
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no {library.value} model at {p}")
        try:
            match library:
                case Library.LIGHTGBM:
                    booster = module.Booster(model_file=str(p))  # threads: given to each predict
                case Library.XGBOOST:
                    booster = module.Booster(params={"nthread": threads}, model_file=str(p))
        except Exception as e:  # both libraries raise their own error types for a damaged file
            raise ValueError(f"{p}: not a {library.value} model: {type(e).__name__}: {e}") from None
        return TreeModel(library, booster)
