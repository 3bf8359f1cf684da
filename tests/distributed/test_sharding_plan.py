import itertools

import pytest

from hugerec.distributed.sharding_plan import (
    DYNAMIC_ROW_OVERHEAD_BYTES,
    ShardingKind,
    ShardingPlan,
    TablePlacement,
    format_bytes,
    row_bounds,
    shard_bytes,
    table_shards,
)
from hugerec.embedding.optimizers import SGD, Adagrad, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Missing, StorageDtype, TableConfig

TABLES = (
    TableConfig("user", num_rows=10, dim=8, features=("user_id",)),
    TableConfig("item", num_rows=7, dim=4, optimizer=Adagrad()),
    TableConfig("hashed", num_rows=9, dim=4, dynamic=DynamicConfig()),
    TableConfig("small", num_rows=3, dim=6, dtype=StorageDtype.FP16),
    TableConfig("unknown", num_rows=5, dim=2, dynamic=DynamicConfig(missing=Missing.UNKNOWN_ROW)),
)


def mixed_plan(**kw: object) -> ShardingPlan:
    return ShardingPlan(
        TABLES,
        {
            "user": TablePlacement.row_wise([0, 1, 2]),
            "item": TablePlacement.column_wise([2, 1]),
            "hashed": TablePlacement.row_wise([1, 0]),
            "small": TablePlacement.data_parallel(3),
            "unknown": TablePlacement.table_wise(0),
        },
        world_size=3,
        optimizer=RowWiseAdagrad(),
        **kw,  # type: ignore[arg-type]
    )


def test_row_bounds_balanced() -> None:
    assert row_bounds(10, 3) == [0, 3, 6, 10]
    assert row_bounds(4, 4) == [0, 1, 2, 3, 4]
    for r in range(1, 30):
        for k in range(1, r + 1):
            b = row_bounds(r, k)
            sizes = [b[i + 1] - b[i] for i in range(k)]
            assert sum(sizes) == r and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_shards_of_each_kind() -> None:
    p = mixed_plan()
    assert [(s.rank, s.row_start, s.num_rows, s.col_start, s.dim) for s in p.shards("user")] == [
        (0, 0, 3, 0, 8),
        (1, 3, 3, 0, 8),
        (2, 6, 4, 0, 8),
    ]
    assert [(s.rank, s.col_start, s.dim, s.num_rows) for s in p.shards("item")] == [(2, 0, 2, 7), (1, 2, 2, 7)]
    # dynamic row-wise: hash-partitioned keys, each shard with capacity ceil(9 / 2)
    assert [(s.rank, s.index, s.num_rows) for s in p.shards("hashed")] == [(1, 0, 5), (0, 1, 5)]
    assert [s.rank for s in p.shards("small")] == [0, 1, 2]
    assert [(s.table, s.rank) for s in p.shards_on(1)] == [("user", 1), ("item", 1), ("hashed", 1), ("small", 1)]
    assert [(s.table, s.rank) for s in p.shards_on(0)][-1] == ("unknown", 0)


def test_bytes_include_optimizer_state() -> None:
    user, item, hashed, small, _ = TABLES
    p = mixed_plan()
    # user: 3 rows x (8 fp32 + 1 row-wise adagrad accumulator)
    assert shard_bytes(user, p.shards("user")[0], RowWiseAdagrad()) == 3 * (8 * 4 + 4)
    # item overrides the optimizer: Adagrad keeps D values per row, here per column shard of 2
    assert shard_bytes(item, p.shards("item")[0], RowWiseAdagrad()) == 7 * (2 * 4 + 2 * 4)
    assert shard_bytes(hashed, p.shards("hashed")[0], SGD()) == 5 * (4 * 4 + DYNAMIC_ROW_OVERHEAD_BYTES)
    assert shard_bytes(small, p.shards("small")[0], SGD()) == 3 * 6 * 2
    # no optimizer known at all: the largest state (Adam, 2 D) is assumed
    assert shard_bytes(user, p.shards("user")[0], None) == 3 * (8 * 4 + 16 * 4)
    per_rank = p.bytes_per_rank()
    assert sum(per_rank) == sum(shard_bytes(t, s, RowWiseAdagrad()) for t in TABLES for s in p.shards(t.name))


def test_json_round_trip_and_str() -> None:
    p = mixed_plan(memory_per_rank=1 << 20, notes=("hand written",))
    q = ShardingPlan.from_json(p.to_json())
    assert q == p
    assert q.placements["item"].kind is ShardingKind.COLUMN_WISE
    text = str(p)
    lines = text.splitlines()
    assert lines[0].split(" | ")[:3] == ["table  ", "kind         ", "ranks"]
    assert any(line.startswith("user ") and "row_wise" in line and "0,1,2" in line for line in lines)
    assert "(total)" in text and "hand written" in text and "1.0 MiB" in text
    assert format_bytes(3 * 36) in text


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 << 30) == "3.0 GiB"


@pytest.mark.parametrize(
    ("placements", "match"),
    [
        ({"user": TablePlacement.table_wise(3)}, r"rank\(s\) \[3\].*world_size=3"),
        ({"user": TablePlacement.row_wise([0, -1])}, r"rank\(s\) \[-1\]"),
        ({"item": TablePlacement.column_wise([0, 1, 2])}, r"does not divide its dim 4"),
        ({"small": TablePlacement.row_wise([0, 1, 2, 3][:3]), "user": TablePlacement.data_parallel(2)}, "all 3 ranks"),
        ({"hashed": TablePlacement.data_parallel(3)}, "dynamic table 'hashed' cannot be data-parallel"),
        ({"unknown": TablePlacement.row_wise([0, 1])}, "every shard would train its own unknown row"),
    ],
)
def test_bad_plans_are_refused(placements: dict[str, TablePlacement], match: str) -> None:
    base = dict(mixed_plan().placements)
    base.update(placements)
    with pytest.raises(ValueError, match=match):
        ShardingPlan(TABLES, base, world_size=3)


def test_row_wise_needs_enough_rows() -> None:
    t = TableConfig("t", num_rows=2, dim=4)
    with pytest.raises(ValueError, match="2 rows, too few for 3 row shards"):
        ShardingPlan((t,), {"t": TablePlacement.row_wise([0, 1, 2])}, world_size=3)


def test_missing_and_unknown_placements() -> None:
    with pytest.raises(ValueError, match=r"without a placement \['item'"):
        ShardingPlan(TABLES[:2], {"user": TablePlacement.table_wise(0), "nope": TablePlacement.table_wise(0)}, 1)


def test_memory_limit() -> None:
    p = mixed_plan()
    most = max(p.bytes_per_rank())
    mixed_plan(memory_per_rank=most)  # exactly enough
    with pytest.raises(ValueError, match="exceeds memory_per_rank"):
        mixed_plan(memory_per_rank=most - 1)


def test_placement_validation() -> None:
    with pytest.raises(ValueError, match="exactly one rank"):
        TablePlacement(ShardingKind.TABLE_WISE, (0, 1))
    with pytest.raises(ValueError, match="distinct"):
        TablePlacement.row_wise([1, 1])
    with pytest.raises(ValueError, match="at least one rank"):
        TablePlacement.column_wise([])
    assert TablePlacement("row_wise", [0, 1]).kind is ShardingKind.ROW_WISE  # type: ignore[arg-type]


def test_table_shards_cover_the_table() -> None:
    t = TableConfig("t", num_rows=11, dim=12)
    for k in (1, 2, 3, 4):
        rw = table_shards(t, TablePlacement.row_wise(list(range(k))))
        assert sum(s.num_rows for s in rw) == 11 and rw[0].row_start == 0
        assert all(a.row_start + a.num_rows == b.row_start for a, b in itertools.pairwise(rw))
        cw = table_shards(t, TablePlacement.column_wise(list(range(k))))
        assert [s.col_start for s in cw] == [i * 12 // k for i in range(k)] and sum(s.dim for s in cw) == 12
