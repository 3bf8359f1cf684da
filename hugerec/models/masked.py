"""A bidirectional transformer trained with masked-item modelling (BERT4Rec; Transformers4Rec's MLM).

Training replaces a random fraction of each sequence's items with [MASK] (row I + 1) and predicts the
original item at those positions from both sides (`mask_items`). The masked position's input is the
[MASK] row, so its own item can reach its prediction through no path (tests change the hidden item and
check the prediction does not move). At inference the history is followed by one [MASK]: the state
there scores the next item.
"""

from __future__ import annotations

import torch
from torch import nn

from hugerec.embedding.optimizers import Optimizer
from hugerec.models.sequence import (
    DEFAULT_OPTIMIZER,
    PAD,
    ItemLookup,
    Objective,
    SequenceConfig,
    TransformerEncoder,
    last_position,
)


class MaskedTransformer(nn.Module):
    objective = Objective.MASKED

    def __init__(self, cfg: SequenceConfig, optimizer: Optimizer = DEFAULT_OPTIMIZER) -> None:
        super().__init__()
        self.cfg = cfg
        self.lookup = ItemLookup(cfg, optimizer)
        self.encoder = TransformerEncoder(cfg, causal=False)

    def forward(self, seq: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """seq [B, L] (masked positions hold mask_id), candidates [M] -> ([B, L, D], [M, D])."""
        rows, cand = self.lookup(seq, candidates)
        return self.encoder(seq, rows), cand

    def query(self, history: torch.Tensor) -> torch.Tensor:
        """[B, L] -> [B, D]: the state at a [MASK] appended after the history (its oldest item drops if it is full)."""
        mask = torch.full_like(history[:, :1], self.cfg.mask_id)
        seq = torch.cat([history[:, 1:], mask], dim=1) if history.shape[1] >= self.cfg.max_len else torch.cat([history, mask], 1)
        return last_position(self(seq)[0])

    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup.candidates(ids)


def mask_items(
    seq: torch.Tensor, mask_id: int, prob: float, generator: torch.Generator | None = None, last: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """seq [B, L] -> (inputs [B, L] with masked items replaced by mask_id, targets [B, L]: the item where masked, else PAD).

    Each item is masked with probability `prob`; every non-empty row gets at least one mask (its last
    item when `last` and none was drawn, which also trains the inference case of a [MASK] at the end).
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"mask_items: prob must be in (0, 1), got {prob}")
    items = seq != PAD
    masked = (torch.rand(seq.shape, generator=generator) < prob) & items
    none = ~masked.any(dim=1) & items.any(dim=1)
    if last:
        masked[none, -1] = True
    else:
        # one uniformly chosen item of each row that drew none
        choice = torch.multinomial(items[none].float(), 1, generator=generator).squeeze(1)
        masked[none.nonzero().squeeze(1), choice] = True
    return seq.masked_fill(masked, mask_id), seq.masked_fill(~masked, PAD)
