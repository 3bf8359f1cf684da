"""GRU4Rec's contract: a GRU over the item sequence whose state t depends on items 0..t only; left padding
enters as zero vectors, so every sequence's state after the same run of padding is one learned start state;
query is the last state and candidates are the tied item rows."""

from __future__ import annotations

import torch

from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.sequence import PAD, Objective, SequenceConfig

CFG = SequenceConfig(num_items=30, max_len=6, dim=8, num_layers=2, num_heads=1, dropout=0.0)


def _model() -> GRU4Rec:
    torch.manual_seed(0)
    return GRU4Rec(CFG).eval()


def test_padding_is_a_shared_start_state() -> None:
    model = _model()
    seq = torch.tensor([[PAD, PAD, 3, 4, 5, 6], [PAD, PAD, 9, 1, 2, 30]])
    with torch.no_grad():
        hidden = model(seq)[0]
    torch.testing.assert_close(hidden[0, :2], hidden[1, :2])
    assert not torch.allclose(hidden[0, 2:], hidden[1, 2:])


def test_a_state_depends_on_earlier_items_only() -> None:
    model = _model()
    seq = torch.tensor([[5, 9, 2, 7, 1, 3]])
    later = seq.clone()
    later[0, 3:] = torch.tensor([20, 21, 22])
    with torch.no_grad():
        h, h_later = model(seq)[0], model(later)[0]
    torch.testing.assert_close(h_later[:, :3], h[:, :3])
    assert not torch.allclose(h_later[:, 3:], h[:, 3:])


def test_query_and_tied_candidates() -> None:
    model = _model()
    seq = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        hidden, cand = model(seq, torch.tensor([7]))
        torch.testing.assert_close(model.query(seq), hidden[:, -1])
    torch.testing.assert_close(cand, model.lookup.items.table_weight("item")[[7]])
    torch.testing.assert_close(model.item_vectors(torch.tensor([7])), cand)
    assert model.objective is Objective.NEXT
