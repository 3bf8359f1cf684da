"""InferenceModel: parameter-server lookups + pooling + the exported dense program, for one model version.

    ModelInputs(dense [B, Dd], ids {feature: (values [N_f] int64, lengths [B] int32)})
      -> per table: unique ids [U] -> ps.lookup -> rows [U, D] -> embedding_bag -> [F_t * B, D]
      -> per collection: pooled [B, sum D] in the column order the model was trained with
      -> dense program (dense, *pooled) -> logits [B] (or [B, T])

The dense program and the embedding rows of one request always come from one parameter-server
snapshot, so a live update (new rows and new dense weights together) switches atomically.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hugerec.embedding.config import Pooling, TableConfig
from hugerec.serving.parameter_server import ParameterServer, TableUpdate

DenseProgram = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class CollectionLayout:
    """One embedding collection: its tables and the feature order of its pooled [B, sum D] block."""

    tables: tuple[TableConfig, ...]
    features: tuple[str, ...]

    def __post_init__(self) -> None:
        owner: dict[str, str] = {}
        for t in self.tables:
            if t.pooling is Pooling.NONE:
                raise ValueError(
                    f"CollectionLayout: table {t.name!r} has sequence outputs (pooling NONE); serving needs pooled tables"
                )
            for f in t.features:
                if f in owner:
                    raise ValueError(f"CollectionLayout: feature {f!r} is in tables {owner[f]!r} and {t.name!r}")
                owner[f] = t.name
        unknown = [f for f in self.features if f not in owner]
        if unknown or len(set(self.features)) != len(self.features):
            raise ValueError(
                f"CollectionLayout: features {list(self.features)} must be distinct features of the tables {owner}"
            )

    def table_of(self, feature: str) -> TableConfig:
        return next(t for t in self.tables if feature in t.features)

    def to_dict(self) -> dict[str, object]:
        return {"tables": [t.to_dict() for t in self.tables], "features": list(self.features)}

    @staticmethod
    def from_dict(d: Mapping[str, object]) -> CollectionLayout:
        tables = d.get("tables")
        features = d.get("features")
        if not isinstance(tables, list) or not isinstance(features, list):
            raise ValueError(f"CollectionLayout.from_dict: need lists 'tables' and 'features', got keys {sorted(d)}")
        return CollectionLayout(tuple(TableConfig.from_dict(t) for t in tables), tuple(features))


@dataclass(frozen=True, eq=False)
class ModelInputs:
    """B examples: dense [B, Dd] float32; per sparse feature (values [N_f] int64, lengths [B] int32)."""

    dense: np.ndarray
    ids: Mapping[str, tuple[np.ndarray, np.ndarray]]

    @property
    def batch_size(self) -> int:
        return int(self.dense.shape[0])

    @staticmethod
    def concat(parts: Sequence[ModelInputs]) -> ModelInputs:
        """Requests -> one batch (rows in order); `split` undoes it on the outputs."""
        if len(parts) == 1:
            return parts[0]
        dense = np.concatenate([p.dense for p in parts])
        ids = {
            f: (np.concatenate([p.ids[f][0] for p in parts]), np.concatenate([p.ids[f][1] for p in parts]))
            for f in parts[0].ids
        }
        return ModelInputs(dense, ids)


class InferenceModel:
    """Scores requests of one model version: lookups through `ps`, then the dense program.

    program     (dense [B, Dd], pooled_1 [B, sum D_1], ...) -> logits [B] or [B, T]; one pooled block per layout
    layouts     the embedding collections, in the order the program takes their blocks
    num_dense   Dd
    dense_keys  the program's state-dict keys that a dense update must carry (all of them by default);
                a key k of the trained model is `program_prefix + k` inside the program
    """

    def __init__(
        self,
        program: torch.nn.Module,
        layouts: Sequence[CollectionLayout],
        ps: ParameterServer,
        num_dense: int,
        dense_keys: Sequence[str] | None = None,
        program_prefix: str = "",
    ) -> None:
        self.layouts = tuple(layouts)
        self.dense_keys = tuple(program.state_dict()) if dense_keys is None else tuple(dense_keys)
        self.program_prefix = program_prefix
        self.ps = ps
        self.num_dense = num_dense
        self.device = ps.device
        features = [f for layout in self.layouts for f in layout.features]
        self.features = tuple(dict.fromkeys(features))  # a feature may feed several collections (wide and deep)
        missing = {t.name for layout in self.layouts for t in layout.tables} - set(ps.tables)
        if missing:
            raise ValueError(f"InferenceModel: the parameter server has no tables {sorted(missing)}")
        ps.publish_payload(program if self.device.type == "cpu" else program.to(self.device))

    def predict(self, inputs: ModelInputs) -> np.ndarray:
        """Logits [B] (or [B, T]) float32 for `inputs` (validated by the caller: see protocol.py)."""
        with self.ps.snapshot() as snap, torch.inference_mode():
            program = snap.payload
            assert isinstance(program, torch.nn.Module), "InferenceModel publishes its program at construction"
            pooled = [self._pool(snap.lookup, layout, inputs) for layout in self.layouts]
            dense = torch.from_numpy(inputs.dense).to(self.device)
            logits = program(dense, *pooled)
        return logits.float().cpu().numpy()

    def _pool(
        self, lookup: Callable[[str, np.ndarray], torch.Tensor], layout: CollectionLayout, inputs: ModelInputs
    ) -> torch.Tensor:
        b = inputs.batch_size
        blocks: dict[str, torch.Tensor] = {}
        for table in layout.tables:
            feats = [f for f in table.features if f in layout.features]
            if not feats:
                continue
            values = np.concatenate([inputs.ids[f][0] for f in feats])  # [N_t]
            lengths = np.concatenate([inputs.ids[f][1] for f in feats])  # [F_t * B]
            uniq, inverse = np.unique(values, return_inverse=True)
            rows = lookup(table.name, uniq)  # [U, D]
            offsets = np.zeros(lengths.shape[0], np.int64)
            np.cumsum(lengths[:-1], out=offsets[1:])
            mode = "mean" if table.pooling is Pooling.MEAN else "sum"
            pooled = F.embedding_bag(
                torch.from_numpy(inverse.astype(np.int64)).to(self.device),
                rows,
                torch.from_numpy(offsets).to(self.device),
                mode=mode,
            )  # [F_t * B, D]
            for i, f in enumerate(feats):
                blocks[f] = pooled[i * b : (i + 1) * b]
        return torch.cat([blocks[f] for f in layout.features], dim=1)  # [B, sum D]

    def update(
        self,
        tables: Sequence[TableUpdate],
        dense_state: Mapping[str, torch.Tensor] | None = None,
        meta: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """Apply new rows and (optionally) new dense weights as one atomic version switch.

        dense_state holds at least `dense_keys` (a whole model state dict works: other keys are ignored).
        """
        program = None if dense_state is None else self._program_with(dense_state)
        return self.ps.apply(tables, meta, payload=program)

    def _program_with(self, dense_state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        missing = [k for k in self.dense_keys if k not in dense_state]
        if missing:
            raise ValueError(f"InferenceModel.update: the dense weights lack {missing[:5]} ({len(missing)} keys)")
        with self.ps.snapshot() as snap:
            current = snap.payload
        assert isinstance(current, torch.nn.Module), "InferenceModel publishes its program at construction"
        with warnings.catch_warnings():  # torch's own pytree specs warn about a deprecation when copied
            warnings.simplefilter("ignore", FutureWarning)
            program = copy.deepcopy(current)
        target = program.state_dict()
        for k in self.dense_keys:
            value, into = dense_state[k], target[self.program_prefix + k]
            if not isinstance(value, torch.Tensor) or value.shape != into.shape:
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(
                    f"InferenceModel.update: dense weight {k!r} is {shape}, the program needs {tuple(into.shape)}"
                )
            if not torch.isfinite(value).all():
                raise ValueError(f"InferenceModel.update: dense weight {k!r} contains NaN or inf")
            with torch.no_grad():
                into.copy_(value)
        return program
