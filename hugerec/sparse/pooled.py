"""PooledEmbeddings: the output of an embedding collection, one [B, D_f] block per feature."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PooledEmbeddings:
    """Pooled vectors of F features, concatenated along columns.

    values [B, sum(dims)]; feature `keys[i]` occupies columns offset_i : offset_i + dims[i].
    """

    keys: tuple[str, ...]
    dims: tuple[int, ...]
    values: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.dims):
            raise ValueError(f"PooledEmbeddings: {len(self.keys)} keys but {len(self.dims)} dims")
        if self.values.dim() != 2 or self.values.shape[1] != sum(self.dims):
            raise ValueError(
                f"PooledEmbeddings: values shape {tuple(self.values.shape)} does not match dims sum {sum(self.dims)}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.values.shape[0])

    def column_offsets(self) -> list[int]:
        out, start = [], 0
        for d in self.dims:
            out.append(start)
            start += d
        return out

    def __getitem__(self, key: str) -> torch.Tensor:
        """[B, D] view of one feature."""
        try:
            i = self.keys.index(key)
        except ValueError:
            raise KeyError(f"PooledEmbeddings: unknown feature {key!r}; have {list(self.keys)}") from None
        start = self.column_offsets()[i]
        return self.values[:, start : start + self.dims[i]]

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {k: self[k] for k in self.keys}

    def stacked(self) -> torch.Tensor:
        """[B, F, D] when every feature has the same D (DLRM's interaction input)."""
        if len(set(self.dims)) > 1:
            raise ValueError(f"PooledEmbeddings.stacked: features have different dims {dict(zip(self.keys, self.dims, strict=True))}")
        d = self.dims[0] if self.dims else 0
        return self.values.view(self.batch_size, len(self.keys), d)  # [B, sum D] -> [B, F, D]
