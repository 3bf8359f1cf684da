"""Preprocessed Parquet shards -> one FeatureMatrix for the tree models (hugerec.models.gbm).

    m = read_matrix("runs/quickstart/data/train", schema)   # x [N, Dd + F] float32, labels [N]

Columns in the order a served model takes them: the schema's dense features, then one column per
sparse feature holding its id. Trees need one value per feature and example: a multi-hot column is
refused, as is a vocabulary beyond 2^24 ids (float32 would merge neighbouring ids). Nulls become NaN,
the libraries' missing value.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

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


def read_matrix(paths: str | Path | Sequence[str | Path], schema: Schema, labels: bool = True) -> FeatureMatrix:
    """Every row of the shards at `paths` as a FeatureMatrix (labels: read the label column too)."""
    check_tree_schema(schema)
    names = (*schema.dense_names, *schema.sparse_names)
    label = schema.label_names[0]
    files = expand_paths(paths)
    parts, ys = [], []
    for table in iter_row_groups(files, [*names, label] if labels else list(names)):
        block = np.empty((table.num_rows, len(names)), np.float32)
        for j, name in enumerate(names):
            block[:, j] = _column(table.column(name), name)
        parts.append(block)
        if labels:
            ys.append(_column(table.column(label), label))
    if not parts:
        raise ValueError(f"{paths} holds no rows (empty dataset)")
    x = np.concatenate(parts)
    y = np.concatenate(ys) if labels else np.zeros(0, np.float32)
    if labels and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][0]
        raise ValueError(f"label column {label!r} must hold 0 or 1, got {bad}")
    return FeatureMatrix(x, y, names, len(schema.dense_names))


def _column(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """A numeric column as float32 with nulls as NaN; ValueError naming it otherwise."""
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ValueError(f"column {name!r} has type {column.type}; tree models read numbers and ids")
    return np.asarray(column.to_numpy(zero_copy_only=False), np.float64).astype(np.float32)
