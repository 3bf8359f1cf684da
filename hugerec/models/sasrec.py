"""SASRec (Kang & McAuley 2018): causal self-attention over the item sequence, output tied to the item table.

    model = SASRec(SequenceConfig(num_items=3706, max_len=200, dim=64))
    hidden, cand = model(seq, candidates)   # seq [B, L] -> hidden [B, L, D]; candidates [M] -> [M, D]
    scores = model.query(history) @ model.item_vectors(ids).T

Position t attends to positions <= t only, so hidden[:, t] depends on seq[:, :t + 1] alone and predicts
seq[:, t + 1] (tests check that changing later items leaves it unchanged).
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
    TransformerEncoder,
    last_position,
)


class SASRec(nn.Module):
    objective = Objective.NEXT

    def __init__(self, cfg: SequenceConfig, optimizer: Optimizer = DEFAULT_OPTIMIZER) -> None:
        super().__init__()
        self.cfg = cfg
        self.lookup = ItemLookup(cfg, optimizer)
        self.encoder = TransformerEncoder(cfg, causal=True)

    def forward(self, seq: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """seq [B, L] (L <= max_len, left-padded), candidates [M] -> ([B, L, D] hidden states, [M, D] candidate rows)."""
        rows, cand = self.lookup(seq, candidates)
        return self.encoder(seq, rows), cand

    def query(self, history: torch.Tensor) -> torch.Tensor:
        """[B, L] histories -> [B, D]: the vector whose dot product with item rows scores the next item."""
        return last_position(self(history)[0])

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup.candidates(ids)
