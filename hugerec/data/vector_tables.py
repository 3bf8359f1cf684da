"""Vector side tables: pretrained vectors (an image or text embedding per item) keyed by a raw id.

    table = VectorTable.read("item_vectors.parquet", id_column="item_id", vector_column="vec", dim=32)
    table = table.l2_normalized()                      # the practitioners' default for such vectors
    codes = encode_ids(workflow, "item_id", table.ids) # the side table's ids as the model sees them
    rows = table.aligned(codes, num_rows)              # [num_rows, dim + 1]: row = the vector of that id

Models read the aligned rows as a frozen embedding table (`hugerec.models.vector_features`), so a batch
gathers its rows by the id feature it already has: vectors are never copied per example, and the
bundle serves them like any embedding table. The last column of an aligned row is the missing flag:
1 for an id without a vector (its vector part is zeros), 0 otherwise.

Sources: a Parquet file with an id column and a fixed-length float list column, or a `.npz` file
holding `ids` [K] and `vectors` [K, D]. Bad input is refused with the file and the row: a vector of
another length, NaN or infinity inside a vector, a null id or vector, a duplicate id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
from torch import nn

from hugerec.data.preprocess.categorical import FIRST_VOCAB_ID, Categorify, HashBucket
from hugerec.data.preprocess.workflow import Workflow
from hugerec.models.vector_features import VectorArch

MISSING_FLAG = 1.0  # the flag column of an aligned row whose id has no vector


@dataclass(frozen=True)
class VectorTable:
    """K vectors of length D with their raw ids (ids distinct, vectors finite fp32)."""

    ids: pl.Series  # [K] raw ids (integers or strings, as in the data)
    vectors: np.ndarray  # [K, D] float32
    source: str = "<memory>"

    def __post_init__(self) -> None:
        v = self.vectors
        if v.ndim != 2 or v.dtype != np.float32:
            raise ValueError(f"VectorTable {self.source}: vectors must be float32 [K, D], got {v.dtype} {v.shape}")
        if len(self.ids) != v.shape[0]:
            raise ValueError(f"VectorTable {self.source}: {len(self.ids)} ids for {v.shape[0]} vectors")
        if self.ids.null_count():
            row = int(np.flatnonzero(self.ids.is_null().to_numpy())[0])
            raise ValueError(f"VectorTable {self.source}: row {row}: the id is null")
        dup = ~self.ids.is_first_distinct().to_numpy()  # the second and later occurrences
        if dup.any():
            row = int(np.flatnonzero(dup)[0])
            raise ValueError(f"VectorTable {self.source}: row {row}: id {self.ids[row]!r} appears more than once")
        bad = ~np.isfinite(v).all(axis=1)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"VectorTable {self.source}: row {row} (id {self.ids[row]!r}): the vector holds NaN or infinity"
            )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @staticmethod
    def read(
        path: str | Path, *, id_column: str = "id", vector_column: str = "vector", dim: int | None = None
    ) -> VectorTable:
        """A side table from Parquet (id column + fixed-length float list column) or `.npz` (ids, vectors).
        `dim`, when given, is checked: a vector of another length is an error naming the row."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"vector table {p}: no such file")
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                missing = [k for k in ("ids", "vectors") if k not in z.files]
                if missing:
                    raise ValueError(f"vector table {p}: the .npz file has no {missing} array (it has {z.files})")
                ids, vectors = z["ids"], z["vectors"]
            if vectors.ndim != 2:
                raise ValueError(f"vector table {p}: 'vectors' must be [K, D], got shape {vectors.shape}")
            if dim is not None and vectors.shape[1] != dim:
                raise ValueError(
                    f"vector table {p}: vectors have length {vectors.shape[1]}, the config says dim = {dim}"
                )
            return VectorTable(pl.Series("id", ids), np.ascontiguousarray(vectors, dtype=np.float32), str(p))
        try:
            frame = pl.read_parquet(p, columns=[id_column, vector_column])
        except pl.exceptions.ColumnNotFoundError as e:
            raise ValueError(f"vector table {p}: column not found ({e}); set id_column / vector_column") from None
        except (pl.exceptions.ComputeError, OSError) as e:
            raise ValueError(f"vector table {p}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        return VectorTable(frame[id_column], _vector_matrix(frame[vector_column], str(p), dim), str(p))

    def write(self, path: str | Path) -> None:
        """Save as `.npz` (ids, vectors); integer or string ids. No pickle: strings become a unicode array."""
        ids = self.ids.to_numpy()
        if ids.dtype == object:
            ids = ids.astype(str)
        np.savez(Path(path), ids=ids, vectors=self.vectors)

    def l2_normalized(self) -> VectorTable:
        """Every vector divided by its L2 norm (a zero vector stays zero)."""
        norms = np.linalg.norm(self.vectors, axis=1, keepdims=True)
        return dataclasses.replace(self, vectors=(self.vectors / np.maximum(norms, 1e-12)).astype(np.float32))

    def pca(self, dim: int, fit_ids: pl.Series | None = None) -> VectorTable:
        """The vectors projected on their first `dim` principal components, fitted on the rows whose id
        is in `fit_ids` (e.g. the items of the training split; default: every row), centred by their mean."""
        if not 0 < dim <= self.dim:
            raise ValueError(f"VectorTable.pca: dim must be in [1, {self.dim}], got {dim}")
        fit = self.vectors if fit_ids is None else self.vectors[np.isin(self.ids.to_numpy(), fit_ids.to_numpy())]
        if fit.shape[0] < 2:
            raise ValueError(f"VectorTable.pca: {fit.shape[0]} rows to fit on; need at least 2")
        mean = fit.mean(axis=0)
        _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)  # [D, D] rows: components by variance
        projected = (self.vectors - mean) @ vt[:dim].T
        return dataclasses.replace(self, vectors=np.ascontiguousarray(projected, dtype=np.float32))

    def aligned(self, codes: np.ndarray, num_rows: int) -> np.ndarray:
        """[num_rows, D + 1] float32: row c = [the vector of the id encoded as c, 0]; rows without a
        vector, and rows that several ids share (an out-of-vocabulary or hashed id), are [0, ..., 0, 1].

        codes [K]: each side-table id as the model's feature sees it (`encode_ids`); -1 for an id the
        feature has no row of its own for (out of vocabulary), whose vector is left out."""
        codes = np.asarray(codes, dtype=np.int64)
        if codes.shape != (len(self),):
            raise ValueError(f"VectorTable {self.source}: {codes.shape[0]} codes for {len(self)} ids")
        out_of_range = codes >= num_rows
        if out_of_range.any():
            row = int(np.flatnonzero(out_of_range)[0])
            raise ValueError(
                f"VectorTable {self.source}: row {row} (id {self.ids[row]!r}) encodes to {codes[row]}, "
                f"outside the feature's {num_rows} rows"
            )
        out = np.zeros((num_rows, self.dim + 1), dtype=np.float32)
        out[:, -1] = MISSING_FLAG
        counts = np.bincount(codes[codes >= 0], minlength=num_rows)
        alone = (codes >= 0) & (counts[np.maximum(codes, 0)] == 1)  # a code that one id alone maps to
        out[codes[alone], : self.dim] = self.vectors[alone]
        out[codes[alone], -1] = 0.0
        return out


def _vector_matrix(column: pl.Series, source: str, dim: int | None) -> np.ndarray:
    """A list / array column of floats -> [K, D] float32, every row checked for its length and nulls."""
    if isinstance(column.dtype, pl.Array):
        column = column.arr.to_list()
    if not isinstance(column.dtype, pl.List) or not column.dtype.inner.is_numeric():
        raise ValueError(f"vector table {source}: column {column.name!r} must hold float lists, got {column.dtype}")
    if column.null_count():
        row = int(np.flatnonzero(column.is_null().to_numpy())[0])
        raise ValueError(f"vector table {source}: row {row}: the vector in {column.name!r} is null")
    lengths = column.list.len().to_numpy()
    want = dim if dim is not None else (int(lengths[0]) if lengths.size else 0)
    wrong = lengths != want
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        said = "the config says dim" if dim is not None else "the first row has"
        raise ValueError(
            f"vector table {source}: row {row}: the vector in {column.name!r} has length {lengths[row]}, {said} {want}"
        )
    flat = column.explode()
    if flat.null_count():
        row = int(np.searchsorted(np.cumsum(lengths), int(np.flatnonzero(flat.is_null().to_numpy())[0]), side="right"))
        raise ValueError(f"vector table {source}: row {row}: the vector in {column.name!r} holds a null")
    return np.ascontiguousarray(flat.cast(pl.Float32).to_numpy().reshape(len(column), want))


def encode_ids(workflow: Workflow, column: str, ids: pl.Series) -> np.ndarray:
    """The side table's raw ids as the fitted `workflow` encodes `column` (its Categorify or HashBucket
    op), so that they index the rows of the feature's embedding table. Values the vocabulary lacks get
    the op's out-of-vocabulary id, as in the data."""
    for op, stats in zip(workflow.ops, workflow.stats, strict=True):
        if isinstance(op, Categorify | HashBucket) and column in op.columns:
            one = dataclasses.replace(op, columns=(column,))
            frame = pl.DataFrame({column: ids})
            if isinstance(one, Categorify):
                if stats is None:
                    raise ValueError(f"encode_ids: the workflow is not fitted (column {column!r})")
                frame = frame.with_columns(pl.col(column).cast(stats[column]["value"].dtype, strict=False))
                bad = frame[column].is_null() & ids.is_not_null()
                if bad.any():
                    row = int(np.flatnonzero(bad.to_numpy())[0])
                    raise ValueError(
                        f"encode_ids: id {ids[row]!r} (row {row}) does not convert to the type of column "
                        f"{column!r} in the workflow ({stats[column]['value'].dtype})"
                    )
                codes = one.transform(frame, {column: stats[column]})[column].to_numpy().astype(np.int64)
                # null, out-of-vocabulary and tail-bucket ids stand for many values: no vector of their own
                in_vocab = (codes >= FIRST_VOCAB_ID) & (codes < FIRST_VOCAB_ID + stats[column].height)
                return np.where(in_vocab, codes, -1)
            return one.transform(frame, {})[column].to_numpy().astype(np.int64)
    raise ValueError(f"encode_ids: no Categorify or HashBucket op of the workflow writes column {column!r}")


def load_vectors(model: nn.Module, workflow: Workflow | None) -> list[str]:
    """Fill every vector feature of `model` that names a side table (`VectorFeature.path`): read it,
    L2-normalise it unless `normalize = "none"`, encode its ids as `workflow` encodes the id feature
    (without a workflow the ids are the feature's row ids already), and load the aligned rows.
    Returns one line per feature saying how many of the feature's rows got a vector."""
    lines = []
    for arch in (m for m in model.modules() if isinstance(m, VectorArch)):
        for f in arch.features:
            if not f.path:
                continue
            table = VectorTable.read(f.path, id_column=f.id_column, vector_column=f.vector_column, dim=f.dim)
            if f.normalize == "l2":
                table = table.l2_normalized()
            if workflow is not None:
                codes = encode_ids(workflow, f.feature, table.ids)
            else:
                try:
                    codes = table.ids.cast(pl.Int64, strict=True).to_numpy()
                except pl.exceptions.InvalidOperationError:
                    raise ValueError(
                        f"vector table {f.path}: ids in {f.id_column!r} are not integers and there is no fitted "
                        f"workflow to encode them as feature {f.feature!r}"
                    ) from None
            num_rows = int(arch.collection.table_weight(f.table).shape[0])
            rows = table.aligned(codes, num_rows)
            arch.load_rows(f.name, rows)
            have = int((rows[:, -1] == 0).sum())
            lines.append(
                f"vectors {f.name}: {have:,} of the {num_rows:,} rows of feature {f.feature!r} have a vector "
                f"({len(table):,} in {f.path}, {f.normalize} normalised)"
            )
    return lines
