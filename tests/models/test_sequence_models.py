"""SASRec, the masked transformer and GRU4Rec: causality, no leakage under masking, shapes, truncation, learning."""

from __future__ import annotations

import pytest
import torch

from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.masked import MaskedTransformer, mask_items
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import PAD, SequenceConfig, attention_mask

CFG = SequenceConfig(num_items=50, max_len=8, dim=16, num_layers=2, num_heads=2, dropout=0.0)


def _seq(g: torch.Generator) -> torch.Tensor:
    seq = torch.randint(1, 51, (4, 8), generator=g)
    seq[0, :3] = PAD  # a left-padded row
    return seq


@pytest.mark.parametrize("model_type", [SASRec, GRU4Rec])
def test_prediction_at_t_ignores_later_items(model_type: type[SASRec] | type[GRU4Rec]) -> None:
    torch.manual_seed(0)
    model = model_type(CFG).eval()
    g = torch.Generator().manual_seed(1)
    seq = _seq(g)
    with torch.no_grad():
        h, _ = model(seq)
        for t in range(3, 7):
            changed = seq.clone()
            changed[:, t + 1 :] = torch.randint(1, 51, changed[:, t + 1 :].shape, generator=g)
            h2, _ = model(changed)
            torch.testing.assert_close(h2[:, : t + 1], h[:, : t + 1])
            assert not torch.allclose(h2[:, t + 1 :], h[:, t + 1 :])  # the test can see a change


def test_sasrec_padding_changes_nothing_and_is_finite() -> None:
    torch.manual_seed(0)
    model = SASRec(CFG).eval()
    seq = torch.tensor([[0, 0, 0, 0, 0, 3, 4, 5]])
    with torch.no_grad():
        h, _ = model(seq)
        assert torch.isfinite(h).all()
        # the same items without padding, at the same (right-aligned) positions, give the same states
        short, _ = model(seq[:, -3:])
    torch.testing.assert_close(short, h[:, -3:])


def test_masked_model_never_sees_the_masked_item() -> None:
    torch.manual_seed(0)
    model = MaskedTransformer(CFG).eval()
    g = torch.Generator().manual_seed(2)
    seq = _seq(g)
    inputs, targets = mask_items(seq, CFG.mask_id, 0.3, g)
    masked = targets != PAD
    assert masked.any(dim=1)[seq.ne(PAD).any(1)].all()  # every non-empty row has a mask
    assert (inputs[masked] == CFG.mask_id).all() and (targets[masked] == seq[masked]).all()
    assert (inputs[~masked] == seq[~masked]).all()
    # changing the hidden items leaves every state unchanged (they are not an input), changing a visible one does not
    other = seq.clone()
    other[masked] = (seq[masked] % 50) + 1
    with torch.no_grad():
        h, _ = model(inputs)
        # mask the same positions in `other`: the model's input is identical
        h2, _ = model(other.masked_fill(masked, CFG.mask_id))
        torch.testing.assert_close(h, h2)
        visible = inputs.clone()
        row, col = (~masked & (seq != PAD)).nonzero()[0]
        visible[row, col] = seq[row, col] % 50 + 1
        assert not torch.allclose(model(visible)[0][row], h[row])


def test_masked_model_is_bidirectional() -> None:
    mask = attention_mask(torch.tensor([[0, 1, 2]]), causal=False)[0, 0]
    assert mask.tolist() == [[True, True, True], [False, True, True], [False, True, True]]
    causal = attention_mask(torch.tensor([[0, 1, 2]]), causal=True)[0, 0]
    assert causal.tolist() == [[True, False, False], [False, True, False], [False, True, True]]


@pytest.mark.parametrize("model_type", [SASRec, GRU4Rec, MaskedTransformer])
def test_shapes_and_tied_item_rows(model_type: type[SASRec] | type[GRU4Rec] | type[MaskedTransformer]) -> None:
    model = model_type(CFG)
    seq = _seq(torch.Generator().manual_seed(3))
    h, cand = model(seq, torch.tensor([1, 2, 50]))
    assert h.shape == (4, 8, 16) and cand.shape == (3, 16)
    # the output layer's rows are the item table's rows
    torch.testing.assert_close(cand, model.lookup.items.table_weight("item")[[1, 2, 50]])
    assert model.query(seq).shape == (4, 16)


def test_config_errors_name_the_value() -> None:
    with pytest.raises(ValueError, match="num_items must be an int >= 1, got 0"):
        SequenceConfig(num_items=0)
    with pytest.raises(ValueError, match="dim 10 is not divisible by num_heads 3"):
        SequenceConfig(num_items=5, dim=10, num_heads=3)
    with pytest.raises(ValueError, match="prob"):
        mask_items(torch.ones(1, 2, dtype=torch.int64), 9, 0.0)
