"""DCN-v2's cross network (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network").

Every layer crosses the current vector with the input x0, keeping a residual:

    full rank (W: [D, D]):        x_{l+1} = x0 * (W x_l + b) + x_l
    low rank (U: [D, r], V: [D, r]):  x_{l+1} = x0 * (U V^T x_l + b) + x_l
    mixture of K low-rank experts:    x_{l+1} = sum_k G_k(x_l) * x0 * (U_k g(C_k g(V_k^T x_l)) + b) + x_l
                                      with gates G = softmax(x_l W_g), g = ReLU
"""

from __future__ import annotations

import math

import torch
from torch import nn


class CrossNet(nn.Module):
    """[B, D] -> [B, D] through `num_layers` cross layers.

    low_rank     None: full-rank W per layer; r: W = U V^T with r << D (cheaper, as the paper's Fig. 5 suggests)
    num_experts  K > 1 mixes K low-rank experts per layer with a softmax gate (needs low_rank)
    """

    def __init__(self, in_dim: int, num_layers: int, low_rank: int | None = None, num_experts: int = 1) -> None:
        super().__init__()
        for name, v in (("in_dim", in_dim), ("num_layers", num_layers), ("num_experts", num_experts)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"CrossNet: {name} must be a positive int, got {v!r}")
        if low_rank is not None and (isinstance(low_rank, bool) or not isinstance(low_rank, int) or low_rank <= 0):
            raise ValueError(f"CrossNet: low_rank must be None or a positive int, got {low_rank!r}")
        if num_experts > 1 and low_rank is None:
            raise ValueError(f"CrossNet: num_experts={num_experts} needs low_rank (experts are low-rank)")
        self.in_dim = in_dim
        self.num_layers = num_layers
        self.low_rank = low_rank
        self.num_experts = num_experts
        self.layers = nn.ModuleList()
        for _ in range(num_layers):
            if low_rank is None:
                self.layers.append(nn.Linear(in_dim, in_dim))
            elif num_experts == 1:
                self.layers.append(nn.Sequential(nn.Linear(in_dim, low_rank, bias=False), nn.Linear(low_rank, in_dim)))
            else:
                self.layers.append(_MixtureLayer(in_dim, low_rank, num_experts))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        if x0.dim() != 2 or x0.shape[1] != self.in_dim:
            raise ValueError(f"CrossNet: expected [B, D={self.in_dim}], got shape {tuple(x0.shape)}")
        x = x0
        for layer in self.layers:
            x = layer(x, x0) if isinstance(layer, _MixtureLayer) else x0 * layer(x) + x
        return x


class _MixtureLayer(nn.Module):
    """One mixture-of-low-rank-experts cross layer: (x_l [B, D], x0 [B, D]) -> x_{l+1} [B, D]."""

    def __init__(self, in_dim: int, rank: int, num_experts: int) -> None:
        super().__init__()
        self.v = nn.Parameter(torch.empty(num_experts, in_dim, rank))
        self.c = nn.Parameter(torch.empty(num_experts, rank, rank))
        self.u = nn.Parameter(torch.empty(num_experts, rank, in_dim))
        self.bias = nn.Parameter(torch.zeros(in_dim))
        self.gate = nn.Linear(in_dim, num_experts, bias=False)
        for w in (self.v, self.c, self.u):
            # per expert, the same scale nn.Linear's default init gives a [fan_in -> fan_out] map
            bound = 1.0 / math.sqrt(w.shape[1])
            nn.init.uniform_(w, -bound, bound)

    def forward(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.einsum("bd,kdr->bkr", x, self.v))  # [B, D] -> [B, K, r]
        h = torch.relu(torch.einsum("bkr,krs->bks", h, self.c))  # [B, K, r] -> [B, K, r]
        experts = x0.unsqueeze(1) * (torch.einsum("bkr,krd->bkd", h, self.u) + self.bias)  # -> [B, K, D]
        gates = torch.softmax(self.gate(x), dim=1).unsqueeze(2)  # [B, K] -> [B, K, 1]
        return (gates * experts).sum(dim=1) + x  # [B, K, D] -> [B, D]
