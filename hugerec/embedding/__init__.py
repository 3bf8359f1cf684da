"""Embedding tables: configs, sparse optimizers, fused collections, hash tables, drop-in layers."""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names, imported on first use (hugerec.lazy_exports)
    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.delta import TableDelta, export_delta, import_delta, read_delta, write_delta
    from hugerec.embedding.hash_table import HashTable, HashTableStats
    from hugerec.embedding.interface import EmbeddingModule
    from hugerec.embedding.layers import Embedding, EmbeddingBag
    from hugerec.embedding.optimizers import (
        SGD,
        Adagrad,
        Adam,
        Ftrl,
        Optimizer,
        RowWiseAdagrad,
        optimizer_from_dict,
        optimizer_to_dict,
    )
    from hugerec.embedding.table_config import (
        DynamicConfig,
        Eviction,
        Initializer,
        Missing,
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
    "EmbeddingModule",
    "Eviction",
    "Ftrl",
    "HashTable",
    "HashTableStats",
    "Initializer",
    "Missing",
    "Normal",
    "Optimizer",
    "Pooling",
    "RowWiseAdagrad",
    "Storage",
    "StorageDtype",
    "TableConfig",
    "TableDelta",
    "Uniform",
    "Zeros",
    "export_delta",
    "import_delta",
    "optimizer_from_dict",
    "optimizer_to_dict",
    "read_delta",
    "write_delta",
]

lazy_exports(__name__)
