"""Delta export / import of dynamic tables: the rows that changed since a step, in Parquet.

Online training ships deltas to serving instead of whole models. A delta of a collection holds, for
each dynamic table, the keys touched after a given step with their rows and optimizer state.

File format (Parquet, one row per table row; framework-neutral, readable by pandas / polars / Spark):

    column  type            meaning
    table   string          table name
    key     int64, nullable the raw key; null marks the table's shared unknown row (Missing.UNKNOWN_ROW)
    vector  list<float32>   the row's weights, `dim` values (bf16 / fp16 storage widens exactly to fp32)
    state   list<float32>   the row's optimizer state, the fields below concatenated (empty for SGD)
    step    int64           the table step at which the row was last touched (the unknown row: the table's step)

Schema metadata key `hugerec.delta` holds JSON: {"version": 1, "tables": {name: {"dim": D,
"dtype": "fp32" | "bf16" | "fp16", "optimizer": {...}, "state": [[field, width], ...], "since_step": s}}},
state fields in the order they are concatenated (e.g. RowWiseAdagrad: [["sum", 1]]; Adam:
[["exp_avg", D], ["exp_avg_sq", D]]). Width-1 fields are [K] tensors in memory, wider ones [K, width].

Steps are the tables' hash-table steps (`HashTable.step`); in a training collection the step of a
lookup is the number of the optimizer update that writes its rows. `export_delta` returns the steps
to pass as `since` next time, so consecutive deltas cover every change exactly once. Keys that lost
their row (eviction, TTL, `remove`) are not listed: a delta carries upserts only. Static tables
have no keys and are not exported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import optimizer_to_dict

FORMAT_VERSION = 1
METADATA_KEY = b"hugerec.delta"


@dataclass(frozen=True)
class UnknownRow:
    """The shared row of missing keys (Missing.UNKNOWN_ROW): vector [D], state {field: [w] or []}, step."""

    vector: torch.Tensor
    state: dict[str, torch.Tensor]
    step: int


@dataclass(frozen=True)
class TableDelta:
    """Changed rows of one table: keys [K] int64, vectors [K, D] fp32, state {field: [K] or [K, w]} fp32, steps [K]."""

    table: str
    dim: int
    dtype: str
    optimizer: dict[str, Any]
    since_step: int
    keys: torch.Tensor
    vectors: torch.Tensor
    state: dict[str, torch.Tensor]
    steps: torch.Tensor
    unknown: UnknownRow | None = None

    def __len__(self) -> int:
        return int(self.keys.numel())


def _field_widths(state: Mapping[str, torch.Tensor]) -> list[tuple[str, int]]:
    return [(name, 1 if t.dim() == 1 else int(t.shape[1])) for name, t in state.items()]


def collect_delta(collection: EmbeddingCollection, since: int | Mapping[str, int] = -1) -> list[TableDelta]:
    """The rows of every dynamic table touched after step `since` (per table, or one step for all; -1: all rows)."""
    deltas = []
    for config in collection.tables:
        table = collection.hash_tables.get(config.name)
        if table is None:
            continue
        since_step = since if isinstance(since, int) else int(since.get(config.name, -1))
        changed = table.changed_since(since_step)
        weights, state = collection.read_rows(config.name, changed.rows)
        unknown = None
        if table.unknown_row is not None:
            u_weights, u_state = collection.read_rows(config.name, torch.tensor([table.unknown_row]))
            unknown = UnknownRow(
                u_weights[0].to(torch.float32), {k: v[0].clone() for k, v in u_state.items()}, max(table.step, 0)
            )
        deltas.append(
            TableDelta(
                table=config.name,
                dim=config.dim,
                dtype=config.dtype.value,
                optimizer=optimizer_to_dict(config.optimizer or collection.optimizer),
                since_step=since_step,
                keys=changed.keys,
                vectors=weights.to(torch.float32),
                state=state,
                steps=changed.last_step,
                unknown=unknown,
            )
        )
    return deltas


def _flat(state: Mapping[str, torch.Tensor], n: int) -> np.ndarray:
    """{field: [n] or [n, w]} -> [n, sum w] fp32 in field order."""
    parts = [
        t.reshape(n, w).to(torch.float32).numpy()
        for (_, w), t in zip(_field_widths(state), state.values(), strict=True)
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0), dtype=np.float32)


def _list_column(values: np.ndarray) -> pa.Array:
    """[n, w] float32 -> list<float32> column of n lists of w values."""
    n, w = values.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * w, type=pa.int32())
    return pa.ListArray.from_arrays(offsets, pa.array(np.ascontiguousarray(values).reshape(-1), type=pa.float32()))


SCHEMA = pa.schema(
    [
        ("table", pa.string()),
        ("key", pa.int64()),
        ("vector", pa.list_(pa.float32())),
        ("state", pa.list_(pa.float32())),
        ("step", pa.int64()),
    ]
)


def _record_batches(d: TableDelta) -> list[pa.RecordBatch]:
    """One table's rows (its unknown row last, with a null key), in batches whose list offsets fit int32."""
    n = len(d)
    keys = pa.array(d.keys.numpy(), type=pa.int64())
    vectors, state, steps = d.vectors.to(torch.float32).numpy().reshape(n, d.dim), _flat(d.state, n), d.steps.numpy()
    if d.unknown is not None:
        keys = pa.concat_arrays([keys, pa.nulls(1, type=pa.int64())])
        vectors = np.concatenate([vectors, d.unknown.vector.to(torch.float32).reshape(1, -1).numpy()])
        state = np.concatenate([state, _flat({k: v.reshape(1, -1) for k, v in d.unknown.state.items()}, 1)])
        steps = np.concatenate([steps, np.array([d.unknown.step], dtype=np.int64)])
    rows_per_batch = max(1, (2**31 - 1) // max(d.dim, state.shape[1], 1))
    out = []
    for a in range(0, len(keys), rows_per_batch):
        b = min(a + rows_per_batch, len(keys))
        out.append(
            pa.RecordBatch.from_arrays(
                [
                    pa.array([d.table] * (b - a), type=pa.string()),
                    keys.slice(a, b - a),
                    _list_column(vectors[a:b]),
                    _list_column(state[a:b]),
                    pa.array(steps[a:b], type=pa.int64()),
                ],
                schema=SCHEMA,
            )
        )
    return out


def write_delta(deltas: Sequence[TableDelta], path: str | Path) -> None:
    """Write deltas (one per table) to one Parquet file in the documented format, a table at a time."""
    names = [d.table for d in deltas]
    if len(set(names)) != len(names):
        raise ValueError(f"write_delta: more than one delta for a table: {names}")
    meta = {
        d.table: {
            "dim": d.dim,
            "dtype": d.dtype,
            "optimizer": d.optimizer,
            "state": _field_widths(d.state),
            "since_step": d.since_step,
        }
        for d in deltas
    }
    schema = SCHEMA.with_metadata({METADATA_KEY: json.dumps({"version": FORMAT_VERSION, "tables": meta}).encode()})
    with pq.ParquetWriter(str(path), schema) as writer:
        for d in deltas:
            for batch in _record_batches(d):
                writer.write_batch(batch)


def read_delta(path: str | Path) -> list[TableDelta]:
    """Read a delta file written by `write_delta` (tables in file order)."""
    table = pq.read_table(str(path))
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ValueError(f"read_delta: {path} has no {METADATA_KEY.decode()!r} metadata; not a hugerec delta file")
    meta = json.loads(raw)
    if meta.get("version") != FORMAT_VERSION:
        raise ValueError(f"read_delta: {path} has format version {meta.get('version')}, expected {FORMAT_VERSION}")
    names = np.asarray(table.column("table").to_pylist(), dtype=object)
    keys_col = table.column("key").combine_chunks()
    key_valid = ~np.asarray(keys_col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    keys = keys_col.fill_null(0).to_numpy()
    vectors_all = table.column("vector").combine_chunks()
    states_all = table.column("state").combine_chunks()
    steps = table.column("step").to_numpy()
    deltas = []
    for name, info in meta["tables"].items():
        idx = np.flatnonzero(names == name)
        dim = int(info["dim"])
        widths = [(str(f), int(w)) for f, w in info["state"]]
        total = sum(w for _, w in widths)
        vec = _unlist(vectors_all.take(pa.array(idx)), dim, path, name, "vector")
        st = _unlist(states_all.take(pa.array(idx)), total, path, name, "state")
        held = key_valid[idx]
        unknown = None
        if not held.all():
            u = int(np.flatnonzero(~held)[0])
            unknown = UnknownRow(
                torch.from_numpy(vec[u].copy()), _split(st[u : u + 1], widths, squeeze=True), int(steps[idx][u])
            )
        deltas.append(
            TableDelta(
                table=name,
                dim=dim,
                dtype=str(info["dtype"]),
                optimizer=dict(info["optimizer"]),
                since_step=int(info["since_step"]),
                keys=torch.from_numpy(keys[idx][held].copy()),
                vectors=torch.from_numpy(vec[held].copy()),
                state=_split(st[held], widths),
                steps=torch.from_numpy(steps[idx][held].copy()),
                unknown=unknown,
            )
        )
    return deltas


def _unlist(col: pa.Array, width: int, path: str | Path, table: str, column: str) -> np.ndarray:
    lengths = col.value_lengths().to_numpy(zero_copy_only=False) if len(col) else np.zeros(0, dtype=np.int32)
    if (lengths != width).any():
        raise ValueError(f"read_delta: {path}: table {table!r} has {column} lists of length != {width}")
    return col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(col), width)


def _split(flat: np.ndarray, widths: Sequence[tuple[str, int]], squeeze: bool = False) -> dict[str, torch.Tensor]:
    """[n, sum w] -> {field: [n] (w == 1) or [n, w]}; squeeze: drop the n = 1 axis (the unknown row)."""
    out = {}
    start = 0
    for name, w in widths:
        part = torch.from_numpy(flat[:, start : start + w].copy())
        part = part[:, 0] if w == 1 else part
        out[name] = part[0] if squeeze else part
        start += w
    return out


def apply_delta(collection: EmbeddingCollection, deltas: Sequence[TableDelta]) -> None:
    """Upsert the deltas' rows into the collection's dynamic tables: keys get rows (no admission), rows and
    optimizer state are overwritten bit for bit. Keys count as touched at the table's current step."""
    configs = {t.name: t for t in collection.tables}
    for d in deltas:
        table = collection.hash_tables.get(d.table)
        if table is None:
            raise ValueError(f"apply_delta: table {d.table!r} is not a dynamic table of this collection")
        if d.dim != configs[d.table].dim:
            raise ValueError(f"apply_delta: table {d.table!r} has dim {configs[d.table].dim}, the delta {d.dim}")
        ins = table.find_or_insert(d.keys, step=max(table.step, 0), admit_all=True)
        collection.write_rows(d.table, ins.rows, d.vectors, d.state)
        if d.unknown is not None and table.unknown_row is not None:
            collection.write_rows(
                d.table,
                torch.tensor([table.unknown_row]),
                d.unknown.vector.reshape(1, -1),
                {k: v.reshape(1, *v.shape) for k, v in d.unknown.state.items()},
            )


def export_delta(
    collection: EmbeddingCollection, path: str | Path, since: int | Mapping[str, int] = -1
) -> dict[str, int]:
    """Write the rows changed after `since` to `path`; returns each table's step, the `since` for next time."""
    write_delta(collect_delta(collection, since), path)
    return {name: table.step for name, table in collection.hash_tables.items()}


def import_delta(collection: EmbeddingCollection, path: str | Path) -> None:
    """Read a delta file and apply it to the collection."""
    apply_delta(collection, read_delta(path))
