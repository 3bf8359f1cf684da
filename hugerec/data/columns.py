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
    offsets: np.ndarray | None = None  # multi-hot: [R + 1] int64


@dataclass
class Columns:
    """A decoded window: R rows as NumPy arrays, in the order they are served (shuffled already)."""

    labels: np.ndarray  # [R] or [R, T] float32
    dense: np.ndarray  # [R, Dd] float32
    sparse: list[SparseColumn]


def assemble(pieces: list[tuple[Columns, int, int]], keys: tuple[str, ...]) -> Batch:
    """Rows [start, end) of each piece -> one Batch with sparse `keys`.

    A single-piece batch serves dense and labels as views of the window; a batch spanning two
    windows copies them once.
    """
    if len(pieces) == 1:
        cols, s, e = pieces[0]
        labels, dense = cols.labels[s:e], cols.dense[s:e]
    else:
        labels = np.concatenate([c.labels[s:e] for c, s, e in pieces])
        dense = np.concatenate([c.dense[s:e] for c, s, e in pieces])
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
            elif sp.valid is None:
                lengths[at : at + n] = 1
                values[total : total + n] = sp.values[s:e]
                total += n
            else:
                total += _compact_ids(sp.values, sp.valid, s, e, values[total:], lengths[at : at + n])
            at += n
    values = values[:total]
    sparse = _trusted_features(keys, torch.from_numpy(values), torch.from_numpy(lengths))
    return Batch(torch.from_numpy(dense), sparse, torch.from_numpy(labels))


@njit(cache=True, nogil=True)
def _compact_ids(
    ids: np.ndarray, valid: np.ndarray, start: int, end: int, out: np.ndarray, lengths: np.ndarray
) -> int:  # pragma: no cover - compiled
    """Single-hot rows start..end-1 -> ids of valid rows into `out` (as its dtype), 0/1 into `lengths`.

    Returns the number of ids written. One pass instead of NumPy's mask + compress + cast.
    """
    k = 0
    for i in range(end - start):
        j = start + i
        # Branch-free: a missing id is written and then overwritten (out has room for every row);
        # missing values are frequent and random, so a branch here mispredicts often.
        keep = valid[j]
        out[k] = ids[j]
        lengths[i] = keep
        k += keep
    return k


def _trusted_features(keys: tuple[str, ...], values: torch.Tensor, lengths: torch.Tensor) -> SparseFeatures:
    """SparseFeatures without re-running its checks: `_assemble` built values and lengths consistent.

    The checks reduce over all F * B lengths with torch; from a loader thread, torch's OpenMP team
    for those reductions stalls on a busy machine, for longer than the rest of the batch's work. The tests compare these batches against checked ones.
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
    """A window's rows as NumPy arrays, row i of the result being row order[i] of `table` (file order if None).

    Shuffling here, once per window, leaves batches as contiguous slices: flat id columns are scattered
    straight from the Arrow buffers into their shuffled places (no intermediate copy), dense rows are
    gathered once from the [R, Dd] matrix that decoding builds anyway.
    """
    r = table.num_rows
    inv = None  # [R] shuffled position of each file row
    if order is not None:
        inv = np.empty(r, np.int64)
        inv[order] = np.arange(r)
    labels = np.empty((r, len(schema.labels)), np.float32)  # [R, T]: a copy, since torch wants writable arrays
    for t, name in enumerate(schema.label_names):
        _fill(labels[:, t], table[name])
    dense = np.empty((r, len(schema.dense)), np.float32)  # [R, Dd]
    for j, name in enumerate(schema.dense_names):
        _fill(dense[:, j], table[name])
    if order is not None:  # np.take: much faster than dense[order] for a narrow [R, Dd]
        labels, dense = np.take(labels, order, axis=0), np.take(dense, order, axis=0)
    if len(schema.labels) == 1:
        labels = labels[:, 0]  # [R]
    sparse = []
    for col in schema.sparse:
        if col.multi_hot:
            arr = _single(table[col.name])
            if order is not None:
                arr = arr.take(pa.array(order))
            lengths = _to_numpy(pc.fill_null(pc.list_value_length(arr), 0))
            offsets = np.zeros(r + 1, np.int64)
            np.cumsum(lengths, out=offsets[1:])
            sparse.append(SparseColumn(_to_numpy(pc.list_flatten(arr)), offsets=offsets))
        else:
            sparse.append(_single_hot(table[col.name], inv))
    return Columns(labels, dense, sparse)


def _fill(out: np.ndarray, arr: pa.ChunkedArray) -> None:
    """Column `arr` (any numeric type) -> `out` [R], chunk by chunk (no combined copy)."""
    at = 0
    for chunk in arr.chunks:
        out[at : at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        at += len(chunk)


def _single_hot(arr: pa.ChunkedArray, inv: np.ndarray | None) -> SparseColumn:
    """Ids as stored (zero-copy for one chunk in file order) and validity when there are nulls; with `inv`,
    file row i lands at position inv[i]."""
    chunks = [c for c in arr.chunks if len(c)]
    if inv is None and len(chunks) == 1:
        c = chunks[0]
        return SparseColumn(_raw_ids(c), _to_numpy(pc.is_valid(c)) if c.null_count else None)
    if inv is None:
        inv = np.arange(len(arr))
    values = np.empty(len(arr), np.dtype(arr.type.to_pandas_dtype()))
    valid = np.empty(len(arr) if arr.null_count else 0, np.bool_)
    at = 0
    for c in arr.chunks:
        if len(c):
            bitmap = c.buffers()[0]
            has_bitmap = c.null_count > 0 and bitmap is not None
            bits = np.frombuffer(bitmap, np.uint8) if has_bitmap else _NO_BITS
            _scatter_ids(_raw_ids(c), bits, c.offset, has_bitmap, inv[at : at + len(c)], values, valid)
        at += len(c)
    return SparseColumn(values, valid if arr.null_count else None)


_NO_BITS = np.zeros(0, np.uint8)


@njit(cache=True, nogil=True)
def _scatter_ids(
    ids: np.ndarray,
    bitmap: np.ndarray,
    bit_offset: int,
    has_bitmap: bool,
    positions: np.ndarray,
    out: np.ndarray,
    out_valid: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """out[positions[i]] = ids[i] and, when `out_valid` has rows, out_valid[positions[i]] = bit i of the Arrow
    validity bitmap (all valid without one): one pass per chunk instead of is_valid + two NumPy scatters."""
    track = len(out_valid) > 0
    for i in range(len(ids)):
        p = positions[i]
        out[p] = ids[i]
        if track:
            b = bit_offset + i
            out_valid[p] = (bitmap[b >> 3] >> (b & 7)) & 1 if has_bitmap else True
