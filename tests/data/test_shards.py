from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hugerec.data.shards import ShardWriter, count_rows, expand_paths, split_shards


def _groups(paths: list[Path]) -> list[list[int]]:
    return [
        [pq.ParquetFile(p).metadata.row_group(i).num_rows for i in range(pq.ParquetFile(p).num_row_groups)]
        for p in paths
    ]


def _rows(paths: list[Path]) -> list[int]:
    return [v for p in paths for v in pq.read_table(p)["v"].to_pylist()]


@pytest.mark.parametrize(
    ("rows", "layout"),
    [
        (6, [[2, 2], [2]]),  # full groups, the last one short, files of 4 rows
        (1, [[1]]),  # a dataset smaller than one group: as many groups as rows, up to min_row_groups
        (0, []),
    ],
)
def test_layout(tmp_path: Path, rows: int, layout: list[list[int]]) -> None:
    with ShardWriter(tmp_path, rows_per_file=4, row_group_rows=2, min_row_groups=3) as w:
        for start in range(0, rows, 3):
            w.write(pa.table({"v": np.arange(start, min(start + 3, rows))}))
    assert _groups(w.paths) == layout and _rows(w.paths) == list(range(rows))


def test_a_dataset_smaller_than_one_row_group_is_cut_for_sharding(tmp_path: Path) -> None:
    with ShardWriter(tmp_path, row_group_rows=1 << 16) as w:
        w.write(pa.table({"v": np.arange(1001)}))
    assert _groups(w.paths) == [[125, 125, 125, 125, 125, 125, 125, 126]]
    assert _rows(w.paths) == list(range(1001))
    with ShardWriter(tmp_path / "one", row_group_rows=1 << 16, min_row_groups=1) as w:
        w.write(pa.table({"v": np.arange(1001)}))
    assert _groups(w.paths) == [[1001]]


def test_bad_settings_and_paths(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="min_row_groups must be >= 1, got 0"):
        ShardWriter(tmp_path, min_row_groups=0)
    with pytest.raises(ValueError, match=r"rows_per_file \(3\) must be a positive multiple of row_group_rows \(2\)"):
        ShardWriter(tmp_path, rows_per_file=3, row_group_rows=2)
    (tmp_path / "schema.json").write_text("{}")
    with pytest.raises(ValueError, match="no Parquet files match"):
        expand_paths(tmp_path)


def test_split_shards_is_a_seeded_partition_of_the_rows(tmp_path: Path) -> None:
    src = tmp_path / "all"
    with ShardWriter(src, rows_per_file=400, row_group_rows=100) as w:
        w.write(pa.table({"x": np.arange(1000)}))
    n_train, n_eval = split_shards(src, tmp_path / "t", tmp_path / "e", 0.2, seed=3)
    assert (count_rows(tmp_path / "t"), count_rows(tmp_path / "e")) == (n_train, n_eval)
    assert n_train + n_eval == 1000 and 120 < n_eval < 280
    got = np.concatenate([pq.read_table(f)["x"].to_numpy() for d in ("t", "e") for f in expand_paths(tmp_path / d)])
    assert sorted(got.tolist()) == list(range(1000))  # every row once
    again = split_shards(src, tmp_path / "t2", tmp_path / "e2", 0.2, seed=3)
    assert again == (n_train, n_eval)
    assert pq.read_table(expand_paths(tmp_path / "e2")).equals(pq.read_table(expand_paths(tmp_path / "e")))
    with pytest.raises(ValueError, match="eval_fraction must be in"):
        split_shards(src, tmp_path / "t3", tmp_path / "e3", 1.0)
