"""The loss a retrieval or sequential config declares, as the trainer takes it."""

from __future__ import annotations

from hugerec.models.mf import MFConfig
from hugerec.models.objectives import Negatives
from hugerec.models.sequence import GRU4RecConfig, MLMConfig, SASRecConfig
from hugerec.models.two_tower import TwoTowerConfig
from hugerec.training.declared_loss import retrieval_loss, sequence_loss
from hugerec.training.losses import BPR, SampledSoftmax
from hugerec.training.sequential import BCE, FullSoftmax


def test_retrieval_losses() -> None:
    config = TwoTowerConfig(negatives=Negatives.POPULARITY, num_negatives=64, alpha=0.5, logq=False, mask_history=True)
    assert retrieval_loss(config) == SampledSoftmax(Negatives.POPULARITY, 64, 0.5, False, True)
    assert retrieval_loss(TwoTowerConfig()) == SampledSoftmax()  # the defaults agree
    assert retrieval_loss(MFConfig(loss="bpr")) == BPR()
    assert retrieval_loss(MFConfig(negatives="in_batch")) == SampledSoftmax(Negatives.IN_BATCH)  # type: ignore[arg-type]


def test_sequence_losses() -> None:
    assert sequence_loss(SASRecConfig()) == FullSoftmax()
    assert sequence_loss(GRU4RecConfig(loss="bce")) == BCE()
    assert sequence_loss(MLMConfig(loss="sampled_softmax", num_negatives=8)) == SampledSoftmax(num_negatives=8)
