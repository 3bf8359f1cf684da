"""Vector features: pretrained vectors (image, text) as model inputs, each normalised on its own.

    VectorFeature("item_text", feature="item_id", dim=32)   # config: a 32-long vector per item id
    arch = VectorArch([feature], num_rows={"item_id": 1682}, out_dim=16)
    arch.load_rows("item_text", rows)                        # [1682, 33] from VectorTable.aligned
    pooled = arch.lookup(sparse)                             # [B, 33] (eager: an embedding lookup)
    arch(pooled)                                             # [[B, 16]]: LayerNorm, then Linear

Each vector feature is a table of the `VectorArch`'s own EmbeddingCollection, looked up by an id
feature the batch already has (one id per example), with rows [vector (dim), missing flag] and no
optimizer step unless `trainable`: a frozen embedding table. Serving therefore needs nothing new:
export writes its rows like any table's, and the dense program receives them as a pooled input.

In the dense part, following the SIGIR eCommerce practitioners' finding, each vector goes through a
LayerNorm of its own before it meets the other features (`layer_norm`), then a Linear to `out_dim`
(the model's interaction width) that also reads the missing flag. L2 normalisation is a property of
the rows (`VectorTable.l2_normalized` when they are built), so raw and normalised vectors are the
same module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import Pooling, TableConfig, Zeros
from hugerec.sparse.features import SparseFeatures


@dataclass(frozen=True)
class VectorFeature:
    """One vector input: `dim` floats per id of the id feature `feature` (config as data).

    path, id_column, vector_column  where the CLI reads the side table (`VectorTable.read`)
    normalize                       "l2" (default) or "none": applied to the rows when they are built
    layer_norm                      a LayerNorm over the vector before the projection
    trainable                       fine-tune the rows with the sparse optimizer (default: frozen)
    """

    name: str  # the vector's name (an identifier; served requests may send it inline as vector.<name>)
    feature: str  # the id feature that keys it (one id per example)
    dim: int  # floats per vector
    path: str = ""
    id_column: str = "id"
    vector_column: str = "vector"
    normalize: str = "l2"
    layer_norm: bool = True
    trainable: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.name.isidentifier():
            raise ValueError(f"VectorFeature: name must be an identifier, got {self.name!r}")
        if not self.feature:
            raise ValueError(f"VectorFeature {self.name!r}: feature (the id feature that keys it) is empty")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise ValueError(f"VectorFeature {self.name!r}: dim must be an int >= 1, got {self.dim!r}")
        if self.normalize not in ("l2", "none"):
            raise ValueError(f"VectorFeature {self.name!r}: normalize must be 'l2' or 'none', got {self.normalize!r}")

    @property
    def table(self) -> str:
        """Its table in the VectorArch's collection."""
        return f"vector_{self.name}"


def vector_features(values: Sequence[object], where: str) -> tuple[VectorFeature, ...]:
    """A config's `vectors`: VectorFeature or their dicts (TOML's [[model.vectors]]) -> a tuple, errors naming `where`."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, VectorFeature):
            out.append(v)
            continue
        if not isinstance(v, dict):
            raise ValueError(f"{where}: vectors[{i}] must be a table of keys (name, feature, dim, ...), got {v!r}")
        known = [f.name for f in dataclasses.fields(VectorFeature)]
        unknown = sorted(set(v) - set(known))
        if unknown:
            raise ValueError(f"{where}: vectors[{i}]: unknown keys {unknown}; valid keys are {known}")
        try:
            out.append(VectorFeature(**v))
        except TypeError as e:
            raise ValueError(f"{where}: vectors[{i}]: {e}") from None
    return tuple(out)


class VectorArch(nn.Module):
    """The vector features of a model: their frozen tables and, per feature, LayerNorm + Linear."""

    def __init__(
        self,
        features: Sequence[VectorFeature],
        num_rows: Mapping[str, int],
        out_dim: int,
        optimizer: Optimizer | None = None,
    ) -> None:
        super().__init__()
        if not features:
            raise ValueError("VectorArch: no vector features")
        names = [f.name for f in features]
        if len(set(names)) != len(names):
            raise ValueError(f"VectorArch: vector feature names must be distinct, got {names}")
        missing = [f.feature for f in features if f.feature not in num_rows]
        if missing:
            raise ValueError(f"VectorArch: id features {missing} have no table (known: {sorted(num_rows)})")
        if out_dim < 1:
            raise ValueError(f"VectorArch: out_dim must be >= 1, got {out_dim}")
        self.features = tuple(features)
        self.out_dim = out_dim
        tables = [
            TableConfig(
                f.table,
                num_rows=num_rows[f.feature],
                dim=f.dim + 1,  # the vector, then its missing flag
                features=(f.feature,),
                pooling=Pooling.SUM,
                init=Zeros(),
                optimizer=(optimizer or RowWiseAdagrad()) if f.trainable else SGD(lr=0.0),
            )
            for f in self.features
        ]
        self.collection = EmbeddingCollection(tables)
        self.norms = nn.ModuleList([nn.LayerNorm(f.dim) if f.layer_norm else nn.Identity() for f in self.features])
        self.projections = nn.ModuleList([nn.Linear(f.dim + 1, out_dim) for f in self.features])

    @property
    def trainable(self) -> bool:
        return any(f.trainable for f in self.features)

    def load_rows(self, name: str, rows: torch.Tensor | np.ndarray) -> None:
        """Set feature `name`'s table to `rows` [num_rows, dim + 1] (e.g. `VectorTable.aligned`)."""
        f = next((f for f in self.features if f.name == name), None)
        if f is None:
            raise ValueError(f"VectorArch: no vector feature {name!r} (have {[g.name for g in self.features]})")
        values = torch.as_tensor(rows, dtype=torch.float32)
        want = tuple(self.collection.table_weight(f.table).shape)
        if tuple(values.shape) != want:
            raise ValueError(f"VectorArch: rows of {name!r} must be {list(want)}, got {list(values.shape)}")
        self.collection.write_rows(f.table, torch.arange(want[0]), values)

    def lookup(self, sparse: SparseFeatures) -> torch.Tensor:
        """[B, sum(dim + 1)] rows of every vector feature (eager; frozen tables take no gradient)."""
        sparse = sparse.select(list(dict.fromkeys(f.feature for f in self.features)))
        for f in self.features:
            lengths = sparse[f.feature].lengths
            if lengths.numel() and bool((lengths != 1).any()):
                raise ValueError(
                    f"VectorArch: feature {f.feature!r} keys vector {f.name!r} and must hold exactly one id per "
                    "example; some examples have none or several"
                )
        if self.trainable:
            out: torch.Tensor = self.collection(sparse).values
            return out
        with torch.no_grad():
            frozen: torch.Tensor = self.collection(sparse).values
        return frozen

    def forward(self, pooled: torch.Tensor) -> list[torch.Tensor]:
        """pooled [B, sum(dim + 1)] -> per feature [B, out_dim]."""
        out = []
        start = 0
        for f, norm, proj in zip(self.features, self.norms, self.projections, strict=True):
            vector = pooled[:, start : start + f.dim]  # [B, dim]
            flag = pooled[:, start + f.dim : start + f.dim + 1]  # [B, 1]
            out.append(proj(torch.cat([norm(vector), flag], dim=1)))  # [B, dim + 1] -> [B, out_dim]
            start += f.dim + 1
        return out
