"""The loss a retrieval or sequential config declares (`hugerec.models.objectives`'s fields), as
the trainer takes it.

    retrieval_loss(TwoTowerConfig(loss="sampled_softmax", num_negatives=256))  -> SampledSoftmax(...)
    sequence_loss(SASRecConfig(loss="full_softmax"))                           -> FullSoftmax()
"""

from __future__ import annotations

from hugerec.models.mf import MFConfig
from hugerec.models.objectives import Negatives
from hugerec.models.sequence import SequenceModelConfig
from hugerec.models.two_tower import TwoTowerConfig
from hugerec.training.losses import BPR, RetrievalLoss, SampledSoftmax
from hugerec.training.sequential import BCE, FullSoftmax, SequenceLoss


def retrieval_loss(config: TwoTowerConfig | MFConfig) -> RetrievalLoss:
    """config.loss "sampled_softmax" (negatives, num_negatives, alpha, logq; a two-tower's mask_history) or "bpr"."""
    match config.loss:
        case "bpr":
            return BPR()
        case "sampled_softmax":
            mask = isinstance(config, TwoTowerConfig) and config.mask_history
            return SampledSoftmax(Negatives(config.negatives), config.num_negatives, config.alpha, config.logq, mask)
        case other:
            raise ValueError(f"retrieval_loss: loss {other!r} is not 'sampled_softmax' or 'bpr'")


def sequence_loss(config: SequenceModelConfig) -> SequenceLoss:
    """config.loss "full_softmax" (over the catalogue), "sampled_softmax" (as for retrieval) or "bce" (one negative)."""
    match config.loss:
        case "full_softmax":
            return FullSoftmax()
        case "bce":
            return BCE()
        case "sampled_softmax":
            return SampledSoftmax(Negatives(config.negatives), config.num_negatives, config.alpha, config.logq)
        case other:
            raise ValueError(f"sequence_loss: loss {other!r} is not 'full_softmax', 'sampled_softmax' or 'bce'")
