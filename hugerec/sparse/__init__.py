"""Core data types every layer speaks."""

from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor
from hugerec.sparse.pooled import PooledEmbeddings

__all__ = [
    "Batch",
    "JaggedTensor",
    "PooledEmbeddings",
    "SparseFeatures",
]
