"""Preprocessed Parquet shards -> one FeatureMatrix for the tree models (hugerec.models.gbm).

    m = read_matrix("runs/quickstart/data/train", schema)   # x [N, Dd + F] float32, labels [N]
    m = read_matrix(paths, schema, group="user_id")         # + m.groups: query sizes, labels graded 0, 1, 2, ...

Columns in the order a served model takes them: the schema's dense features, then one column per
sparse feature holding its id. Trees need one value per feature and example: a multi-hot column is
refused, as is a vocabulary beyond 2^24 ids (float32 would merge neighbouring ids). Nulls become NaN,
the libraries' missing value.

Ranking (`group`): the rows of a query are those with equal values in the group column (any column of
the shards, a feature or not; no nulls). Queries whose rows are contiguous keep the shards' order;
otherwise every row is moved, stably, next to the first row of its query (the order of first
appearance). Labels are then relevance grades: integers >= 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hugerec.data.schema import Schema
from hugerec.data.shards import expand_paths, iter_row_groups
from hugerec.models.gbm import MAX_EXACT_ID, FeatureMatrix


def check_tree_schema(schema: Schema) -> None:
    """ValueError naming the column when `schema` has something trees cannot take."""
    if len(schema.label_names) != 1:
        raise ValueError(f"tree models take one label column, the schema has {list(schema.label_names)}")
    for c in schema.sparse:
        if c.multi_hot:
            raise ValueError(f"sparse column {c.name!r} is multi-hot; tree models take one id per example")
        if c.cardinality is not None and c.cardinality > MAX_EXACT_ID:
            raise ValueError(
                f"sparse column {c.name!r} has {c.cardinality:,} ids; tree models take at most {MAX_EXACT_ID:,} "
                "(set preprocess.max_vocab)"
            )


def read_matrix(
    paths: str | Path | Sequence[str | Path],
    schema: Schema,
    labels: bool = True,
    group: str | None = None,
    grades: bool | None = None,
) -> FeatureMatrix:
    """Every row of the shards at `paths` as a FeatureMatrix (labels: read the label column too; group:
    the query column of a ranking objective, named model.group in errors; grades: labels are relevance
    grades rather than 0/1, by default when there is a group)."""
    grades = group is not None if grades is None else grades
    check_tree_schema(schema)
    names = (*schema.dense_names, *schema.sparse_names)
    label = schema.label_names[0]
    files = expand_paths(paths)
    if group is not None and files:
        columns = pq.read_schema(files[0]).names
        if group not in columns:
            raise ValueError(f"model.group: column {group!r} is not in {files[0]} (its columns: {columns})")
    wanted = [*names, *([label] if labels else []), *([group] if group is not None and group not in names else [])]
    parts, ys, keys = [], [], []
    for table in iter_row_groups(files, list(dict.fromkeys(wanted))):
        block = np.empty((table.num_rows, len(names)), np.float32)
        for j, name in enumerate(names):
            block[:, j] = _column(table.column(name), name)
        parts.append(block)
        if labels:
            ys.append(_column(table.column(label), label))
        if group is not None:
            column = table.column(group)
            if column.null_count:
                raise ValueError(f"model.group: column {group!r} has a null (every row needs its query)")
            keys.append(column.to_numpy(zero_copy_only=False))
    if not parts or not sum(len(b) for b in parts):  # no row group, or row groups of zero rows
        raise ValueError(f"{paths} holds no rows (empty dataset)")
    x = np.concatenate(parts)
    y = np.concatenate(ys) if labels else np.zeros(0, np.float32)
    if labels and not grades and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][0]
        raise ValueError(f"label column {label!r} must hold 0 or 1, got {bad}")
    if labels and grades and not ((y >= 0) & (y == np.round(y))).all():
        bad = y[~((y >= 0) & (y == np.round(y)))][0]
        raise ValueError(f"label column {label!r} must hold relevance grades (integers >= 0) for ranking, got {bad}")
    if group is None:
        return FeatureMatrix(x, y, names, len(schema.dense_names))
    order, sizes = query_order(np.concatenate(keys))
    if order is not None:
        x, y = x[order], (y[order] if labels else y)
    return FeatureMatrix(x, y, names, len(schema.dense_names), sizes)


def query_order(keys: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(None or the row order that makes every query contiguous, the query sizes [Q] int64 in that order).
    Contiguous queries keep their order; otherwise rows move stably to their query's first appearance."""
    _, first, codes = np.unique(keys, return_index=True, return_inverse=True)
    codes = codes.reshape(-1)
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    if starts.shape[0] == first.shape[0]:  # one run per query: contiguous already
        return None, np.diff(np.r_[starts, codes.shape[0]]).astype(np.int64)
    rank = np.argsort(np.argsort(first, kind="stable"), kind="stable")  # query -> its order of first appearance
    order = np.argsort(rank[codes], kind="stable")
    return order, np.bincount(rank[codes]).astype(np.int64)


def _column(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """A numeric column as float32 with nulls as NaN; ValueError naming it otherwise."""
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ValueError(f"column {name!r} has type {column.type}; tree models read numbers and ids")
    return np.asarray(column.to_numpy(zero_copy_only=False), np.float64).astype(np.float32)
