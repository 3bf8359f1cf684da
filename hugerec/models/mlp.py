"""MLP: the dense arch / over arch / deep tower of every model.

MLP(13, [512, 256, 64])                     tower:       13 -> 512 -> 256 -> 64
MLP(64, [256] * 3)                          equal width: 64 -> 256 -> 256 -> 256
MLP(415, [1024, 512, 1], final_activation=False)   last layer is a logit
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch
from torch import nn


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    TANH = "tanh"
    SIGMOID = "sigmoid"

    def module(self) -> nn.Module:
        match self:
            case Activation.RELU:
                return nn.ReLU()
            case Activation.GELU:
                return nn.GELU()
            case Activation.SILU:
                return nn.SiLU()
            case Activation.TANH:
                return nn.Tanh()
            case Activation.SIGMOID:
                return nn.Sigmoid()


def check_dims(where: str, dims: Sequence[int], allow_empty: bool = False) -> tuple[int, ...]:
    """Layer widths as a tuple of positive ints; ValueError naming `where` otherwise."""
    out = tuple(dims)
    if not out and not allow_empty:
        raise ValueError(f"{where}: needs at least one layer width, got {list(out)}")
    for d in out:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise ValueError(f"{where}: layer widths must be positive ints, got {list(out)}")
    return out


class MLP(nn.Module):
    """Linear -> activation (-> dropout) per layer.  [B, in_dim] -> [B, dims[-1]].

    in_dim            input width
    dims              output width of each layer (a tower or equal widths)
    activation        Activation after every layer (and after the last only if `final_activation`)
    dropout           drop probability after each hidden activation (never after the last layer)
    final_activation  False when the last layer produces logits or feeds a residual
    """

    def __init__(
        self,
        in_dim: int,
        dims: Sequence[int],
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
        final_activation: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(in_dim, bool) or not isinstance(in_dim, int) or in_dim <= 0:
            raise ValueError(f"MLP: in_dim must be a positive int, got {in_dim!r}")
        widths = check_dims("MLP", dims)
        if not isinstance(activation, Activation):
            raise ValueError(f"MLP: activation must be an Activation, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP: dropout must be in [0, 1), got {dropout}")
        self.in_dim = in_dim
        self.out_dim = widths[-1]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip((in_dim, *widths[:-1]), widths, strict=True)):
            layers.append(nn.Linear(d_in, d_out))
            last = i == len(widths) - 1
            if not last or final_activation:
                layers.append(activation.module())
            if not last and dropout > 0:
                layers.append(nn.Dropout(dropout))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
