"""DLRM (Naumov et al. 2019), as in the MLPerf reference: the paper's four boxes.

    dense [B, Dd] --dense_arch (bottom MLP)--> [B, D] --------------------------+
                                                  |                             |
    sparse --sparse_arch (embeddings)--> [B, F, D]+-> [B, F+1, D] --interaction--> [B, (F+1)F/2]
                                                                                |
                                   over_arch (top MLP) <-- cat [B, D + (F+1)F/2] +--> logits [B]

MLPerf shapes: 13 dense, 26 tables of dim 128, bottom 512-256-128, top 1024-1024-512-256-1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hugerec.embedding.interface import EmbeddingModule
from hugerec.models.feature_interactions import DotInteraction
from hugerec.models.mlp import MLP, Activation, check_dims
from hugerec.models.model import RecModel, common_dim, lookup
from hugerec.models.vector_features import VectorArch
from hugerec.sparse.features import SparseFeatures


class DLRM(RecModel):
    """Logits [B] from a Batch.

    embedding         the sparse arch: every pooled feature must have the same dim D
    num_dense         Dd dense features; 0 for data without any (then `bottom` must be empty)
    bottom            dense arch widths, ending at D (ReLU after every layer, as in MLPerf)
    top               over arch widths, ending at 1 (the logit; no activation after it)
    self_interaction  also feed each vector's dot with itself to the over arch
    vectors           vector features (`hugerec.models.vector_features`), each projected to D and taking part in
                      the interaction like one more sparse feature (its out_dim must be D)
    """

    def __init__(
        self,
        embedding: EmbeddingModule,
        num_dense: int,
        bottom: Sequence[int],
        top: Sequence[int],
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
        self_interaction: bool = False,
        vectors: VectorArch | None = None,
    ) -> None:
        super().__init__(num_dense)
        dim = common_dim(embedding, "DLRM")
        if vectors is not None and vectors.out_dim != dim:
            raise ValueError(f"DLRM: the vector features project to {vectors.out_dim}, the embedding dim is {dim}")
        bottom = check_dims("DLRM bottom", bottom, allow_empty=True)
        top = check_dims("DLRM top", top)
        if num_dense > 0 and (not bottom or bottom[-1] != dim):
            raise ValueError(f"DLRM: bottom must end at the embedding dim {dim}, got bottom={list(bottom)}")
        if num_dense == 0 and bottom:
            raise ValueError(f"DLRM: num_dense=0 (no dense features) needs bottom=[], got bottom={list(bottom)}")
        if top[-1] != 1:
            raise ValueError(f"DLRM: top must end at 1 (the logit), got top={list(top)}")
        self.dim = dim
        self.num_sparse = len(embedding.feature_names)
        self.sparse_arch = embedding
        self.vector_arch = vectors
        self.dense_arch = MLP(num_dense, bottom, activation) if num_dense > 0 else None
        num_vectors = 0 if vectors is None else len(vectors.features)
        self.interaction_arch = DotInteraction(self.num_sparse + num_vectors + int(num_dense > 0), self_interaction)
        over_in = self.interaction_arch.out_dim + (dim if num_dense > 0 else 0)
        self.over_arch = MLP(over_in, top, activation, dropout, final_activation=False)

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        pooled = lookup(self.sparse_arch, sparse)
        return (pooled,) if self.vector_arch is None else (pooled, self.vector_arch.lookup(sparse))

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        pooled = embedded[0]
        sparse = pooled.view(-1, self.num_sparse, self.dim)  # [B, F*D] -> [B, F, D]
        if self.vector_arch is not None:
            projected = torch.stack(self.vector_arch(embedded[1]), dim=1).to(sparse.dtype)  # [B, V, D]
            sparse = torch.cat([sparse, projected], dim=1)  # [B, F + V, D]
        if self.dense_arch is None:
            z = self.interaction_arch(sparse)  # [B, F, D] -> [B, F(F-1)/2]
        else:
            d = self.dense_arch(dense)  # [B, Dd] -> [B, D]
            # the interaction of [d, sparse] as [B, F+1, D], without building it
            z = torch.cat([d, self.interaction_arch.forward_split(d, sparse.to(d.dtype))], dim=1)  # [B, D + (F+1)F/2]
        return self.over_arch(z).squeeze(1).float()  # [B, 1] -> [B]
