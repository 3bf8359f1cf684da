"""The model registry: every type with its config, family, roles and builder; dicts round trip; bad keys and
values are ValueErrors naming them."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from hugerec.data.input_spec import Role
from hugerec.embedding.optimizers import Adam
from hugerec.embedding.table_config import TableConfig
from hugerec.models.gbm import LightGBMConfig
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUConfig, HSTUOptions
from hugerec.models.masked import MaskedTransformer
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.objectives import Negatives
from hugerec.models.registry import (
    REGISTRY,
    Family,
    build_model,
    config_from_dict,
    config_to_dict,
    model_type,
    type_of,
)
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import GRU4RecConfig, MLMConfig, SASRecConfig
from hugerec.models.two_tower import TwoTower, TwoTowerConfig

FAMILIES = {
    "dlrm": Family.RANKING,
    "dcn_v2": Family.RANKING,
    "deepfm": Family.RANKING,
    "wide_and_deep": Family.RANKING,
    "two_tower": Family.RETRIEVAL,
    "mf": Family.RETRIEVAL,
    "sasrec": Family.SEQUENTIAL,
    "mlm": Family.SEQUENTIAL,
    "gru4rec": Family.SEQUENTIAL,
    "hstu": Family.SEQUENTIAL,
    "lightgbm": Family.TREES,
    "xgboost": Family.TREES,
}


def test_every_model_type_is_registered_once_with_its_family() -> None:
    assert {name: t.family for name, t in REGISTRY.items()} == FAMILIES
    classes = [t.config for t in REGISTRY.values()]
    assert len(set(classes)) == len(classes)  # one config class per type: the config says its type
    for name, t in REGISTRY.items():
        assert t.name == name and type_of(t.config()) is t
        assert (t.build is None) == (t.family is Family.TREES)
        assert all(Role(r) for alternatives in t.roles for r in alternatives)  # the input spec's roles
        assert dataclasses.is_dataclass(t.config) and t.config.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_default_config_round_trips_through_plain_dicts(name: str) -> None:
    config = model_type(name).config()
    d = config_to_dict(config)
    assert d["type"] == name and set(d) == {"type", *model_type(name).fields()}
    assert config_from_dict(d) == config


def test_non_default_values_round_trip() -> None:
    for config in (
        TwoTowerConfig(dim=8, similarity="cosine", negatives="in_batch", mask_history=True, recent=(2,)),  # type: ignore[arg-type]
        MFConfig(dim=4, loss="bpr", alpha=0.5),
        MLMConfig(max_len=10, mask_prob=0.4, loss="sampled_softmax", negatives=Negatives.UNIFORM),
        HSTUConfig(max_len=20, num_heads=2, attention_dim=16, time_buckets=32, temperature=0.05),
        LightGBMConfig(objective="lambdarank", group="user", params={"max_bin": 63}),
    ):
        assert config_from_dict(config_to_dict(config)) == config


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"type": "two_towr"}, r"model\.type: unknown type 'two_towr'; expected one of \['dlrm'"),
        ({"type": "two_tower", "dimm": 3}, r"unknown keys \['dimm'\]"),
        ({"type": "two_tower", "loss": "hinge"}, r"loss must be one of \['sampled_softmax', 'bpr'\], got 'hinge'"),
        ({"type": "two_tower", "negatives": "some"}, r"negatives must be one of .*got 'some'"),
        ({"type": "two_tower", "num_negatives": 0}, "num_negatives must be an integer >= 1, got 0"),
        ({"type": "two_tower", "alpha": 2.0}, r"alpha must be in \[0, 1\], got 2.0"),
        ({"type": "two_tower", "loss": "bpr", "mask_history": True}, "mask_history = true applies to loss = 'sampled_softmax'"),
        ({"type": "two_tower", "dim": 0}, "dim must be >= 1, got 0"),
        ({"type": "mf", "dim": 0}, "dim must be an integer >= 1, got 0"),
        ({"type": "mf", "temperature": -1.0}, "temperature must be > 0, got -1.0"),
        ({"type": "sasrec", "loss": "bpr"}, r"loss must be one of \['sampled_softmax', 'full_softmax', 'bce'\], got 'bpr'"),
        ({"type": "sasrec", "dim": 10, "num_heads": 3}, "dim 10 is not divisible by num_heads 3"),
        ({"type": "sasrec", "max_len": 0}, "max_len must be an int >= 1, got 0"),
        ({"type": "sasrec", "mask_prob": 0.2}, r"unknown keys \['mask_prob'\]"),
        ({"type": "mlm", "mask_prob": 1.5}, r"mask_prob must be in \(0, 1\), got 1.5"),
        ({"type": "hstu", "temperature": -0.1}, "temperature must be a finite number >= 0, got -0.1"),
        ({"type": "hstu", "temperature": "0.05"}, "temperature must be a finite number >= 0, got '0.05'"),
        ({"type": "hstu", "time_buckets": 0}, "time_buckets must be an int >= 1, got 0"),
        ({"type": "hstu", "attention_dim": True}, "attention_dim must be an int >= 0, got True"),
        ({"type": "hstu", "dim": 10, "num_heads": 4}, "dim 10 is not divisible by num_heads 4"),
        ({"type": "hstu", "mask_prob": 0.2}, r"unknown keys \['mask_prob'\]"),
        ({"type": "lightgbm", "num_trees": 0}, "num_trees must be > 0, got 0"),
    ],
)
def test_bad_keys_and_values_name_them(d: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config_from_dict(d)


def test_build_model_builds_every_deep_family_from_its_data_sizes() -> None:
    opt = Adam(lr=0.01)
    tower = build_model(TwoTowerConfig(dim=8, embedding_dim=8), optimizer=opt, num_users=5, num_items=7)
    assert isinstance(tower, TwoTower) and (tower.num_users, tower.num_items) == (5, 7)
    mf = build_model(MFConfig(dim=4, init_std=0.2), optimizer=opt, num_users=5, num_items=7)
    assert isinstance(mf, MatrixFactorization) and mf.dim == 4
    for config, cls in ((SASRecConfig(dim=8), SASRec), (MLMConfig(dim=8), MaskedTransformer), (GRU4RecConfig(dim=8), GRU4Rec), (HSTUConfig(dim=8), HSTU)):
        model = build_model(config, optimizer=opt, num_items=9)
        assert isinstance(model, cls) and model.cfg.num_items == 9 and model.cfg.max_len == config.max_len
    hstu = build_model(HSTUConfig(dim=8, num_heads=2, attention_dim=3, time_buckets=7, temperature=0.1), optimizer=opt, num_items=9)
    assert isinstance(hstu, HSTU) and hstu.options == HSTUOptions(attention_dim=3, time_buckets=7, temperature=0.1)
    assert HSTUConfig().options() == HSTUOptions()  # one set of defaults: HSTU(cfg) is what build_model(HSTUConfig()) builds
    ranking = build_model(config_from_dict({"type": "dlrm", "bottom": [4], "top": [4, 1]}), [TableConfig("a", 5, 4)], 2, opt)
    assert isinstance(ranking, nn.Module)
    with pytest.raises(ValueError, match="'lightgbm' \\(trees\\) is built by its library"):
        build_model(LightGBMConfig())
    with pytest.raises(ValueError, match="num_users and num_items must be >= 1"):
        build_model(TwoTowerConfig(), optimizer=opt)


def test_missing_roles_names_what_the_data_lacks() -> None:
    assert model_type("two_tower").missing_roles(["user", "item", "timestamp", "none"]) == []
    assert model_type("two_tower").missing_roles(["item", "timestamp"]) == ["user"]
    assert model_type("sasrec").missing_roles(["user", "item", "timestamp"]) == []  # a user's history is a sequence
    assert model_type("sasrec").missing_roles(["item"]) == ["session | user", "timestamp"]
    assert model_type("dlrm").missing_roles(["dense", "categorical"]) == ["label"]
    assert model_type("lightgbm").missing_roles(["label", "dense"]) == []
