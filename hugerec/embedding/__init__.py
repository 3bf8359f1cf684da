"""Embedding tables: configs, sparse optimizers, fused collections, hash tables, drop-in layers."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.layers import Embedding, EmbeddingBag
    from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, RowWiseAdagrad
    from hugerec.embedding.table_config import (
        DynamicConfig,
        Eviction,
        Normal,
        Pooling,
        Storage,
        StorageDtype,
        TableConfig,
        Uniform,
        Zeros,
    )

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "DynamicConfig",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingCollection",
    "Eviction",
    "Ftrl",
    "Normal",
    "Pooling",
    "RowWiseAdagrad",
    "Storage",
    "StorageDtype",
    "TableConfig",
    "Uniform",
    "Zeros",
]

lazy_exports(__name__)
