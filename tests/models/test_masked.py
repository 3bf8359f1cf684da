"""The masked-item transformer: mask_items masks a share of the items (at least one per non-empty row, the last
one or a uniformly drawn one when none was drawn), leaves padding alone, and gives the targets; query appends a
[MASK] after the history (dropping the oldest item of a full one) and reads the state there."""

from __future__ import annotations

import pytest
import torch

from hugerec.models.masked import MaskedTransformer, mask_items
from hugerec.models.sequence import PAD, Objective, SequenceConfig

CFG = SequenceConfig(num_items=30, max_len=5, dim=8, num_layers=1, num_heads=2, dropout=0.0)
MASK = CFG.mask_id


def test_mask_items_share_and_targets() -> None:
    seq = torch.randint(1, 31, (400, 5), generator=torch.Generator().manual_seed(0))
    seq[:50, :2] = PAD
    seq[50] = PAD  # an empty row
    inputs, targets = mask_items(seq, MASK, 0.3, torch.Generator().manual_seed(1))
    masked = inputs == MASK
    assert torch.equal(masked, targets != PAD)
    assert torch.equal(targets[masked], seq[masked]) and torch.equal(inputs[~masked], seq[~masked])
    assert not masked[seq == PAD].any() and not masked[50].any()
    nonempty = (seq != PAD).any(1)
    assert masked.any(1)[nonempty].all()
    assert 0.25 < masked.sum() / (seq != PAD).sum() < 0.4


@pytest.mark.parametrize("last", [True, False])
def test_a_row_that_drew_no_mask_gets_one(last: bool) -> None:
    seq = torch.tensor([[PAD, 4, 5, 6, 7]] * 200)
    inputs, _ = mask_items(seq, MASK, 1e-9, torch.Generator().manual_seed(2), last=last)
    masked = inputs == MASK
    assert (masked.sum(1) == 1).all() and not masked[:, 0].any()
    if last:
        assert masked[:, -1].all()
    else:
        assert masked[:, 1:].any(0).all()  # every item position is drawn sometimes


@pytest.mark.parametrize("prob", [0.0, 1.0, -0.1])
def test_bad_probabilities_are_refused(prob: float) -> None:
    with pytest.raises(ValueError, match=f"mask_items: prob must be in \\(0, 1\\), got {prob}"):
        mask_items(torch.ones(1, 2, dtype=torch.int64), MASK, prob)


def test_query_reads_a_mask_after_the_history() -> None:
    torch.manual_seed(0)
    model = MaskedTransformer(CFG).eval()
    full = torch.tensor([[3, 4, 5, 6, 7]])
    short = torch.tensor([[PAD, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(model.query(full), model(torch.tensor([[4, 5, 6, 7, MASK]]))[0][:, -1])
        torch.testing.assert_close(model.query(short), model(torch.tensor([[PAD, 4, 5, MASK]]))[0][:, -1])
        # bidirectional: an earlier state sees a later item
        a, b = model(torch.tensor([[3, 4, 5, 6, 7]]))[0], model(torch.tensor([[3, 4, 5, 6, 8]]))[0]
    assert not torch.allclose(a[:, 0], b[:, 0])
    assert model.objective is Objective.MASKED
