"""GRU4Rec (Hidasi et al. 2016, with the 2018 cross-entropy / sampled-loss findings): a GRU over the item sequence.

The hidden state after item t scores item t + 1 against the (tied) item table. Left padding enters the
GRU as zero vectors; the state after a run of padding is the same for every sequence, a learned start state.
"""

from __future__ import annotations

import torch
from torch import nn

from hugerec.embedding.optimizers import Optimizer
from hugerec.models.sequence import (
    DEFAULT_OPTIMIZER,
    ItemLookup,
    Objective,
    SequenceConfig,
    last_position,
    padding_mask,
)


class GRU4Rec(nn.Module):
    objective = Objective.NEXT

    def __init__(self, cfg: SequenceConfig, optimizer: Optimizer = DEFAULT_OPTIMIZER) -> None:
        super().__init__()
        self.cfg = cfg
        self.lookup = ItemLookup(cfg, optimizer)
        self.drop = nn.Dropout(cfg.dropout)
        self.gru = nn.GRU(cfg.dim, cfg.dim, num_layers=cfg.num_layers, batch_first=True)
        self.out = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, seq: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """seq [B, L], candidates [M] -> ([B, L, D] hidden states, [M, D] candidate rows)."""
        rows, cand = self.lookup(seq, candidates)
        x = self.drop(rows * padding_mask(seq)[..., None].to(rows.dtype))
        hidden, _ = self.gru(x)  # [B, L, D]
        return self.out(self.drop(hidden)), cand

    def query(self, history: torch.Tensor) -> torch.Tensor:
        return last_position(self(history)[0])

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup.candidates(ids)
