import pytest
import torch

from hugerec.models.crossnet import CrossNet


def test_full_rank_layers_follow_the_formula() -> None:
    torch.manual_seed(0)
    net = CrossNet(6, num_layers=2).double()
    x0 = torch.randn(4, 6, dtype=torch.float64)
    x = x0
    for layer in net.layers:
        x = x0 * (x @ layer.weight.T + layer.bias) + x  # x_{l+1} = x0 * (W x_l + b) + x_l
    torch.testing.assert_close(net(x0), x)


def test_low_rank_layers_follow_the_formula() -> None:
    net = CrossNet(8, num_layers=3, low_rank=2).double()
    x0 = torch.randn(5, 8, dtype=torch.float64)
    x = x0
    for layer in net.layers:
        v, u = layer[0], layer[1]
        assert v.weight.shape == (2, 8) and u.weight.shape == (8, 2)
        x = x0 * (x @ v.weight.T @ u.weight.T + u.bias) + x  # W = U V^T
    torch.testing.assert_close(net(x0), x)


def test_mixture_of_experts_follows_the_formula() -> None:
    net = CrossNet(5, num_layers=2, low_rank=3, num_experts=4).double()
    x0 = torch.randn(3, 5, dtype=torch.float64)
    x = x0
    for layer in net.layers:
        gates = torch.softmax(x @ layer.gate.weight.T, dim=1)  # [B, K]
        out = torch.zeros_like(x)
        for k in range(4):
            h = torch.relu(torch.relu(x @ layer.v[k]) @ layer.c[k])
            out += gates[:, k : k + 1] * x0 * (h @ layer.u[k] + layer.bias)
        x = out + x
    torch.testing.assert_close(net(x0), x)


def test_zero_weights_make_identity_and_gradients_flow() -> None:
    net = CrossNet(4, num_layers=2)
    for layer in net.layers:
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.zeros_(layer.bias)
    x0 = torch.randn(3, 4)
    torch.testing.assert_close(net(x0), x0)
    net(x0).square().sum().backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"in_dim": 0, "num_layers": 1}, "in_dim"),
        ({"in_dim": 4, "num_layers": 0}, "num_layers"),
        ({"in_dim": 4, "num_layers": 1, "low_rank": 0}, "low_rank"),
        ({"in_dim": 4, "num_layers": 1, "num_experts": 2}, "needs low_rank"),
    ],
)
def test_bad_config(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CrossNet(**kwargs)


def test_wrong_input_width() -> None:
    with pytest.raises(ValueError, match="D=4"):
        CrossNet(4, 1)(torch.randn(2, 5))
