"""hugerec: deep-learning recommender systems with huge embedding tables, on PyTorch."""

from hugerec.embedding import (
    SGD,
    Adagrad,
    Adam,
    DynamicConfig,
    Ftrl,
    Pooling,
    RowWiseAdagrad,
    TableConfig,
)
from hugerec.sparse import Batch, JaggedTensor, PooledEmbeddings, SparseFeatures

__version__ = "0.1.0"

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "Batch",
    "DynamicConfig",
    "Ftrl",
    "JaggedTensor",
    "PooledEmbeddings",
    "Pooling",
    "RowWiseAdagrad",
    "SparseFeatures",
    "TableConfig",
    "__version__",
]
