"""Embedding tables: configs, sparse optimizers, fused collections, hash tables, drop-in layers."""

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.delta import TableDelta, export_delta, import_delta, read_delta, write_delta
from hugerec.embedding.hash_table import HashTable, HashTableStats
from hugerec.embedding.interface import EmbeddingModule
from hugerec.embedding.layers import Embedding, EmbeddingBag
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad
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
    "read_delta",
    "write_delta",
]
