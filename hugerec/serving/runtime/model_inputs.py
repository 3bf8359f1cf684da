"""ModelInputs: one request's (or one batch's) examples as every served model takes them.

    ModelInputs(dense [B, Dd] float32, ids {feature: (values [N_f] int64, lengths [B] int32)}, one_id, vectors)

Decoders make them (inference_protocol.py from KServe v2 tensors, request_preprocessor.py from /predict
rows, a pipeline's Score stage with `from_one_id`), the batcher concatenates them, and InferenceModel,
GBMModel and NextItemsModel read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class ModelInputs:
    """B examples: dense [B, Dd] float32; per sparse feature (values [N_f] int64, lengths [B] int32).

    one_id [F, B] int64, when every feature has exactly one id per example: row k holds the ids of
    the k-th feature of `ids` (whose values are views of it). Merging and lookups then work on the
    block instead of feature by feature (see `from_one_id`).
    """

    dense: np.ndarray
    ids: Mapping[str, tuple[np.ndarray, np.ndarray]]
    one_id: np.ndarray | None = None
    # inline vector features: name -> [B, dim] float32; a row of NaN means "look it up by its id"
    vectors: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])

    @staticmethod
    def from_one_id(dense: np.ndarray, features: Sequence[str], one_id: np.ndarray) -> ModelInputs:
        """Inputs whose feature features[k] has the one id one_id[k, b] in example b."""
        if one_id.ndim != 2 or one_id.shape != (len(features), dense.shape[0]) or one_id.dtype != np.int64:
            raise ValueError(
                f"ModelInputs.from_one_id: need int64 ids [{len(features)}, {dense.shape[0]}], got "
                f"{one_id.dtype} {list(one_id.shape)}"
            )
        return ModelInputs(dense, _OneIdFeatures(tuple(features), one_id), one_id)

    def rows(self, start: int, stop: int) -> ModelInputs:
        """Examples start..stop-1 (views where the layout allows)."""
        vectors = {k: v[start:stop] for k, v in self.vectors.items()}
        if self.one_id is not None and isinstance(self.ids, _OneIdFeatures):
            part = ModelInputs.from_one_id(self.dense[start:stop], self.ids.names, self.one_id[:, start:stop])
            return dataclasses.replace(part, vectors=vectors)
        ids = {}
        for f in self.ids:
            values, lengths = self.ids[f]
            offsets = np.zeros(len(lengths) + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            ids[f] = (values[offsets[start] : offsets[stop]], lengths[start:stop])
        return ModelInputs(self.dense[start:stop], ids, vectors=vectors)

    @staticmethod
    def concat(parts: Sequence[ModelInputs]) -> ModelInputs:
        """Requests -> one batch (rows in order)."""
        if len(parts) == 1:
            return parts[0]
        dense = np.concatenate([p.dense for p in parts])
        vectors = _concat_vectors(parts)
        features = tuple(parts[0].ids)
        if all(p.one_id is not None and isinstance(p.ids, _OneIdFeatures) and p.ids.names == features for p in parts):
            blocks = [p.one_id for p in parts if p.one_id is not None]
            merged = ModelInputs.from_one_id(dense, features, np.concatenate(blocks, axis=1))  # [F, sum B]
            return dataclasses.replace(merged, vectors=vectors)
        ids = {
            f: (np.concatenate([p.ids[f][0] for p in parts]), np.concatenate([p.ids[f][1] for p in parts]))
            for f in features
        }
        return ModelInputs(dense, ids, vectors=vectors)


def _concat_vectors(parts: Sequence[ModelInputs]) -> dict[str, np.ndarray]:
    """Inline vectors of merged requests: a request without one gets NaN rows (looked up by id)."""
    out = {}
    for name in dict.fromkeys(n for p in parts for n in p.vectors):
        dim = next(p.vectors[name].shape[1] for p in parts if name in p.vectors)
        out[name] = np.concatenate(
            [p.vectors[name] if name in p.vectors else np.full((p.batch_size, dim), np.nan, np.float32) for p in parts]
        )
    return out


class _OneIdFeatures(Mapping[str, tuple[np.ndarray, np.ndarray]]):
    """`ids` of ModelInputs.from_one_id: feature names[k] -> (one_id[k], ones [B]), made when asked for
    (merging and pooling read the block itself: a request's decoding builds no per-feature entries)."""

    def __init__(self, names: tuple[str, ...], one_id: np.ndarray) -> None:
        self.names = names
        self._one_id = one_id
        self._row: dict[str, int] | None = None

    def __getitem__(self, feature: str) -> tuple[np.ndarray, np.ndarray]:
        if self._row is None:
            self._row = {f: k for k, f in enumerate(self.names)}
        return self._one_id[self._row[feature]], np.ones(self._one_id.shape[1], np.int32)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

