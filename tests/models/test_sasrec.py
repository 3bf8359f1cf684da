"""SASRec's contract: hidden state t depends on items 0..t only, query is the state after the most recent item,
candidate vectors are the item table's rows (tied output), and left padding changes no state of the items."""

from __future__ import annotations

import torch

from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, Objective, SequenceConfig

CFG = SequenceConfig(num_items=30, max_len=6, dim=8, num_layers=1, num_heads=2, dropout=0.0)


def _model() -> SASRec:
    torch.manual_seed(0)
    return SASRec(CFG).eval()


def test_query_is_the_last_state_and_candidates_are_table_rows() -> None:
    model = _model()
    seq = torch.tensor([[PAD, PAD, 3, 4, 5, 6], [1, 2, 3, 4, 5, 30]])
    with torch.no_grad():
        hidden, cand = model(seq, torch.tensor([30, 1]))
        torch.testing.assert_close(model.query(seq), hidden[:, -1])
        torch.testing.assert_close(model.item_vectors(torch.tensor([30, 1])), cand)
    torch.testing.assert_close(cand, model.lookup.items.table_weight("item")[[30, 1]])
    assert model.objective is Objective.NEXT and hidden.shape == (2, 6, 8)


def test_a_state_depends_on_earlier_items_only() -> None:
    model = _model()
    seq = torch.tensor([[5, 9, 2, 7, 1, 3]])
    later = seq.clone()
    later[0, 4:] = torch.tensor([20, 21])
    earlier = seq.clone()
    earlier[0, 1] = 22
    with torch.no_grad():
        h, h_later, h_earlier = model(seq)[0], model(later)[0], model(earlier)[0]
    torch.testing.assert_close(h_later[:, :4], h[:, :4])
    assert not torch.allclose(h_later[:, 4:], h[:, 4:]) and not torch.allclose(h_earlier[:, 1:], h[:, 1:])


def test_left_padding_changes_no_item_state() -> None:
    model = _model()
    with torch.no_grad():
        padded = model(torch.tensor([[PAD, PAD, PAD, 4, 8, 15]]))[0]
        short = model(torch.tensor([[4, 8, 15]]))[0]
    torch.testing.assert_close(short, padded[:, 3:])
    assert torch.isfinite(padded).all()
