"""The model registry: every model type hugerec trains, with its frozen config, its family, the data roles
it needs and how it is built. The command line reads [model] into these configs and nothing else.

    model_type("two_tower")     -> ModelType("two_tower", Family.RETRIEVAL, TwoTowerConfig, roles, build)
    config_from_dict({"type": "dcn_v2", "deep": [256, 128]})   -> DCNv2Config(deep=(256, 128), ...)
    config_to_dict(config)                                      -> {"type": "dcn_v2", "deep": [256, 128], ...}
    build_model(config, tables, num_dense, optimizer)                       # ranking: tables from the schema
    build_model(config, optimizer=opt, num_users=U, num_items=I)            # retrieval
    build_model(config, optimizer=opt, num_items=I)                         # sequential
    (trees are built by their library: hugerec.training.gbm.fit_trees)

Families:
    ranking     dlrm, dcn_v2, deepfm, wide_and_deep: labelled rows -> a logit per row (BCE)
    retrieval   two_tower, mf: (user, item, time) events -> user and item vectors (sampled softmax / BPR)
    sequential  sasrec, mlm, gru4rec, hstu: item sequences grouped by user or session -> the next item
    trees       lightgbm, xgboost: labelled rows -> gradient-boosted trees (the library's own training)

Roles are those of `hugerec.data.input_spec.Role` (as their string values: models sit below data): each
entry of `ModelType.roles` is a set of alternatives, one of which the declared input must have.

Adding a model type: its config (a frozen dataclass validated in __post_init__, every field with a
default), a builder `(config, DataSizes, optimizer) -> nn.Module`, and one `ModelType` in `REGISTRY`
(and its config class in the `ModelConfig` union).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from hugerec.embedding.optimizers import Optimizer, RowWiseAdagrad, optimizer_from_dict, optimizer_to_dict
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dcn import DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.gbm import LightGBMConfig, TreeModel, XGBoostConfig
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.masked import MaskedTransformer
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.model_config import (
    DCNv2Config,
    DeepFMConfig,
    DLRMConfig,
    RankingConfig,
    WideAndDeepConfig,
    build_ranking,
)
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import GRU4RecConfig, MLMConfig, SASRecConfig
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.models.wide_deep import WideAndDeep


class Family(enum.Enum):
    RANKING = "ranking"
    RETRIEVAL = "retrieval"
    SEQUENTIAL = "sequential"
    TREES = "trees"


@dataclass(frozen=True)
class DataSizes:
    """What the data tells a builder: the embedding tables and dense width (ranking, from the schema), the
    user and item counts (retrieval: dense ids 0..U-1 / 0..I-1; sequential: items 1..I)."""

    tables: tuple[TableConfig, ...] = ()
    num_dense: int = 0
    num_users: int = 0
    num_items: int = 0


Builder = Callable[[Any, DataSizes, Optimizer], nn.Module]


@dataclass(frozen=True)
class ModelType:
    """name: model.type; config: its frozen config class; roles: the input's roles it needs (each a tuple of
    alternatives); build: config, data sizes and the tables' sparse optimizer -> the model (None: trees);
    model: the class build returns (trees: the booster's wrapper, TreeModel)."""

    name: str
    family: Family
    config: type
    roles: tuple[tuple[str, ...], ...]
    build: Builder | None
    model: type

    def fields(self) -> tuple[str, ...]:
        """The [model] keys of this type (besides `type`)."""
        return tuple(f.name for f in dataclasses.fields(self.config))

    def missing_roles(self, declared: Sequence[str]) -> list[str]:
        """The roles this type needs that `declared` (the input's role values) lacks, each as "user" or
        "session | user" for a choice."""
        have = set(declared)
        return [" | ".join(alternatives) for alternatives in self.roles if not have & set(alternatives)]


def _ranking(config: RankingConfig, data: DataSizes, optimizer: Optimizer) -> nn.Module:
    return build_ranking(config, data.tables, data.num_dense, optimizer)


def _two_tower(config: TwoTowerConfig, data: DataSizes, optimizer: Optimizer) -> nn.Module:
    return TwoTower(config, data.num_users, data.num_items, optimizer)


def _mf(config: MFConfig, data: DataSizes, optimizer: Optimizer) -> nn.Module:
    return MatrixFactorization(data.num_users, data.num_items, config.dim, optimizer, config.temperature, config.init_std)


def _hstu(config: HSTUConfig, data: DataSizes, optimizer: Optimizer) -> nn.Module:
    return HSTU(config.sequence_config(data.num_items), optimizer, config.options())


def _sequential(cls: type[nn.Module]) -> Builder:
    def build(config: Any, data: DataSizes, optimizer: Optimizer) -> nn.Module:
        return cls(config.sequence_config(data.num_items), optimizer)

    return build


LABELLED = (("label",),)
EVENTS = (("user",), ("item",), ("timestamp",))
SEQUENCES = (("session", "user"), ("item",), ("timestamp",))

REGISTRY: dict[str, ModelType] = {
    t.name: t
    for t in (
        ModelType("dlrm", Family.RANKING, DLRMConfig, LABELLED, _ranking, DLRM),
        ModelType("dcn_v2", Family.RANKING, DCNv2Config, LABELLED, _ranking, DCNv2),
        ModelType("deepfm", Family.RANKING, DeepFMConfig, LABELLED, _ranking, DeepFM),
        ModelType("wide_and_deep", Family.RANKING, WideAndDeepConfig, LABELLED, _ranking, WideAndDeep),
        ModelType("two_tower", Family.RETRIEVAL, TwoTowerConfig, EVENTS, _two_tower, TwoTower),
        ModelType("mf", Family.RETRIEVAL, MFConfig, EVENTS, _mf, MatrixFactorization),
        ModelType("sasrec", Family.SEQUENTIAL, SASRecConfig, SEQUENCES, _sequential(SASRec), SASRec),
        ModelType("mlm", Family.SEQUENTIAL, MLMConfig, SEQUENCES, _sequential(MaskedTransformer), MaskedTransformer),
        ModelType("gru4rec", Family.SEQUENTIAL, GRU4RecConfig, SEQUENCES, _sequential(GRU4Rec), GRU4Rec),
        ModelType("hstu", Family.SEQUENTIAL, HSTUConfig, SEQUENCES, _hstu, HSTU),
        ModelType("lightgbm", Family.TREES, LightGBMConfig, LABELLED, None, TreeModel),
        ModelType("xgboost", Family.TREES, XGBoostConfig, LABELLED, None, TreeModel),
    )
}

ModelConfig = (
    DLRMConfig
    | DCNv2Config
    | DeepFMConfig
    | WideAndDeepConfig
    | TwoTowerConfig
    | MFConfig
    | SASRecConfig
    | MLMConfig
    | GRU4RecConfig
    | HSTUConfig
    | LightGBMConfig
    | XGBoostConfig
)


def model_type(name: object) -> ModelType:
    """The registered type called `name`; ValueError naming it and the choices otherwise."""
    found = REGISTRY.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"model.type: unknown type {name!r}; expected one of {list(REGISTRY)}")
    return found


def type_of(config: object) -> ModelType:
    """The registered type whose config class `config` is (exactly: subclasses are other types)."""
    for t in REGISTRY.values():
        if type(config) is t.config:
            return t
    raise ValueError(f"not a model config of the registry: {type(config).__name__}")


def config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """{"type": name, field: value, ...} (JSON / TOML values: lists, strings, optimizer dicts) -> the config.

    ValueError, naming the key, for an unknown type or key; the config's own checks name bad values."""
    d = dict(d)
    t = model_type(d.pop("type", None))
    known = t.fields()
    unknown = sorted(set(d) - set(known))
    if unknown:
        raise ValueError(f"model {t.name!r}: unknown keys {unknown}; valid keys are {list(known)}")
    if isinstance(d.get("wide_optimizer"), dict):
        d["wide_optimizer"] = optimizer_from_dict(d["wide_optimizer"])
    config: ModelConfig = t.config(**d)
    return config


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """JSON/TOML-ready: {"type": name, ...every field}, enums as their values, tuples as lists, optimizers as dicts."""
    out: dict[str, Any] = {"type": type_of(config).name}
    for f in dataclasses.fields(config):
        out[f.name] = _plain(getattr(config, f.name))
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, Optimizer):  # a union of dataclasses: its own dict, with its type
        return optimizer_to_dict(v)
    match v:
        case enum.Enum():
            return v.value
        case tuple() | list():
            return [_plain(x) for x in v]
        case dict():
            return {k: _plain(x) for k, x in v.items()}
        case _ if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        case _:
            return v


def build_model(
    config: ModelConfig,
    tables: Sequence[TableConfig] = (),
    num_dense: int = 0,
    optimizer: Optimizer = RowWiseAdagrad(lr=0.05),  # noqa: B008  # frozen dataclass: immutable default
    *,
    num_users: int = 0,
    num_items: int = 0,
) -> nn.Module:
    """The model `config` describes, with fresh embedding tables trained by `optimizer` (a table's own
    optimizer wins). Ranking: `tables` and `num_dense` from the data's schema; retrieval: `num_users` and
    `num_items`; sequential: `num_items`. Trees are not built here (their library trains them)."""
    t = type_of(config)
    if t.build is None:
        raise ValueError(f"build_model: model.type = {t.name!r} ({t.family.value}) is built by its library: use fit_trees")
    return t.build(config, DataSizes(tuple(tables), num_dense, num_users, num_items), optimizer)


def check_built_from(model: object, config: ModelConfig) -> None:
    """ValueError unless `model` is of the class `config`'s type builds (what a model file must hold)."""
    t = type_of(config)
    if type(model) is not t.model:
        raise ValueError(f"a {t.name!r} config builds a {t.model.__name__}, got a {type(model).__name__}")

