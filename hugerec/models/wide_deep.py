"""Wide & Deep (Cheng et al. 2016): a linear model over sparse ids plus an MLP over embeddings.

wide:  dim-1 lookups [B, Fw] + dense [B, Dd] --wide_arch--> [B]
deep:  cat(dense, embeddings) [B, Dd + sum D] --deep_arch--> [B, H] --over_arch--> [B]
logit = wide + deep
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hugerec.embedding.interface import EmbeddingModule
from hugerec.models.mlp import MLP, Activation, check_dims
from hugerec.models.model import RecModel, lookup
from hugerec.models.wide import WideArch, check_wide
from hugerec.sparse.features import SparseFeatures


class WideAndDeep(RecModel):
    """Logits [B] from a Batch.

    deep_embedding  the deep sparse arch (features may have different dims)
    wide_embedding  dim-1 tables, usually with Ftrl as their per-table optimizer (see `wide_tables`);
                    its features may differ from the deep ones (e.g. hashed feature crosses)
    num_dense       Dd dense features, fed to both parts
    deep            deep arch widths; the over arch is one Linear to 1
    """

    def __init__(
        self,
        deep_embedding: EmbeddingModule,
        wide_embedding: EmbeddingModule,
        num_dense: int,
        deep: Sequence[int] = (1024, 512, 256),
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_dense)
        deep = check_dims("WideAndDeep deep", deep)
        check_wide(wide_embedding, "WideAndDeep wide_embedding")
        if deep_embedding is wide_embedding:
            raise ValueError("WideAndDeep: deep_embedding and wide_embedding must be different collections")
        self.sparse_arch = deep_embedding
        self.wide_embedding = wide_embedding
        self.wide_arch = WideArch(num_dense)
        self.deep_arch = MLP(num_dense + sum(deep_embedding.feature_dims), deep, activation, dropout)
        self.over_arch = nn.Linear(deep[-1], 1)

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        return (lookup(self.sparse_arch, sparse), lookup(self.wide_embedding, sparse))

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        pooled, weights = embedded
        deep = self.over_arch(self.deep_arch(torch.cat([dense, pooled], dim=1))).squeeze(1)  # -> [B]
        return (self.wide_arch(dense, weights) + deep).float()
