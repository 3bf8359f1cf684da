"""Embedding tables: configs, sparse optimizers, fused collections, hash tables, drop-in layers."""

from hugerec.embedding.config import (
    DynamicConfig,
    Eviction,
    Initializer,
    Missing,
    Normal,
    Pooling,
    StorageDtype,
    TableConfig,
    Uniform,
    Zeros,
)
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "DynamicConfig",
    "Eviction",
    "Ftrl",
    "Initializer",
    "Missing",
    "Normal",
    "Optimizer",
    "Pooling",
    "RowWiseAdagrad",
    "StorageDtype",
    "TableConfig",
    "Uniform",
    "Zeros",
]
