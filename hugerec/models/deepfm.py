"""DeepFM (Guo et al. 2017): a factorization machine and a deep network sharing the embeddings.

fields [B, Dd + F, D]:  each dense feature j becomes dense[:, j] * v_j (v_j a learned [D] vector),
                        each sparse feature its pooled embedding
logit = first order (WideArch: bias + dense linear + dim-1 sparse weights, if `wide` is given)
      + FM second order over the fields (FMInteraction)
      + deep_arch(cat(dense, embeddings)) -> over_arch (Linear to 1)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from hugerec.embedding.interface import EmbeddingModule
from hugerec.models.feature_interactions import FMInteraction
from hugerec.models.mlp import MLP, Activation, check_dims
from hugerec.models.model import RecModel, common_dim, lookup
from hugerec.models.wide import WideArch, check_wide
from hugerec.sparse.features import SparseFeatures


class DeepFM(RecModel):
    """Logits [B] from a Batch.

    embedding  the sparse arch, shared by FM and deep parts: every pooled feature has the same dim D
    num_dense  Dd dense features
    deep       deep arch widths; the over arch is one Linear to 1
    wide       optional dim-1 collection for the sparse first-order weights (see `wide_tables`)
    """

    def __init__(
        self,
        embedding: EmbeddingModule,
        num_dense: int,
        deep: Sequence[int] = (400, 400, 400),
        wide: EmbeddingModule | None = None,
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
    ) -> None:
        super().__init__(num_dense)
        dim = common_dim(embedding, "DeepFM")
        deep = check_dims("DeepFM deep", deep)
        if wide is not None:
            check_wide(wide, "DeepFM wide")
        self.dim = dim
        self.num_sparse = len(embedding.feature_names)
        self.sparse_arch = embedding
        self.wide_embedding = wide
        self.dense_embedding = nn.Parameter(torch.empty(num_dense, dim))
        nn.init.normal_(self.dense_embedding, std=dim**-0.5)
        self.wide_arch = WideArch(num_dense)
        self.fm_arch = FMInteraction()
        self.deep_arch = MLP(num_dense + self.num_sparse * dim, deep, activation, dropout)
        self.over_arch = nn.Linear(deep[-1], 1)

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        pooled = lookup(self.sparse_arch, sparse)
        if self.wide_embedding is None:
            return (pooled,)
        return (pooled, lookup(self.wide_embedding, sparse))

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        pooled = embedded[0]
        batch = pooled.shape[0]
        weights = embedded[1] if len(embedded) > 1 else pooled.new_zeros(batch, 0)  # [B, Fw]
        dense_fields = dense.unsqueeze(2) * self.dense_embedding  # [B, Dd, 1] * [Dd, D] -> [B, Dd, D]
        sparse_fields = pooled.view(batch, self.num_sparse, self.dim)  # [B, F*D] -> [B, F, D]
        fields = torch.cat([dense_fields, sparse_fields], dim=1)  # -> [B, Dd + F, D]
        deep = self.over_arch(self.deep_arch(torch.cat([dense, pooled], dim=1))).squeeze(1)  # -> [B]
        return (self.wide_arch(dense, weights) + self.fm_arch(fields) + deep).float()
