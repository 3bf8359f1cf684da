"""SparseFeatures: F named id-list features over B examples, stored feature-major.

    keys ("user", "item"), B = 2:   user: [[7, 3], []]    item: [[1], [4, 5, 9]]
      values  = [7, 3, 1, 4, 5, 9]   # [N] int64
      lengths = [2, 0, 1, 3]         # [F * B] int32; offsets are derived, not stored twice
      weights = None or [N] float32  # per-id weights for weighted pooling
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hugerec.sparse.jagged import JaggedTensor, lengths_to_offsets, offsets_to_lengths

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True)
class SparseFeatures:
    """Variable-length id lists of F named features over B examples (feature-major)."""

    keys: tuple[str, ...]
    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.keys, tuple):
            object.__setattr__(self, "keys", tuple(self.keys))
        if len(set(self.keys)) != len(self.keys):
            dup = sorted({k for k in self.keys if self.keys.count(k) > 1})
            raise ValueError(f"SparseFeatures: duplicate feature names {dup}")
        if self.values.dim() != 1:
            raise ValueError(f"SparseFeatures: values must be 1-D [N], got shape {tuple(self.values.shape)}")
        if self.values.dtype != torch.int64:
            raise ValueError(f"SparseFeatures: values must be int64 ids, got dtype {self.values.dtype}")
        if self.lengths.dim() != 1 or self.lengths.dtype not in _INT_DTYPES:
            raise ValueError(
                f"SparseFeatures: lengths must be a 1-D integer tensor, got shape {tuple(self.lengths.shape)} "
                f"dtype {self.lengths.dtype}"
            )
        num_features = len(self.keys)
        if num_features == 0:
            if self.lengths.numel() or self.values.numel():
                raise ValueError("SparseFeatures: no keys but non-empty values/lengths")
        elif self.lengths.numel() % num_features:
            raise ValueError(
                f"SparseFeatures: {self.lengths.numel()} lengths is not a multiple of the {num_features} features"
            )
        total = int(self.lengths.sum()) if self.lengths.numel() else 0
        if total != self.values.numel():
            raise ValueError(f"SparseFeatures: lengths sum to {total} but there are {self.values.numel()} values")
        if self.lengths.numel() and int(self.lengths.min()) < 0:
            bad = int(torch.nonzero(self.lengths < 0)[0])
            f, b = divmod(bad, self.batch_size)
            raise ValueError(
                f"SparseFeatures: negative length {int(self.lengths[bad])} for feature {self.keys[f]!r}, example {b}"
            )
        if self.weights is not None and self.weights.shape != self.values.shape:
            raise ValueError(
                f"SparseFeatures: weights shape {tuple(self.weights.shape)} != values shape {tuple(self.values.shape)}"
            )

    # -- shape -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.lengths.numel() // len(self.keys) if self.keys else 0

    def offsets(self) -> torch.Tensor:
        """[F * B + 1] int64 offsets into `values`."""
        return lengths_to_offsets(self.lengths)

    def value_ranges(self) -> dict[str, tuple[int, int]]:
        """Feature name -> (start, end) slice of `values` holding that feature's ids."""
        b = self.batch_size
        per_feature = self.lengths.view(len(self.keys), b).sum(dim=1).tolist() if self.keys else []
        out: dict[str, tuple[int, int]] = {}
        start = 0
        for key, n in zip(self.keys, per_feature, strict=True):
            out[key] = (start, start + int(n))
            start += int(n)
        return out

    # -- access ------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> JaggedTensor:
        try:
            f = self.keys.index(key)
        except ValueError:
            raise KeyError(f"SparseFeatures: unknown feature {key!r}; have {list(self.keys)}") from None
        b = self.batch_size
        start, end = self.value_ranges()[key]
        w = None if self.weights is None else self.weights[start:end]
        return JaggedTensor(self.values[start:end], self.lengths[f * b : (f + 1) * b], w)

    def to_dict(self) -> dict[str, JaggedTensor]:
        return {k: self[k] for k in self.keys}

    def select(self, keys: Sequence[str]) -> SparseFeatures:
        """A SparseFeatures holding only `keys`, in that order."""
        return SparseFeatures.from_jagged({k: self[k] for k in keys}, batch_size=self.batch_size)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        w = None if self.weights is None else self.weights.to(device, non_blocking=non_blocking)
        return SparseFeatures(
            self.keys,
            self.values.to(device, non_blocking=non_blocking),
            self.lengths.to(device, non_blocking=non_blocking),
            w,
        )

    # -- constructors ------------------------------------------------------------------------
    @staticmethod
    def from_lists(
        features: Mapping[str, Sequence[Sequence[int]]],
        weights: Mapping[str, Sequence[Sequence[float]]] | None = None,
    ) -> SparseFeatures:
        """{"user": [[7, 3], []], "item": [[1], [4, 5, 9]]} -> SparseFeatures (B = 2)."""
        sizes = {k: len(v) for k, v in features.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"SparseFeatures.from_lists: features have different batch sizes {sizes}")
        if weights is not None and set(weights) != set(features):
            raise ValueError(
                f"SparseFeatures.from_lists: weights given for {sorted(weights)} but features are {sorted(features)}"
            )
        jagged = {
            k: JaggedTensor.from_lists(v, None if weights is None else weights[k]) for k, v in features.items()
        }
        return SparseFeatures.from_jagged(jagged, batch_size=next(iter(sizes.values()), 0))

    @staticmethod
    def from_offsets(
        keys: Sequence[str], values: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor | None = None
    ) -> SparseFeatures:
        """Feature-major `values` [N] with `offsets` [F * B + 1]."""
        return SparseFeatures(tuple(keys), values, offsets_to_lengths(offsets, "SparseFeatures.from_offsets"), weights)

    @staticmethod
    def from_dense(ids: Mapping[str, torch.Tensor], padding_value: int = -1) -> SparseFeatures:
        """Fixed-hotness ids: {"f": [B, L] tensor}, `padding_value` marks empty slots (HugeCTR style).

        A [B] tensor is taken as one id per example.
        """
        jagged = {}
        for k, t in ids.items():
            if t.dim() == 1:
                t = t.unsqueeze(1)
            jagged[k] = JaggedTensor.from_dense(t, padding_value)
        sizes = {k: j.batch_size for k, j in jagged.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"SparseFeatures.from_dense: features have different batch sizes {sizes}")
        return SparseFeatures.from_jagged(jagged, batch_size=next(iter(sizes.values()), 0))

    @staticmethod
    def from_jagged(features: Mapping[str, JaggedTensor], batch_size: int | None = None) -> SparseFeatures:
        keys = tuple(features)
        for k, j in features.items():
            if batch_size is None:
                batch_size = j.batch_size
            if j.batch_size != batch_size:
                raise ValueError(f"SparseFeatures: feature {k!r} has batch size {j.batch_size}, expected {batch_size}")
        if not keys:
            empty = torch.zeros(0, dtype=torch.int64)
            return SparseFeatures((), empty, empty.to(torch.int32))
        has_w = [j.weights is not None for j in features.values()]
        if any(has_w) and not all(has_w):
            raise ValueError("SparseFeatures: either every feature has weights or none has")
        values = torch.cat([j.values.to(torch.int64) for j in features.values()])
        lengths = torch.cat([j.lengths.to(torch.int32) for j in features.values()])
        weights = None
        if all(has_w):
            weights = torch.cat([j.weights for j in features.values() if j.weights is not None])
        return SparseFeatures(keys, values, lengths, weights)
