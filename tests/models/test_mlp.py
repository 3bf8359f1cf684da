import pytest
import torch
from torch import nn

from hugerec.models.mlp import MLP, Activation


def test_tower_shapes_and_layers() -> None:
    mlp = MLP(13, [512, 256, 64])
    assert mlp(torch.randn(5, 13)).shape == (5, 64)
    kinds = [type(m) for m in mlp.layers]
    assert kinds == [nn.Linear, nn.ReLU] * 3
    assert (mlp.in_dim, mlp.out_dim) == (13, 64)


def test_logit_layer_has_no_final_activation_and_dropout_only_between_layers() -> None:
    mlp = MLP(8, [16, 16, 1], Activation.GELU, dropout=0.5, final_activation=False)
    kinds = [type(m) for m in mlp.layers]
    assert kinds == [nn.Linear, nn.GELU, nn.Dropout, nn.Linear, nn.GELU, nn.Dropout, nn.Linear]
    last = mlp.layers[-1]
    torch.nn.init.zeros_(last.weight)
    torch.nn.init.constant_(last.bias, -3.0)
    out = mlp.eval()(torch.randn(4, 8))
    torch.testing.assert_close(out, torch.full((4, 1), -3.0))  # a logit, not clamped by an activation


@pytest.mark.parametrize("act", list(Activation))
def test_every_activation_matches_torch(act: Activation) -> None:
    mlp = MLP(3, [4], act)
    x = torch.randn(6, 3)
    lin = mlp.layers[0]
    ref = {
        Activation.RELU: torch.relu,
        Activation.GELU: nn.functional.gelu,
        Activation.SILU: nn.functional.silu,
        Activation.TANH: torch.tanh,
        Activation.SIGMOID: torch.sigmoid,
    }[act]
    torch.testing.assert_close(mlp(x), ref(lin(x)))


def test_gradients_reach_every_layer() -> None:
    torch.manual_seed(0)
    mlp = MLP(5, [7, 7, 2], final_activation=False)
    mlp(torch.randn(9, 5)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mlp.parameters())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_dim": 0, "dims": [4]}, "in_dim"),
        ({"in_dim": 3, "dims": []}, "at least one"),
        ({"in_dim": 3, "dims": [4, 0]}, r"\[4, 0\]"),
        ({"in_dim": 3, "dims": [4], "dropout": 1.0}, "dropout"),
        ({"in_dim": 3, "dims": [4], "activation": "relu"}, "activation"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MLP(**kwargs)
