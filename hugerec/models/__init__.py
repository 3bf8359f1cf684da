"""Layers (MLP, interactions, cross network, wide part), models (ranking: DLRM, DCNv2, DeepFM, WideAndDeep;
retrieval: TwoTower, MatrixFactorization; sequential: SASRec, MaskedTransformer, GRU4Rec, HSTU over [B, L] item
sequences; trees: LightGBM / XGBoost configs and boosters) and the registry that names them.

`config_from_dict({"type": "dlrm", ...})` reads any model type's config (`REGISTRY`, `model_type`);
`build_model(config, tables, num_dense, optimizer)` builds a ranking model from plain data,
`build_model(config, optimizer=..., num_users=U, num_items=I)` a retrieval or sequential one.
"""

from hugerec.models.crossnet import CrossNet
from hugerec.models.dcn import CrossStructure, DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.feature_interactions import DotInteraction, FMInteraction
from hugerec.models.gbm import (
    FeatureMatrix,
    GBMConfig,
    Library,
    TreeModel,
    is_ranking,
    library_of,
    require,
)
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUConfig, HSTUOptions
from hugerec.models.masked import MaskedTransformer
from hugerec.models.mf import MatrixFactorization, MFConfig
from hugerec.models.mlp import MLP, Activation
from hugerec.models.model import RecModel
from hugerec.models.model_config import DCNv2Config, DeepFMConfig, DLRMConfig, WideAndDeepConfig
from hugerec.models.objectives import Negatives
from hugerec.models.registry import (
    REGISTRY,
    Family,
    ModelConfig,
    ModelType,
    build_model,
    config_from_dict,
    config_to_dict,
    model_type,
    type_of,
)
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, GRU4RecConfig, MLMConfig, SASRecConfig, SequenceConfig, SequenceModelConfig
from hugerec.models.two_tower import Similarity, TwoTower, TwoTowerConfig
from hugerec.models.vector_features import VectorArch, VectorFeature
from hugerec.models.wide import WideArch, wide_tables
from hugerec.models.wide_deep import WideAndDeep

__all__ = [
    "DLRM",
    "HSTU",
    "MLP",
    "PAD",
    "REGISTRY",
    "Activation",
    "CrossNet",
    "CrossStructure",
    "DCNv2",
    "DCNv2Config",
    "DLRMConfig",
    "DeepFM",
    "DeepFMConfig",
    "DotInteraction",
    "FMInteraction",
    "Family",
    "FeatureMatrix",
    "GBMConfig",
    "GRU4Rec",
    "GRU4RecConfig",
    "HSTUConfig",
    "HSTUOptions",
    "Library",
    "MFConfig",
    "MLMConfig",
    "MaskedTransformer",
    "MatrixFactorization",
    "ModelConfig",
    "ModelType",
    "Negatives",
    "RecModel",
    "SASRec",
    "SASRecConfig",
    "SequenceConfig",
    "SequenceModelConfig",
    "Similarity",
    "TreeModel",
    "TwoTower",
    "TwoTowerConfig",
    "VectorArch",
    "VectorFeature",
    "WideAndDeep",
    "WideAndDeepConfig",
    "WideArch",
    "build_model",
    "config_from_dict",
    "config_to_dict",
    "is_ranking",
    "library_of",
    "model_type",
    "require",
    "type_of",
    "wide_tables",
]
