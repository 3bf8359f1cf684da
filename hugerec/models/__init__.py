"""Layers (MLP, interactions, cross network, wide part), models (ranking: DLRM, DCNv2, DeepFM, WideAndDeep;
retrieval: TwoTower, MatrixFactorization; sequential: SASRec, MaskedTransformer, GRU4Rec, HSTU over [B, L] item
sequences; trees: LightGBM / XGBoost configs and boosters) and the registry that names them.

`config_from_dict({"type": "dlrm", ...})` reads any model type's config (`REGISTRY`, `model_type`);
`build_model(config, tables, num_dense, optimizer)` builds a ranking model from plain data,
`build_model(config, optimizer=..., num_users=U, num_items=I)` a retrieval or sequential one.
"""

from hugerec.models.dcn import DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.gbm import GBMConfig, TreeModel
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUConfig
from hugerec.models.masked import MaskedTransformer
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.model import RecModel
from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.models.registry import REGISTRY, Family, build_model, config_from_dict
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import GRU4RecConfig, MLMConfig, SASRecConfig
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.models.wide_deep import WideAndDeep

__all__ = [
    "DLRM",
    "HSTU",
    "REGISTRY",
    "DCNv2",
    "DCNv2Config",
    "DLRMConfig",
    "DeepFM",
    "DeepFMConfig",
    "Family",
    "GBMConfig",
    "GRU4Rec",
    "GRU4RecConfig",
    "HSTUConfig",
    "MFConfig",
    "MLMConfig",
    "MaskedTransformer",
    "MatrixFactorization",
    "RecModel",
    "SASRec",
    "SASRecConfig",
    "TreeModel",
    "TwoTower",
    "TwoTowerConfig",
    "WideAndDeep",
    "WideAndDeepConfig",
    "build_model",
    "config_from_dict",
]
