"""DCN-v2 (Wang et al. 2021): a cross network and a deep network over x0 = [dense, embeddings].

stacked:   x0 [B, Dd + sum D] --cross_arch--> [B, Dd + sum D] --deep_arch--> [B, H] --over_arch--> [B]
parallel:  x0 --cross_arch--> [B, Dd + sum D] --+
           x0 --deep_arch---> [B, H] -----------+--cat--> over_arch (Linear) --> [B]
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch
from torch import nn

from hugerec.embedding.interface import EmbeddingModule
from hugerec.models.crossnet import CrossNet
from hugerec.models.mlp import MLP, Activation, check_dims
from hugerec.models.model import RecModel, lookup
from hugerec.models.vector_features import VectorArch
from hugerec.sparse.features import SparseFeatures


class CrossStructure(enum.Enum):
    STACKED = "stacked"  # deep network on top of the cross network
    PARALLEL = "parallel"  # both read x0; their outputs are concatenated


class DCNv2(RecModel):
    """Logits [B] from a Batch.

    embedding         the sparse arch (features may have different dims)
    num_dense         Dd dense features, fed to x0 as they come (normalize them in preprocessing)
    num_cross_layers  cross layers in the cross arch
    low_rank          None for full-rank cross layers, r for W = U V^T
    num_experts       > 1: mixture of low-rank experts per cross layer
    structure         STACKED or PARALLEL
    deep              deep arch widths (may be empty: cross network only); the over arch is one Linear to 1
    vectors           vector features (`hugerec.models.vector_features`), each projected to its out_dim and
                      concatenated into x0
    """

    def __init__(
        self,
        embedding: EmbeddingModule,
        num_dense: int,
        num_cross_layers: int,
        low_rank: int | None = None,
        num_experts: int = 1,
        structure: CrossStructure = CrossStructure.STACKED,
        deep: Sequence[int] = (1024, 1024),
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
        vectors: VectorArch | None = None,
    ) -> None:
        super().__init__(num_dense)
        if not isinstance(structure, CrossStructure):
            raise ValueError(f"DCNv2: structure must be a CrossStructure, got {structure!r}")
        deep = check_dims("DCNv2 deep", deep, allow_empty=True)
        in_dim = num_dense + sum(embedding.feature_dims)
        if vectors is not None:
            in_dim += vectors.out_dim * len(vectors.features)
        if in_dim == 0:
            raise ValueError("DCNv2: no input: num_dense=0 and the embedding collection has no pooled features")
        self.structure = structure
        self.sparse_arch = embedding
        self.vector_arch = vectors
        self.cross_arch = CrossNet(in_dim, num_cross_layers, low_rank, num_experts)
        self.deep_arch = MLP(in_dim, deep, activation, dropout) if deep else None
        deep_out = deep[-1] if deep else 0
        match structure:
            case CrossStructure.STACKED:
                over_in = deep_out or in_dim
            case CrossStructure.PARALLEL:
                over_in = in_dim + deep_out
        self.over_arch = nn.Linear(over_in, 1)

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        pooled = lookup(self.sparse_arch, sparse)
        return (pooled,) if self.vector_arch is None else (pooled, self.vector_arch.lookup(sparse))

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        parts = [dense, embedded[0]]
        if self.vector_arch is not None:
            parts += [v.to(dense.dtype) for v in self.vector_arch(embedded[1])]  # V x [B, out_dim]
        x0 = torch.cat(parts, dim=1)  # [B, Dd + sum D (+ V out_dim)]
        cross = self.cross_arch(x0)
        match self.structure:
            case CrossStructure.STACKED:
                h = cross if self.deep_arch is None else self.deep_arch(cross)
            case CrossStructure.PARALLEL:
                h = cross if self.deep_arch is None else torch.cat([cross, self.deep_arch(x0)], dim=1)
        return self.over_arch(h).squeeze(1).float()  # [B, 1] -> [B]
