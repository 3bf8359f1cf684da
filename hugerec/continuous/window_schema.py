"""Schema changes between windows: what a window's columns are, the schema the loop trains on them, and
what changed since the version serving.

    window_columns(rows)        {column: Arrow type} of a window (the time column left out)
    adapt_schema(schema, cols)  the loop's configured schema on this window: its columns the window still
                                has keep their role; columns the window lacks are dropped (the label may not
                                be); new columns join by type: integers -> sparse (raw keys of a dynamic
                                table), floating point -> dense; any other new type is refused
    describe_change(old, new)   "new column c9 (int64); column d0 removed; column c1 retyped int64 -> int32"
    window_schemas(schema, source, time_column)   k -> adapt_schema of window k: what the monitor watches
                                and the simulated traffic sends for window k (dense features by name)

A change of columns or types between the serving version and a candidate makes the loop publish a whole
bundle (a version delta applies rows to a model of the same shape and request signature); a change of
the trained schema also trains the candidate from scratch (its tables and dense layers have another shape).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pyarrow as pa

from hugerec.data.schema import Column, ColumnKind, Schema


def window_columns(rows: pa.Table, time_column: str) -> dict[str, str]:
    return {f.name: str(f.type) for f in rows.schema if f.name != time_column}


def _accepts(kind: ColumnKind, arrow_type: pa.DataType) -> bool:
    match kind:
        case ColumnKind.SPARSE:
            return bool(pa.types.is_integer(arrow_type))
        case ColumnKind.LABEL | ColumnKind.DENSE:
            return bool(
                pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)
            )


def adapt_schema(schema: Schema, rows: pa.Table, time_column: str, where: str) -> Schema:
    """The schema the loop trains on this window (see the module docstring); ValueError naming the column."""
    types = {f.name: f.type for f in rows.schema if f.name != time_column}
    kept: list[Column] = []
    for c in schema.columns:
        if c.name not in types:
            if c.kind is ColumnKind.LABEL:
                raise ValueError(f"{where}: the label column {c.name!r} is missing (window columns: {sorted(types)})")
            continue
        if not _accepts(c.kind, types[c.name]):
            raise ValueError(
                f"{where}: column {c.name!r} is {c.kind.value} in the loop's schema but holds {types[c.name]} "
                "(sparse columns need integer keys, label and dense columns numbers)"
            )
        kept.append(c)
    for name, t in types.items():
        if name in schema:
            continue
        if pa.types.is_integer(t):
            kept.append(Column(name, ColumnKind.SPARSE))
        elif pa.types.is_floating(t):
            kept.append(Column(name, ColumnKind.DENSE))
        else:
            raise ValueError(
                f"{where}: new column {name!r} holds {t}; the loop takes new integer columns as sparse keys and "
                "floating-point ones as dense features: encode it, or drop it from the data"
            )
    order = {ColumnKind.LABEL: 0, ColumnKind.DENSE: 1, ColumnKind.SPARSE: 2}
    return Schema(tuple(sorted(kept, key=lambda c: order[c.kind])))  # stable: file order within a kind


def describe_change(old: Mapping[str, str], new: Mapping[str, str]) -> str | None:
    """What differs between two windows' {column: type}, or None when nothing does."""
    parts = [f"new column {n} ({t})" for n, t in new.items() if n not in old]
    parts += [f"column {n} removed" for n in old if n not in new]
    parts += [f"column {n} retyped {old[n]} -> {t}" for n, t in new.items() if n in old and old[n] != t]
    return "; ".join(parts) or None


def window_schemas(schema: Schema, source: Callable[[int], pa.Table], time_column: str) -> Callable[[int], Schema]:
    """k -> the schema the loop trains on window k of `source` (adapt_schema): while a stable and a canary trained
    on different schemas share the traffic, the monitor watches window k's own features, not the configured ones."""

    def of(k: int) -> Schema:
        return adapt_schema(schema, source(k), time_column, f"window {k}")

    return of
