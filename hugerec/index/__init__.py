"""Top-K over item vectors: blocked exact top-K and an inner-product index (exact or HNSW) behind one API."""

from hugerec.index.topk import matmul_block, top_k
from hugerec.index.vector_index import (
    ExactIndex,
    HnswIndex,
    IndexConfig,
    IndexKind,
    VectorIndex,
    build_index,
    load_index,
)

__all__ = [
    "ExactIndex",
    "HnswIndex",
    "IndexConfig",
    "IndexKind",
    "VectorIndex",
    "build_index",
    "load_index",
    "matmul_block",
    "top_k",
]
