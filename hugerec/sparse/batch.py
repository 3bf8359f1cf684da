"""Batch: what the loader yields and every model consumes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hugerec.sparse.features import SparseFeatures


@dataclass(frozen=True)
class Batch:
    """One training or scoring batch of B examples.

    dense  [B, Dd] float32 (Dd may be 0)
    sparse SparseFeatures over the same B examples
    labels [B] float32 (or [B, T] for T tasks)
    """

    dense: torch.Tensor
    sparse: SparseFeatures
    labels: torch.Tensor

    def __post_init__(self) -> None:
        b = self.labels.shape[0]
        if self.dense.dim() != 2 or self.dense.shape[0] != b:
            raise ValueError(f"Batch: dense must be [B={b}, Dd], got shape {tuple(self.dense.shape)}")
        if self.sparse.keys and self.sparse.batch_size != b:
            raise ValueError(f"Batch: sparse batch size {self.sparse.batch_size} != {b} labels")

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch(
            self.dense.to(device, non_blocking=non_blocking),
            self.sparse.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )
