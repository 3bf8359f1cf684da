"""RecModel: what every hugerec model shares: an eager sparse arch and a tensor-only dense part.

    forward(batch) = dense_forward(batch.dense, embed(batch.sparse)) -> logits [B] float32

`embed` runs the EmbeddingCollections (fused lookups whose backward applies the sparse optimizer
in place: Python and Numba that torch.compile must not trace). `dense_forward` is everything after
the lookups, tensors in and out, so `compile_dense()` can hand exactly that part to torch.compile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.interface import EmbeddingModule
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


class RecModel(nn.Module):
    """Base of DLRM, DCNv2, DeepFM and WideAndDeep (subclasses set `num_dense` and the two parts)."""

    num_dense: int

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        if isinstance(num_dense, bool) or not isinstance(num_dense, int) or num_dense < 0:
            raise ValueError(f"{type(self).__name__}: num_dense must be an int >= 0, got {num_dense!r}")
        self.num_dense = num_dense
        self._compiled_dense: Callable[..., torch.Tensor] | None = None

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        """Pooled lookups of every embedding collection, each [B, sum D] (eager)."""
        raise NotImplementedError

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(dense [B, Dd], embed()'s tensors) -> logits [B] float32 (compilable)."""
        raise NotImplementedError

    def forward(self, batch: Batch) -> torch.Tensor:
        if batch.dense.shape[1] != self.num_dense:
            raise ValueError(
                f"{type(self).__name__}: built for {self.num_dense} dense features, batch has {batch.dense.shape[1]}"
            )
        embedded = self.embed(batch.sparse)
        dense_fn = self.dense_forward if self._compiled_dense is None else self._compiled_dense
        return dense_fn(batch.dense, embedded)

    def compile_dense(self, **kwargs: Any) -> None:
        """torch.compile the dense part (kwargs go to torch.compile); the lookups stay eager."""
        self._compiled_dense = torch.compile(self.dense_forward, **kwargs)

    def embedding_collections(self) -> list[EmbeddingCollection]:
        return [m for m in self.modules() if isinstance(m, EmbeddingCollection)]

    def dense_parameters(self) -> list[nn.Parameter]:
        """Parameters for the dense optimizer: everything outside the embedding collections."""
        inside = {id(p) for c in self.embedding_collections() for p in c.parameters()}
        return [p for p in self.parameters() if id(p) not in inside]


def common_dim(embedding: EmbeddingModule, where: str) -> int:
    """The one D shared by every feature of `embedding` (needed to stack them as [B, F, D])."""
    dims = dict(zip(embedding.feature_names, embedding.feature_dims, strict=True))
    if not dims:
        raise ValueError(f"{where}: the embedding collection has no pooled features")
    if len(set(dims.values())) > 1:
        raise ValueError(f"{where}: every feature needs the same embedding dim, got {dims}")
    return next(iter(dims.values()))


def lookup(embedding: EmbeddingModule, sparse: SparseFeatures) -> torch.Tensor:
    """Pooled [B, sum D] of `embedding`'s features, from a batch that may also carry other features.

    A model with two collections (deep and wide) may read different features in each; the batch's
    features that `embedding` does not know are left out before the lookup (the collection rejects them).
    """
    known = set(embedding.feature_names) | set(embedding.sequence_feature_names)
    if not known.issuperset(sparse.keys):
        sparse = sparse.select([k for k in sparse.keys if k in known])
    return embedding(sparse).values
