"""Windows over an int64 seconds column: window k is [k * length, (k + 1) * length), rows ordered by time,
from memory or Parquet files (each file with its own columns); the seeded holdout is the same rows every time;
a window as Batches; bad settings and tables refused naming the value or column."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.data.schema import Column, ColumnKind, Schema
from hugerec.data.windows import Windows, WindowUnit, holdout_mask, split_holdout, table_batches

DAY = 86400


def _table(ts: list[int]) -> pa.Table:
    return pa.table(
        {"ts": pa.array(ts, pa.int64()), "label": [float(i % 2) for i in range(len(ts))], "c0": list(range(len(ts)))}
    )


def test_units_sizes_index_and_bounds() -> None:
    quarter = Windows(unit="minute", size=15)  # type: ignore[arg-type]  # a string as configs give it
    assert quarter.unit is WindowUnit.MINUTE and quarter.seconds == 900
    assert quarter.index(np.array([0, 899, 900, -1])).tolist() == [0, 0, 1, -1]
    assert Windows().bounds(2) == (2 * DAY, 3 * DAY)
    assert Windows(unit=WindowUnit.HOUR, size=2).bounds(1) == (7200, 14400)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unit": "week"}, "unit must be 'day', 'hour' or 'minute', got 'week'"),
        ({"time_column": ""}, "time_column must be a column name, got an empty string"),
        ({"size": 0}, "size must be >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Windows(**kwargs)  # type: ignore[arg-type]


def test_select_picks_the_window_in_time_order() -> None:
    table = _table([DAY + 5, 10, DAY, 2 * DAY, DAY - 1, DAY + 1])
    got = Windows().select(table, 1)
    assert got["ts"].to_pylist() == [DAY, DAY + 1, DAY + 5]
    assert Windows().select(table, 0, count=2)["ts"].to_pylist() == [10, DAY - 1, DAY, DAY + 1, DAY + 5]
    assert Windows().select(table, 7).num_rows == 0
    with pytest.raises(ValueError, match=r"Windows.select: no time column 'time'; columns are \['ts', 'label', 'c0'\]"):
        Windows(time_column="time").select(table, 0)
    with pytest.raises(ValueError, match="time column 'ts' must hold integer seconds, got double"):
        Windows().select(pa.table({"ts": [1.5]}), 0)


def test_read_from_files_keeps_each_files_columns(tmp_path: Path) -> None:
    pq.write_table(_table([5, DAY + 3]), tmp_path / "a.parquet")
    later = _table([DAY + 1, 2 * DAY + 2]).append_column("c9", pa.array([7, 8]))
    pq.write_table(later, tmp_path / "b.parquet")
    windows = Windows()
    day1 = windows.read(tmp_path, 1)
    assert day1["ts"].to_pylist() == [DAY + 1, DAY + 3] and day1["c9"].to_pylist() == [7, None]
    assert "c9" not in windows.read(tmp_path, 0).column_names  # only the first file holds day 0
    assert windows.read(tmp_path, 9).num_rows == 0
    assert windows.present(tmp_path / "a.parquet") == [0, 1]
    pq.write_table(pa.table({"x": [1]}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match=r"c\.parquet has no time column 'ts'"):
        windows.read(tmp_path, 0)


def test_the_holdout_is_the_same_rows_every_time() -> None:
    a, b = holdout_mask(1000, 0.2, seed=3), holdout_mask(1000, 0.2, seed=3)
    np.testing.assert_array_equal(a, b)
    assert 150 < a.sum() < 250 and not np.array_equal(a, holdout_mask(1000, 0.2, seed=4))
    assert holdout_mask(0, 0.5, 0).shape == (0,)
    train, held = split_holdout(_table(list(range(100))), 0.3, seed=1)
    assert train.num_rows + held.num_rows == 100
    assert set(train["ts"].to_pylist()).isdisjoint(held["ts"].to_pylist())
    for share in (0.0, 1.0):
        with pytest.raises(ValueError, match=f"share must be in \\(0, 1\\), got {share}"):
            holdout_mask(10, share, 0)


def test_table_batches() -> None:
    schema = Schema((Column("label", ColumnKind.LABEL), Column("c0", ColumnKind.SPARSE, cardinality=10)))
    table = _table(list(range(5)))
    batches = table_batches(table, schema, batch_size=2)
    assert [b.batch_size for b in batches] == [2, 2, 1]
    assert [v for b in batches for v in b.sparse["c0"].values.tolist()] == [0, 1, 2, 3, 4]
    assert [v for b in batches for v in b.labels.tolist()] == [0.0, 1.0, 0.0, 1.0, 0.0]
    shuffled = table_batches(table, schema, batch_size=5, shuffle=True, seed=0)[0]
    assert sorted(shuffled.sparse["c0"].values.tolist()) == [0, 1, 2, 3, 4]
    assert (shuffled.labels.numpy() == (shuffled.sparse["c0"].values.numpy() % 2)).all()  # rows stay whole
    assert table_batches(table.slice(0, 0), schema, batch_size=2) == []
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        table_batches(table, schema, batch_size=0)
    with pytest.raises(ValueError, match=r"the window lacks columns \['c0'\] of the schema"):
        table_batches(table.drop(["c0"]), schema, batch_size=2)
