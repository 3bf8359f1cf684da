"""Feature interactions over stacked embeddings [B, F, D]: DLRM's pairwise dots and the FM term."""

from __future__ import annotations

import torch
from torch import nn

from hugerec.ops import dot_interaction


class DotInteraction(nn.Module):
    """DLRM's interaction arch: the dot product of every pair of the F vectors.

    [B, F, D] -> [B, F*(F-1)/2]   (pairs i < j: the strictly upper triangle of x x^T, row-major)
    [B, F, D] -> [B, F*(F+1)/2]   with `self_interaction` (i <= j: the diagonal |x_i|^2 too)

    fp32 on the CPU (eager) runs Numba kernels that compute only the pairs
    (`hugerec.ops.dot_interaction`); elsewhere a batched x x^T and a gather of its triangle.
    """

    def __init__(self, num_features: int, self_interaction: bool = False) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"DotInteraction: num_features must be a positive int, got {num_features!r}")
        if num_features == 1 and not self_interaction:
            raise ValueError("DotInteraction: one feature has no pairs; use self_interaction=True or more features")
        self.num_features = num_features
        self.self_interaction = self_interaction
        rows, cols = torch.triu_indices(num_features, num_features, offset=0 if self_interaction else 1)
        # flat positions in the [F, F] matrix; index_select on the flattened rows is one gather
        self.pair_index: torch.Tensor
        self.register_buffer("pair_index", rows * num_features + cols, persistent=False)
        self.out_dim = int(rows.numel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[1] != self.num_features:
            raise ValueError(f"DotInteraction: expected [B, F={self.num_features}, D], got shape {tuple(x.shape)}")
        if dot_interaction.kernel_applies(None, x) or dot_interaction.triton_path(None, x):
            return dot_interaction.dot_interaction(None, x, self.self_interaction)
        gram = torch.bmm(x, x.transpose(1, 2))  # [B, F, D] x [B, D, F] -> [B, F, F]
        return gram.flatten(1).index_select(1, self.pair_index)  # [B, F*F] -> [B, F*(F-1)/2]

    def forward_split(self, first: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
        """forward(cat([first [B, D] as vector 0, rest [B, F-1, D]])) without building the concatenation."""
        if (
            first.dim() != 2
            or rest.dim() != 3
            or rest.shape[1] + 1 != self.num_features
            or first.shape[1] != rest.shape[2]
        ):
            raise ValueError(
                f"DotInteraction: expected [B, D] and [B, F-1={self.num_features - 1}, D], got shapes "
                f"{tuple(first.shape)} and {tuple(rest.shape)}"
            )
        if dot_interaction.kernel_applies(first, rest) or dot_interaction.triton_path(first, rest):
            return dot_interaction.dot_interaction(first, rest, self.self_interaction)
        return self(torch.cat([first.unsqueeze(1), rest.to(first.dtype)], dim=1))


class FMInteraction(nn.Module):
    """Factorization machine's second-order term, sum over pairs i < j of <x_i, x_j>.

    [B, F, D] -> [B], in O(F*D) per example: 0.5 * sum_d((sum_f x)^2 - sum_f x^2)
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3:
            raise ValueError(f"FMInteraction: expected [B, F, D], got shape {tuple(x.shape)}")
        square_of_sum = x.sum(dim=1).square()  # [B, F, D] -> [B, D]
        sum_of_squares = x.square().sum(dim=1)  # [B, F, D] -> [B, D]
        return 0.5 * (square_of_sum - sum_of_squares).sum(dim=1)  # [B, D] -> [B]
