"""Matrix factorisation: score(u, i) = p_u . q_i, the simplest retrieval baseline, on one EmbeddingCollection.

    model = MatrixFactorization(num_users=U, num_items=I, dim=64, optimizer=hr.Adam(lr=1e-2))
    model.user_vectors(users, history)   # [B, D]  (history is accepted for the common interface, unused)
    model.item_vectors(items)            # [N, D]
    model(model.user_features(users), model.item_features(items))   # a training step: ([B, D], [N, D])

The same interface as `TwoTower`, so losses, metrics, the index and recommend work for both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, Optimizer
from hugerec.embedding.table_config import DynamicConfig, Normal, TableConfig
from hugerec.models.objectives import RETRIEVAL_LOSSES, Negatives, check_objective
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor


@dataclass(frozen=True)
class MFConfig:
    """[model] type = "mf": dim, the rows' init_std, temperature (logits are p_u . q_i / temperature) and
    the training objective as for the two-tower (`hugerec.models.objectives`)."""

    dim: int = 64  # the width of the user and item factors
    temperature: float = 1.0  # logits are p_u . q_i / temperature
    init_std: float = 0.1  # factors start as N(0, init_std^2)
    loss: str = "sampled_softmax"  # "sampled_softmax" or "bpr"
    negatives: str = Negatives.MIXED.value  # sampled_softmax's negatives, a Negatives value: "mixed", "in_batch", "uniform", "popularity"
    num_negatives: int = 1024  # negatives sampled per batch (besides the in-batch ones for "mixed")
    alpha: float = 0.0  # popularity negatives are drawn ~ count^alpha (0: uniform)
    logq: bool = True  # subtract log of each candidate's sampling probability from its logit (logQ correction)

    def __post_init__(self) -> None:
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"MFConfig: dim must be an integer >= 1, got {self.dim!r}")
        for name in ("temperature", "init_std"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"MFConfig: {name} must be > 0, got {v!r}")
        check_objective(self, "MFConfig", RETRIEVAL_LOSSES)


class MatrixFactorization(nn.Module):
    def __init__(
        self,
        num_users: int,
        num_items: int,
        dim: int = 64,
        optimizer: Optimizer = Adam(lr=1e-2),  # noqa: B008  # frozen dataclass: immutable default
        temperature: float = 1.0,
        init_std: float = 0.1,
        dynamic_users: DynamicConfig | None = None,
    ) -> None:
        super().__init__()
        if num_users < 1 or num_items < 1 or dim < 1:
            raise ValueError(f"MatrixFactorization: num_users, num_items and dim must be >= 1, got {num_users}, {num_items}, {dim}")
        if not temperature > 0:
            raise ValueError(f"MatrixFactorization: temperature must be > 0, got {temperature}")
        self.num_users, self.num_items, self._dim, self._temperature = num_users, num_items, dim, temperature
        init = Normal(0.0, init_std)
        # two collections: one lookup (one optimizer step) per table per training step
        self.user_embedding = EmbeddingCollection([TableConfig("user_id", num_users, dim, init=init, dynamic=dynamic_users)], optimizer)
        self.item_embedding = EmbeddingCollection([TableConfig("item_id", num_items, dim, init=init)], optimizer)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def temperature(self) -> float:
        return self._temperature

    def user_features(self, users: torch.Tensor, history: JaggedTensor | None = None) -> SparseFeatures:
        """users [B] int64 -> the user table's lookup (history unused: the common interface)."""
        return SparseFeatures(("user_id",), users, torch.ones_like(users, dtype=torch.int32))

    def item_features(self, items: torch.Tensor) -> SparseFeatures:
        """items [N] int64 -> the item table's lookup."""
        return SparseFeatures(("item_id",), items, torch.ones_like(items, dtype=torch.int32))

    def forward(self, users: SparseFeatures, items: SparseFeatures) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step's vectors from prebuilt lookups: users [B, D], items [N, D]."""
        return self.user_embedding(users).values, self.item_embedding(items).values

    def user_vectors(self, users: torch.Tensor, history: JaggedTensor | None = None) -> torch.Tensor:
        """users [B] int64 -> [B, D]."""
        return self.user_embedding(self.user_features(users)).values

    def item_vectors(self, items: torch.Tensor) -> torch.Tensor:
        """items [N] int64 -> [N, D]."""
        return self.item_embedding(self.item_features(items)).values
