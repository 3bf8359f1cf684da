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


def _grads(mlp: MLP, x: torch.Tensor, fused: bool) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    mlp.zero_grad()
    x = x.clone().requires_grad_(True)
    out = mlp(x) if fused else mlp.layers(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    assert x.grad is not None
    return out.detach().clone(), [p.grad.clone() for p in mlp.parameters() if p.grad is not None], x.grad.clone()


@pytest.mark.parametrize(
    ("act", "final", "batch"),
    [(Activation.RELU, True, 33), (Activation.RELU, False, 1), (Activation.GELU, False, 7), (Activation.TANH, True, 5)],
)
@pytest.mark.parametrize("in_dim", [6, 70])  # 70: zero-padded to 96 inside the GEMMs
def test_recycled_buffer_path_matches_the_plain_layers(act: Activation, final: bool, batch: int, in_dim: int) -> None:
    torch.manual_seed(1)
    mlp = MLP(in_dim, [16, 8, 3], act, final_activation=final)
    x = torch.randn(batch, in_dim)
    x[0] = 0.0  # a row whose pre-activations are the biases: some exact zeros through the ReLUs
    for _ in range(3):  # the later rounds run on recycled storages
        out, grads, gx = _grads(mlp, x, fused=True)
        ref_out, ref_grads, ref_gx = _grads(mlp, x, fused=False)
        torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gx, ref_gx, rtol=1e-5, atol=1e-6)
        assert len(grads) == len(ref_grads) == 6
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_storages_are_reused_but_never_while_held() -> None:
    torch.manual_seed(2)
    mlp = MLP(4, [32, 32])
    x = torch.randn(64, 4)
    first = mlp(x)
    first.sum().backward()
    first_ptr = first.data_ptr()
    kept = first.detach().clone()
    second = mlp(x + 1.0)  # `first` is still held: its storage must not be written
    torch.testing.assert_close(first.detach(), kept)
    second_ptr = second.data_ptr()
    assert second_ptr != first_ptr
    del first, second
    third = mlp(x)  # both earlier outputs are gone: the last layer's output lands in one of their storages
    assert third.data_ptr() in {first_ptr, second_ptr}


def test_plain_path_under_autocast_and_for_other_dtypes() -> None:
    mlp = MLP(4, [8, 2])
    x = torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mlp(x).dtype == torch.bfloat16
    assert mlp.double()(x.double()).dtype == torch.float64
    assert [k for k in mlp.state_dict()] == ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias"]
