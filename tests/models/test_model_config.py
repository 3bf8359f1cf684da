import pytest

from hugerec.embedding.optimizers import SGD, Adagrad, Ftrl
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dcn import CrossStructure, DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.mlp import Activation
from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.models.registry import build_model, config_from_dict, config_to_dict
from hugerec.models.wide_deep import WideAndDeep

TABLES = [TableConfig("a", 30, 4), TableConfig("b", 20, 4)]


@pytest.mark.parametrize(
    "config",
    [
        DLRMConfig(bottom=(8, 4), top=(8, 1), self_interaction=True, activation=Activation.GELU),
        DCNv2Config(num_cross_layers=2, low_rank=2, num_experts=2, structure=CrossStructure.PARALLEL, deep=()),
        DeepFMConfig(deep=(8,), first_order=False, dropout=0.1),
        WideAndDeepConfig(deep=(8, 4), wide_optimizer=SGD(lr=0.5)),
    ],
)
def test_dict_round_trip(config) -> None:
    d = config_to_dict(config)
    assert config_from_dict(d) == config
    assert all(isinstance(v, str | int | float | bool | list | dict | None) for v in d.values())


def test_from_dict_converts_toml_values() -> None:
    c = config_from_dict({"type": "dcn_v2", "deep": [16, 8], "structure": "parallel", "activation": "silu"})
    assert c == DCNv2Config(deep=(16, 8), structure=CrossStructure.PARALLEL, activation=Activation.SILU)
    w = config_from_dict({"type": "wide_and_deep", "wide_optimizer": {"type": "ftrl", "lr": 0.2}})
    assert isinstance(w, WideAndDeepConfig) and w.wide_optimizer == Ftrl(lr=0.2)


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"type": "dlrn"}, r"unknown type 'dlrn'; expected one of \['dlrm', 'dcn_v2', 'deepfm', 'wide_and_deep', 'two_tower'"),
        ({}, "unknown type None"),
        ({"type": "dlrm", "botom": [4]}, r"unknown keys \['botom'\]; valid keys are \['bottom'"),
        ({"type": "dlrm", "top": [8, 2]}, "top must end at 1"),
        ({"type": "dlrm", "bottom": [8, "x"]}, "DLRMConfig bottom"),
        ({"type": "dlrm", "activation": "swish"}, "unknown activation 'swish'"),
        ({"type": "dlrm", "dropout": 1.5}, "dropout"),
        ({"type": "dcn_v2", "structure": "serial"}, "unknown structure 'serial'"),
        ({"type": "dcn_v2", "num_cross_layers": 0}, "num_cross_layers"),
        ({"type": "dcn_v2", "low_rank": -2}, "low_rank"),
        ({"type": "dcn_v2", "num_experts": 3}, "needs low_rank"),
        ({"type": "deepfm", "deep": []}, "at least one"),
        ({"type": "wide_and_deep", "wide_optimizer": "ftrl"}, "wide_optimizer must be a sparse optimizer"),
        ({"type": "wide_and_deep", "wide_optimizer": {"type": "ftrl", "lr": -1}}, "lr must be"),
    ],
)
def test_bad_config_dicts(d: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config_from_dict(d)


def test_build_model_for_every_kind() -> None:
    opt = Adagrad(lr=0.1)
    dlrm = build_model(DLRMConfig(bottom=(8, 4), top=(8, 1)), TABLES, num_dense=3, optimizer=opt)
    assert isinstance(dlrm, DLRM) and dlrm.sparse_arch.optimizer == opt
    dcn = build_model(DCNv2Config(deep=(8,)), TABLES, num_dense=3, optimizer=opt)
    assert isinstance(dcn, DCNv2)
    fm = build_model(DeepFMConfig(deep=(8,)), TABLES, num_dense=3, optimizer=opt)
    assert isinstance(fm, DeepFM) and fm.wide_embedding is not None
    assert [t.name for t in fm.wide_embedding.tables] == ["wide_a", "wide_b"]
    assert build_model(DeepFMConfig(deep=(8,), first_order=False), TABLES, 3, opt).wide_embedding is None
    wd = build_model(WideAndDeepConfig(deep=(8,)), TABLES, num_dense=3, optimizer=opt)
    assert isinstance(wd, WideAndDeep)
    assert all(t.optimizer == Ftrl() and t.dim == 1 for t in wd.wide_embedding.tables)


def test_build_model_reports_shape_mismatch_with_the_tables() -> None:
    with pytest.raises(ValueError, match="bottom must end at the embedding dim 4"):
        build_model(DLRMConfig(), TABLES, num_dense=3, optimizer=Adagrad())
