"""InferenceModel: parameter-server lookups + pooling + the exported dense program, for one model version.

    ModelInputs(dense [B, Dd], ids {feature: (values [N_f] int64, lengths [B] int32)})
      -> per group of tables with one width and pooling: ps lookup of every id -> rows [N_g, D]
         -> embedding_bag -> [F_g, B, D]     (Criteo's 26 tables of one width: one group, one lookup)
      -> per collection: pooled [B, sum D] in the column order the model was trained with
      -> dense program (dense, *pooled) -> logits [B] (or [B, T])

The dense program and the embedding rows of one request always come from one parameter-server
snapshot, so a live update (new rows and new dense weights together) switches atomically.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.serving.runtime.inference_protocol import Signature
from hugerec.serving.runtime.model_inputs import ModelInputs
from hugerec.serving.runtime.program import ServedProgram, compile_program
from hugerec.serving.store.parameter_server import ParameterServer, Snapshot, TableUpdate


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


@dataclass(frozen=True)
class _Group:
    """Features of one collection whose tables share width and pooling: looked up and pooled together."""

    tables: tuple[str, ...]
    features: tuple[str, ...]  # in the collection's column order
    table_index: np.ndarray  # [F_g] position in `tables` of each feature's table
    mode: str  # embedding_bag mode


def _groups(layout: CollectionLayout) -> tuple[_Group, ...]:
    keyed: dict[tuple[int, Pooling], list[str]] = {}
    for f in layout.features:
        t = layout.table_of(f)
        keyed.setdefault((t.dim, t.pooling), []).append(f)
    groups = []
    for (_, pooling), features in keyed.items():
        tables = tuple(dict.fromkeys(layout.table_of(f).name for f in features))
        index = np.array([tables.index(layout.table_of(f).name) for f in features], np.int64)
        groups.append(_Group(tables, tuple(features), index, "mean" if pooling is Pooling.MEAN else "sum"))
    return tuple(groups)


@dataclass(frozen=True)
class VectorInput:
    """A vector feature the model reads from a frozen table (`hugerec.models.vector_features`), which a request
    may also send inline as `vector.<name>` FP32 [B, dim]; normalised as the table's rows were."""

    name: str
    table: str
    feature: str
    dim: int
    normalize: str = "l2"


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
        vectors: Sequence[VectorInput] = (),
    ) -> None:
        self.layouts = tuple(layouts)
        self.vectors = tuple(vectors)
        # per inline vector: (its collection's index, the column of its block in that collection's pooled output)
        self._vector_at: dict[str, tuple[int, int]] = {}
        for v in self.vectors:
            at = [(i, layout) for i, layout in enumerate(self.layouts) if v.table in {t.name for t in layout.tables}]
            if len(at) != 1 or at[0][1].table_of(v.feature).name != v.table:
                raise ValueError(f"InferenceModel: vector input {v.name!r}: no collection holds table {v.table!r}")
            i, layout = at[0]
            column = sum(layout.table_of(f).dim for f in layout.features[: layout.features.index(v.feature)])
            self._vector_at[v.name] = (i, column)
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
        self._groups = tuple(_groups(layout) for layout in self.layouts)
        self._widths = (num_dense, *(sum(layout.table_of(f).dim for f in layout.features) for layout in self.layouts))
        on_device = program if self.device.type == "cpu" else program.to(self.device)
        ps.publish_payload(compile_program(on_device, self._widths, self.device))

    def signature(self, max_rows: int) -> Signature:
        """What a request may send: the dense width, the sparse features, optional inline vectors."""
        return Signature(self.num_dense, self.features, max_rows, vectors=self.vector_signature)

    def predict(self, inputs: ModelInputs) -> np.ndarray:
        """Logits [B] (or [B, T]) float32 for `inputs` (validated by the caller: see inference_protocol.py)."""
        with self.ps.snapshot() as snap, torch.inference_mode():
            program = snap.payload
            assert isinstance(program, ServedProgram), "InferenceModel publishes its program at construction"
            pooled = [
                self._pool(snap, groups, layout, inputs)
                for groups, layout in zip(self._groups, self.layouts, strict=True)
            ]
            if inputs.vectors:
                self._inline_vectors(pooled, inputs.vectors)
            dense = torch.from_numpy(inputs.dense).to(self.device)
            logits = program.run(dense, *pooled)
        return logits.float().cpu().numpy()

    @property
    def vector_signature(self) -> tuple[tuple[str, int], ...]:
        """(name, dim) of the vectors a request may send inline."""
        return tuple((v.name, v.dim) for v in self.vectors)

    def _inline_vectors(self, pooled: list[torch.Tensor], vectors: Mapping[str, np.ndarray]) -> None:
        """Rows of `vectors` that are not NaN replace the looked-up rows: [vector (normalised), flag 0]."""
        for v in self.vectors:
            given = vectors.get(v.name)
            if given is None:
                continue
            rows = ~np.isnan(given[:, 0])
            values = given[rows]
            if v.normalize == "l2":
                values = values / np.maximum(np.linalg.norm(values, axis=1, keepdims=True), 1e-12)
            i, column = self._vector_at[v.name]
            index = torch.from_numpy(np.flatnonzero(rows)).to(self.device)
            block = torch.cat([torch.from_numpy(values), torch.zeros(values.shape[0], 1)], dim=1)  # [n, dim + 1]
            pooled[i][index, column : column + v.dim + 1] = block.to(self.device, pooled[i].dtype)

    def _pool(
        self, snap: Snapshot, groups: tuple[_Group, ...], layout: CollectionLayout, inputs: ModelInputs
    ) -> torch.Tensor:
        """[B, sum D] pooled block of one collection: one parameter-server lookup and one embedding_bag per group."""
        b = inputs.batch_size
        pooled = []
        row_of = {f: k for k, f in enumerate(inputs.ids)} if inputs.one_id is not None else {}
        for g in groups:
            if inputs.one_id is not None:  # one id per bag: its sum and its mean are its row
                keys = inputs.one_id[[row_of[f] for f in g.features]].reshape(-1)  # [F_g, B] -> [F_g * B]
                bags = snap.lookup_group(g.tables, np.repeat(g.table_index, b), keys)
                pooled.append(bags.view(len(g.features), b, -1))  # -> [F_g, B, D]
                continue
            values = [inputs.ids[f][0] for f in g.features]
            keys = np.concatenate(values)  # [N_g], feature-major
            lengths = np.concatenate([inputs.ids[f][1] for f in g.features])  # [F_g * B]
            table_index = np.repeat(g.table_index, [v.shape[0] for v in values])  # [N_g]
            rows = snap.lookup_group(g.tables, table_index, keys)  # [N_g, D]
            if keys.shape[0] == lengths.shape[0] and (lengths == 1).all():
                bags = rows
            else:
                offsets = np.zeros(lengths.shape[0], np.int64)
                np.cumsum(lengths[:-1], out=offsets[1:])
                bags = F.embedding_bag(
                    torch.arange(keys.shape[0], device=self.device),
                    rows,
                    torch.from_numpy(offsets).to(self.device),
                    mode=g.mode,
                )  # [F_g * B, D]
            pooled.append(bags.view(len(g.features), b, -1))  # -> [F_g, B, D]
        if len(groups) == 1 and groups[0].features == layout.features:
            return pooled[0].transpose(0, 1).reshape(b, -1)  # [F, B, D] -> [B, F * D]
        where = {f: (i, j) for i, g in enumerate(groups) for j, f in enumerate(g.features)}
        return torch.cat([pooled[where[f][0]][where[f][1]] for f in layout.features], dim=1)  # [B, sum D]

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

    def _program_with(self, dense_state: Mapping[str, torch.Tensor]) -> ServedProgram:
        return compile_program(self.program_with(dense_state), self._widths, self.device)

    def program_with(self, dense_state: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        """A copy of the dense program now served, with `dense_state`'s weights (checked: every dense key,
        shapes, finite values); the served program is not changed."""
        missing = [k for k in self.dense_keys if k not in dense_state]
        if missing:
            raise ValueError(f"InferenceModel.update: the dense weights lack {missing[:5]} ({len(missing)} keys)")
        with self.ps.snapshot() as snap:
            current = snap.payload
        assert isinstance(current, ServedProgram), "InferenceModel publishes its program at construction"
        with warnings.catch_warnings():  # torch's own pytree specs warn about a deprecation when copied
            warnings.simplefilter("ignore", FutureWarning)
            program = copy.deepcopy(current.module)
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
