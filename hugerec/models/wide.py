"""The wide (linear) part: one learned weight per sparse id, plus a linear map of the dense features.

    logit_wide = bias + w_dense . dense + sum over features f, ids i of example b: w_f[i]

The per-id weights are an EmbeddingCollection of dim-1 tables (SUM pooling), so they get the
fused sparse optimizer; FTRL is the usual choice (McMahan et al. 2013), set per table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from hugerec.embedding.interface import EmbeddingModule
from hugerec.embedding.optimizers import Ftrl, Optimizer
from hugerec.embedding.table_config import Pooling, TableConfig, Zeros


def wide_tables(tables: Sequence[TableConfig], optimizer: Optimizer | None = None) -> list[TableConfig]:
    """Dim-1 twins of `tables` for a wide part: same rows and features, SUM pooling, zero init.

    Named "wide_<name>"; each carries `optimizer` (default Ftrl()) as its per-table override.
    Sequence (Pooling.NONE) tables have no wide twin.
    """
    opt = Ftrl() if optimizer is None else optimizer
    return [
        replace(t, name=f"wide_{t.name}", dim=1, pooling=Pooling.SUM, init=Zeros(), optimizer=opt)
        for t in tables
        if t.pooling is not Pooling.NONE
    ]


def check_wide(embedding: EmbeddingModule, where: str) -> None:
    """ValueError unless every pooled feature of `embedding` has dim 1."""
    wrong = {k: d for k, d in zip(embedding.feature_names, embedding.feature_dims, strict=True) if d != 1}
    if wrong:
        raise ValueError(f"{where}: wide features need dim-1 tables, got dims {wrong}")
    if not embedding.feature_names:
        raise ValueError(f"{where}: the wide embedding collection has no pooled features")


class WideArch(nn.Module):
    """(dense [B, Dd], per-feature weights [B, Fw] from the dim-1 lookups) -> wide logit [B]."""

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        self.dense = nn.Linear(num_dense, 1, bias=False) if num_dense > 0 else None
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, dense: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        logit = weights.sum(dim=1) + self.bias  # [B, Fw] -> [B]
        if self.dense is not None:
            logit = logit + self.dense(dense).squeeze(1)  # [B, Dd] -> [B]
        return logit
