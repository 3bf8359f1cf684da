"""window_schema: a window's columns, the loop's schema adapted to them (kept roles, dropped columns, new ones
joining by type, in label/dense/sparse order), the change described in one line, and each refusal naming
the window and the column."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hugerec.continuous.window_schema import adapt_schema, describe_change, window_columns, window_schemas
from hugerec.data.schema import Column, ColumnKind, Schema

SCHEMA = Schema(
    (
        Column("label", ColumnKind.LABEL),
        Column("d0", ColumnKind.DENSE),
        Column("c0", ColumnKind.SPARSE),
        Column("c1", ColumnKind.SPARSE),
    )
)


def _window(**columns: pa.Array) -> pa.Table:
    return pa.table({"ts": pa.array([1, 2], pa.int64()), **columns})


def _names(schema: Schema) -> list[tuple[str, ColumnKind]]:
    return [(c.name, c.kind) for c in schema.columns]


def test_window_columns_leave_out_the_time_column() -> None:
    window = _window(label=pa.array([0.0, 1.0]), c0=pa.array([1, 2], pa.int32()))
    assert window_columns(window, "ts") == {"label": "double", "c0": "int32"}


def test_the_same_columns_keep_the_schema() -> None:
    window = _window(
        c1=pa.array([1, 2]), label=pa.array([0, 1], pa.int8()), d0=pa.array([True, False]), c0=pa.array([3, 4])
    )
    assert _names(adapt_schema(SCHEMA, window, "ts", "window 0")) == _names(SCHEMA)


def test_missing_columns_drop_and_new_ones_join_by_type() -> None:
    window = _window(
        label=pa.array([0.0, 1.0]),
        c0=pa.array([1, 2]),
        c9=pa.array([5, 6], pa.int16()),
        d7=pa.array([0.5, 1.5], pa.float32()),
    )
    got = adapt_schema(SCHEMA, window, "ts", "window 3")
    assert _names(got) == [
        ("label", ColumnKind.LABEL),
        ("d7", ColumnKind.DENSE),
        ("c0", ColumnKind.SPARSE),
        ("c9", ColumnKind.SPARSE),
    ]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"c0": pa.array([1, 2])}, "window 4: the label column 'label' is missing \\(window columns: \\['c0'\\]\\)"),
        (
            {"label": pa.array([0.0, 1.0]), "c0": pa.array([0.5, 1.5])},
            "window 4: column 'c0' is sparse in the loop's schema but holds double",
        ),
        ({"label": pa.array(["a", "b"])}, "window 4: column 'label' is label in the loop's schema but holds string"),
        (
            {"label": pa.array([0.0, 1.0]), "city": pa.array(["x", "y"])},
            "window 4: new column 'city' holds string; the loop takes new integer columns",
        ),
    ],
)
def test_refusals_name_the_window_and_column(columns: dict[str, pa.Array], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        adapt_schema(SCHEMA, _window(**columns), "ts", "window 4")


def test_describe_change() -> None:
    old = {"c0": "int64", "c1": "int64", "d0": "double"}
    assert describe_change(old, dict(old)) is None
    assert (
        describe_change(old, {"c0": "int32", "d0": "double", "c9": "int64"})
        == "new column c9 (int64); column c1 removed; column c0 retyped int64 -> int32"
    )
    assert describe_change({}, {}) is None


def test_window_schemas_adapts_each_window_and_names_it() -> None:
    windows = {0: _window(label=pa.array([0.0, 1.0]), c0=pa.array([1, 2])), 1: _window(c0=pa.array([1, 2]))}
    of = window_schemas(SCHEMA, windows.__getitem__, "ts")
    assert _names(of(0)) == [("label", ColumnKind.LABEL), ("c0", ColumnKind.SPARSE)]
    with pytest.raises(ValueError, match="window 1: the label column 'label' is missing"):
        of(1)
