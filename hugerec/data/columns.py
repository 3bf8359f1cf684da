"""Decoded row groups: Parquet checked against a Schema, Arrow -> NumPy columns, and batch assembly.

    row group (Arrow)  --decode-->  Columns: labels [R], dense [R, Dd], per sparse feature one of
                                      single-hot      ids [R] as stored (zero-copy)
                                      with nulls      ids [R] + valid [R] bool
                                      multi-hot       ids [N] + offsets [R + 1]
    pieces of Columns  --assemble-->  Batch(dense [B, Dd], SparseFeatures (feature-major), labels [B])

Label and dense columns must hold no nulls and ids must lie in 0..cardinality-1: checked from the
Parquet statistics when the loader opens a file, else when the row group is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from numba import njit

from hugerec.data.schema import Column, Schema
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


@dataclass
class SparseColumn:
    """One sparse feature of a decoded window (R rows)."""

    values: np.ndarray  # single-hot: [R] ids as stored (int32/int64; junk where invalid); multi-hot: [N] ids
    valid: np.ndarray | None = None  # single-hot with nulls: [R] bool
    offsets: np.ndarray | None = None  # multi-hot: [R + 1] int64 (already in window order)


@dataclass
class Columns:
    """A decoded window: R rows as NumPy arrays; `order` [R] permutes rows (None = file order)."""

    labels: np.ndarray  # [R] or [R, T] float32
    dense: np.ndarray  # [R, Dd] float32
    sparse: list[SparseColumn]
    order: np.ndarray | None


def assemble(pieces: list[tuple[Columns, int, int]], keys: tuple[str, ...]) -> Batch:
    """Rows [start, end) of each piece (through its window order) -> one Batch with sparse `keys`.

    Unshuffled single-piece batches serve dense and labels as views; otherwise one gather/copy.
    """
    rows = [slice(s, e) if c.order is None else c.order[s:e] for c, s, e in pieces]
    if len(pieces) == 1:  # a view when unshuffled, a gather otherwise
        labels, dense = pieces[0][0].labels[rows[0]], pieces[0][0].dense[rows[0]]
    else:
        labels = np.concatenate([c.labels[r] for (c, _, _), r in zip(pieces, rows, strict=True)])
        dense = np.concatenate([c.dense[r] for (c, _, _), r in zip(pieces, rows, strict=True)])
    b = labels.shape[0]
    num_features = len(keys)
    lengths = np.empty(num_features * b, np.int32)  # [F * B] feature-major
    capacity = sum(  # single-hot: at most one id per row; multi-hot: the rows' list lengths
        e - s if sp.offsets is None else int(sp.offsets[e] - sp.offsets[s])
        for cols, s, e in pieces
        for sp in cols.sparse
    )
    values = np.empty(capacity, np.int64)  # [N] feature-major, cast from the stored id dtype
    at = total = 0
    for f in range(num_features):
        for cols, s, e in pieces:
            sp, n = cols.sparse[f], e - s
            if sp.offsets is not None:
                lo, hi = int(sp.offsets[s]), int(sp.offsets[e])
                np.subtract(sp.offsets[s + 1 : e + 1], sp.offsets[s:e], out=lengths[at : at + n], casting="unsafe")
                values[total : total + hi - lo] = sp.values[lo:hi]
                total += hi - lo
            elif sp.valid is None and cols.order is None:
                lengths[at : at + n] = 1
                values[total : total + n] = sp.values[s:e]
                total += n
            else:
                valid = _NO_ROWS if sp.valid is None else sp.valid
                order = _NO_ORDER if cols.order is None else cols.order
                total += _gather_ids(
                    sp.values, valid, sp.valid is not None, order, cols.order is not None, s, e,
                    values[total:], lengths[at : at + n],
                )  # fmt: skip
            at += n
    values = values[:total]
    sparse = _trusted_features(keys, torch.from_numpy(values), torch.from_numpy(lengths))
    return Batch(torch.from_numpy(dense), sparse, torch.from_numpy(labels))


_NO_ROWS = np.zeros(0, np.bool_)
_NO_ORDER = np.zeros(0, np.int64)


@njit(cache=True, nogil=True)
def _gather_ids(
    ids: np.ndarray,
    valid: np.ndarray,
    has_valid: bool,
    order: np.ndarray,
    has_order: bool,
    start: int,
    end: int,
    out: np.ndarray,
    lengths: np.ndarray,
) -> int:  # pragma: no cover - compiled
    """Single-hot rows start..end-1 (through `order` when given) -> ids of valid rows into `out`, 0/1 into `lengths`.

    Returns the number of ids written. One pass instead of NumPy's gather + mask + compress + cast.
    """
    k = 0
    for i in range(end - start):
        j = order[start + i] if has_order else start + i
        # Branch-free: a missing id is written and then overwritten (out has room for every row);
        # missing values are frequent and random, so a branch here mispredicts often.
        keep = valid[j] if has_valid else True
        out[k] = ids[j]
        lengths[i] = keep
        k += keep
    return k


def _trusted_features(keys: tuple[str, ...], values: torch.Tensor, lengths: torch.Tensor) -> SparseFeatures:
    """SparseFeatures without re-running its checks: `_assemble` built values and lengths consistent.

    The checks reduce over all F * B lengths with torch; from a loader thread, torch's OpenMP team
    for those reductions stalls on a busy machine (measured 8-27 ms per 8192-row batch, more than
    the rest of the batch's work). The tests compare these batches against checked ones.
    """
    features = object.__new__(SparseFeatures)
    for name, value in (("keys", keys), ("values", values), ("lengths", lengths), ("weights", None)):
        object.__setattr__(features, name, value)
    return features


def check_file_schema(path: Path, arrow: pa.Schema, schema: Schema) -> None:
    names = set(arrow.names)
    for col in schema.columns:
        if col.name not in names:
            raise ValueError(f"{path}: column {col.name!r} of the schema is not in the file (file has {sorted(names)})")
        t = arrow.field(col.name).type
        if col in schema.sparse:
            ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
            if not col.multi_hot:
                ok = pa.types.is_integer(t)
            if not ok:
                want = "a list of integer ids (multi_hot)" if col.multi_hot else "integer ids"
                raise ValueError(f"{path}: column {col.name!r} should hold {want}, found type {t}")
        elif not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            raise ValueError(f"{path}: {col.kind.value} column {col.name!r} must be numeric, found type {t}")


def verify_statistics(path: Path, md: pq.FileMetaData, index: int, schema: Schema) -> bool:
    """Checks a row group from its Parquet statistics; False when they cannot tell (then it is checked when read).

    Raises for a label/dense null or an id out of range that the statistics already show.
    """
    rg = md.row_group(index)
    stats = {}
    for j in range(rg.num_columns):
        chunk = rg.column(j)
        stats[chunk.path_in_schema] = chunk.statistics
    where = f"{path}, row group {index}"
    complete = True
    for col in schema.columns:
        st = stats.get(col.name)  # None for list columns (their leaf is "name.list.element"), checked when read
        if st is None or not st.has_null_count:
            complete = False
            continue
        if col in schema.sparse:
            if not st.has_min_max:
                complete = complete and st.null_count == rg.num_rows
                continue
            if st.min < 0 or (col.cardinality is not None and st.max >= col.cardinality):
                bad = st.min if st.min < 0 else st.max
                raise ValueError(f"{where}: column {col.name!r} has id {bad} outside 0..{col.cardinality}-1")
        elif st.null_count:
            raise ValueError(
                f"{where}: {col.kind.value} column {col.name!r} has {st.null_count} missing values; "
                "fill them first (preprocess FillMissing)"
            )
    return complete


def check_row_group(table: pa.Table, schema: Schema, path: Path, row_group: int) -> None:
    where = f"{path}, row group {row_group}"
    for col in (*schema.labels, *schema.dense):
        n = table[col.name].null_count
        if n:
            raise ValueError(
                f"{where}: {col.kind.value} column {col.name!r} has {n} missing values; "
                "fill them first (preprocess FillMissing)"
            )
    for col in schema.sparse:
        arr = table[col.name]
        ids = pc.list_flatten(arr) if col.multi_hot else arr
        if col.multi_hot and ids.null_count:
            raise ValueError(f"{where}: column {col.name!r} has {ids.null_count} missing ids inside its lists")
        _check_id_range(col, ids, where)


def _check_id_range(col: Column, ids: pa.ChunkedArray | pa.Array, where: str) -> None:
    if len(ids) == ids.null_count:
        return
    mm = pc.min_max(ids)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    if lo < 0 or (col.cardinality is not None and hi >= col.cardinality):
        bad = lo if lo < 0 else hi
        raise ValueError(f"{where}: column {col.name!r} has id {bad} outside 0..{col.cardinality}-1")


def _single(arr: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    return arr


def _to_numpy(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Zero-copy for one chunk of a primitive type without nulls."""
    return np.asarray(_single(arr).to_numpy(zero_copy_only=False))


def _raw_ids(arr: pa.Array) -> np.ndarray:
    """The values buffer of an integer array, nulls included as whatever bytes they hold (zero-copy)."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=arr.offset + len(arr))[arr.offset :]


def decode(table: pa.Table, schema: Schema, order: np.ndarray | None) -> Columns:
    r = table.num_rows
    if len(schema.labels) == 1:  # a copy: Arrow buffers are read-only, and torch wants writable arrays
        labels = _to_numpy(table[schema.label_names[0]]).astype(np.float32)
    else:
        labels = np.empty((r, len(schema.labels)), np.float32)  # [R, T]
        for t, name in enumerate(schema.label_names):
            labels[:, t] = _to_numpy(table[name])
    dense = np.empty((r, len(schema.dense)), np.float32)  # [R, Dd]
    for j, name in enumerate(schema.dense_names):
        dense[:, j] = _to_numpy(table[name])
    sparse = []
    for col in schema.sparse:
        arr = _single(table[col.name])
        if col.multi_hot:
            if order is not None:  # lists are permuted here, once; flat columns are gathered per batch
                arr = arr.take(pa.array(order))
            lengths = _to_numpy(pc.fill_null(pc.list_value_length(arr), 0))
            offsets = np.zeros(r + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            sparse.append(SparseColumn(_to_numpy(pc.list_flatten(arr)), offsets=offsets))
        elif arr.null_count:
            sparse.append(SparseColumn(_raw_ids(arr), valid=_to_numpy(pc.is_valid(arr))))
        else:
            sparse.append(SparseColumn(_raw_ids(arr)))
    return Columns(labels, dense, sparse, order)
