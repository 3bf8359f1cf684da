"""JaggedTensor: one variable-length id list (or vector list) per example.

    B = 3:   [[7, 3], [], [5]]
      values  = [7, 3, 5]      # [N] (or [N, D] for embedded sequences)
      lengths = [2, 0, 1]      # [B] int32
      offsets = [0, 2, 2, 3]   # [B + 1] int64, derived from lengths
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """[K] lengths -> [K + 1] int64 offsets starting at 0."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    # in int64: torch's cumsum of int32 into an int64 output takes a slow scalar path
    torch.cumsum(lengths.to(torch.int64), dim=0, out=offsets[1:])
    return offsets


def offsets_to_lengths(offsets: torch.Tensor, where: str = "offsets") -> torch.Tensor:
    """[K + 1] offsets -> [K] int32 lengths; raises if offsets decrease or do not start at 0."""
    if offsets.dim() != 1 or offsets.numel() == 0:
        raise ValueError(f"{where}: expected a 1-D tensor of K + 1 offsets, got shape {tuple(offsets.shape)}")
    if int(offsets[0]) != 0:
        raise ValueError(f"{where}: offsets must start at 0, got {int(offsets[0])}")
    lengths = offsets[1:] - offsets[:-1]
    if lengths.numel() and int(lengths.min()) < 0:
        bad = int(torch.nonzero(lengths < 0)[0])
        raise ValueError(f"{where}: offsets decrease at position {bad} ({int(offsets[bad])} -> {int(offsets[bad + 1])})")
    return lengths.to(torch.int32)


@dataclass(frozen=True)
class JaggedTensor:
    """Variable-length lists over B examples; `values` is [N] ids or [N, D] vectors."""

    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.lengths.dim() != 1:
            raise ValueError(f"JaggedTensor: lengths must be 1-D, got shape {tuple(self.lengths.shape)}")
        total = int(self.lengths.sum()) if self.lengths.numel() else 0
        if total != self.values.shape[0]:
            raise ValueError(f"JaggedTensor: lengths sum to {total} but there are {self.values.shape[0]} values")
        if self.weights is not None and self.weights.shape[0] != self.values.shape[0]:
            raise ValueError(
                f"JaggedTensor: {self.weights.shape[0]} weights for {self.values.shape[0]} values"
            )

    @property
    def batch_size(self) -> int:
        return int(self.lengths.numel())

    def offsets(self) -> torch.Tensor:
        return lengths_to_offsets(self.lengths)

    @staticmethod
    def from_lists(lists: Sequence[Sequence[int]], weights: Sequence[Sequence[float]] | None = None) -> JaggedTensor:
        values = torch.tensor([v for row in lists for v in row], dtype=torch.int64)
        lengths = torch.tensor([len(row) for row in lists], dtype=torch.int32)
        w = None
        if weights is not None:
            w = torch.tensor([x for row in weights for x in row], dtype=torch.float32)
        return JaggedTensor(values, lengths, w)

    @staticmethod
    def from_offsets(values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None = None) -> JaggedTensor:
        return JaggedTensor(values, offsets_to_lengths(offsets), weights)

    @staticmethod
    def from_dense(ids: torch.Tensor, padding_value: int = -1) -> JaggedTensor:
        """[B, L] ids with `padding_value` marking empty slots -> jagged (order kept)."""
        if ids.dim() != 2:
            raise ValueError(f"JaggedTensor.from_dense: expected [B, L] ids, got shape {tuple(ids.shape)}")
        mask = ids != padding_value  # [B, L]
        return JaggedTensor(ids[mask].to(torch.int64), mask.sum(dim=1).to(torch.int32))

    def to_padded(self, max_len: int | None = None, padding_value: float = 0) -> torch.Tensor:
        """-> [B, L, ...] padded with `padding_value`, L = max length (or `max_len`, truncating)."""
        b = self.batch_size
        lmax = int(self.lengths.max()) if b and self.values.shape[0] else 0
        length = lmax if max_len is None else max_len
        out = torch.full((b, length, *self.values.shape[1:]), padding_value, dtype=self.values.dtype, device=self.values.device)
        if b == 0 or length == 0:
            return out
        offsets = self.offsets()
        pos = torch.arange(self.values.shape[0], device=self.values.device) - torch.repeat_interleave(
            offsets[:-1], self.lengths.to(torch.int64)
        )  # [N] position inside its list
        row = torch.repeat_interleave(torch.arange(b, device=self.values.device), self.lengths.to(torch.int64))
        keep = pos < length
        out[row[keep], pos[keep]] = self.values[keep]
        return out

    def to_lists(self) -> list[list[int]]:
        offsets = self.offsets().tolist()
        vals = self.values.tolist()
        return [vals[offsets[i] : offsets[i + 1]] for i in range(self.batch_size)]

    def to(self, device: torch.device | str) -> JaggedTensor:
        w = None if self.weights is None else self.weights.to(device)
        return JaggedTensor(self.values.to(device), self.lengths.to(device), w)
