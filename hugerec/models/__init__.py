"""Layers (MLP, interactions, cross network, wide part) and models (DLRM, DCNv2, DeepFM, WideAndDeep;
sequential: SASRec, MaskedTransformer, GRU4Rec, HSTU over [B, L] item sequences).

Every model takes a Batch and returns logits [B]; `build_model(config, tables, num_dense, optimizer)`
builds one from plain data (`model_config_from_dict({"type": "dlrm", ...})`).
"""

from hugerec.models.crossnet import CrossNet
from hugerec.models.dcn import CrossStructure, DCNv2
from hugerec.models.deepfm import DeepFM
from hugerec.models.dlrm import DLRM
from hugerec.models.feature_interactions import DotInteraction, FMInteraction
from hugerec.models.gbm import GBM_TYPES, FeatureMatrix, GBMConfig, Library, TreeModel, is_ranking, library_of, require
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUOptions
from hugerec.models.masked import MaskedTransformer
from hugerec.models.mf import MatrixFactorization
from hugerec.models.mlp import MLP, Activation
from hugerec.models.model import RecModel
from hugerec.models.model_config import (
    DCNv2Config,
    DeepFMConfig,
    DLRMConfig,
    ModelConfig,
    WideAndDeepConfig,
    build_model,
    model_config_from_dict,
    model_config_to_dict,
    model_name,
)
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, SequenceConfig
from hugerec.models.two_tower import Similarity, TwoTower, TwoTowerConfig
from hugerec.models.vector_features import VectorArch, VectorFeature
from hugerec.models.wide import WideArch, wide_tables
from hugerec.models.wide_deep import WideAndDeep

__all__ = [
    "DLRM",
    "GBM_TYPES",
    "HSTU",
    "MLP",
    "PAD",
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
    "FeatureMatrix",
    "GBMConfig",
    "GRU4Rec",
    "HSTUOptions",
    "Library",
    "MaskedTransformer",
    "MatrixFactorization",
    "ModelConfig",
    "RecModel",
    "SASRec",
    "SequenceConfig",
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
    "is_ranking",
    "library_of",
    "model_config_from_dict",
    "model_config_to_dict",
    "model_name",
    "require",
    "wide_tables",
]
