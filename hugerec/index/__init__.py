"""Top-K over item vectors: blocked exact top-K and an inner-product index (exact or HNSW) behind one API."""

from hugerec.index.topk import top_k
from hugerec.index.vector_index import IndexConfig, IndexKind, VectorIndex, build_index, load_index

__all__ = [
    "IndexConfig",
    "IndexKind",
    "VectorIndex",
    "build_index",
    "load_index",
    "top_k",
]
