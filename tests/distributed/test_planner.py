import math

import pytest

from hugerec.distributed.planner import (
    COUNTS_BYTES,
    Constraint,
    CostModel,
    Workload,
    estimate_bytes_sent,
    estimate_costs,
    expected_distinct,
    plan,
)
from hugerec.distributed.sharding_plan import ShardingKind, ShardingPlan, TablePlacement
from hugerec.embedding.optimizers import SGD, Adagrad, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Pooling, TableConfig


def test_expected_distinct() -> None:
    assert expected_distinct(10, 0) == 0
    assert math.isclose(expected_distinct(1000, 1), 1.0, rel_tol=1e-3)
    assert 9.99 < expected_distinct(10, 1000) <= 10


def test_estimate_table_wise_by_hand() -> None:
    t = TableConfig("t", num_rows=100, dim=8)
    p = ShardingPlan((t,), {"t": TablePlacement.table_wise(1)}, world_size=3)
    b, per = 16, 2.0
    sent = estimate_bytes_sent(p, Workload(b, per))
    ids = (b + b * per) * 8  # lengths + ids as int64
    vec = b * 8 * 4
    assert sent[0] == sent[2] == pytest.approx(ids + vec + 2 * COUNTS_BYTES)
    assert sent[1] == pytest.approx(2 * vec + 2 * COUNTS_BYTES)


def test_estimate_row_wise_and_column_wise() -> None:
    t = TableConfig("t", num_rows=90, dim=8, features=("a", "b"))
    rw = ShardingPlan((t,), {"t": TablePlacement.row_wise([0, 1, 2])}, world_size=3)
    cw = ShardingPlan((t,), {"t": TablePlacement.column_wise([0, 1])}, world_size=3)
    load = Workload(10, {"a": 3.0})  # b: 1 id per example
    per_feature_ids = {"a": 30.0, "b": 10.0}
    # row-wise: each rank sends a third of its ids to each of the 2 others, full-width partial sums
    exp_rw = sum(2 * ((10 + n / 3) * 8 + 10 * 8 * 4) + 2 * 10 * 8 * 4 for n in per_feature_ids.values())
    assert estimate_bytes_sent(rw, load) == pytest.approx([exp_rw + 2 * COUNTS_BYTES] * 3)
    # column-wise on 0, 1 of 3 ranks: every shard gets all ids, answers with D / 2 columns
    sent = estimate_bytes_sent(cw, load)
    to_one = sum((10 + n) * 8 + 10 * 4 * 4 for n in per_feature_ids.values())
    back = 2 * 10 * 4 * 4 * 2  # to 2 peers, 2 features
    assert sent[2] == pytest.approx(2 * to_one + 2 * COUNTS_BYTES)
    assert sent[0] == pytest.approx(to_one + back + 2 * COUNTS_BYTES)


def test_estimate_sequence_weights_and_data_parallel() -> None:
    seq = TableConfig("s", num_rows=50, dim=4, pooling=Pooling.NONE)
    dp = TableConfig("d", num_rows=20, dim=4)
    p = ShardingPlan((seq, dp), {"s": TablePlacement.table_wise(0), "d": TablePlacement.data_parallel(2)}, 2)
    costs = estimate_costs(p, Workload(8, 2.0, weighted=True))
    n = 16
    u = expected_distinct(20, n)
    dp_bytes = 8 + u * (8 + 4 * 4)
    assert costs[1].bytes_sent == pytest.approx((8 + n) * 8 + n * 4 + n * 4 * 4 + COUNTS_BYTES + dp_bytes)
    assert costs[0].bytes_sent == pytest.approx(n * 4 * 4 + COUNTS_BYTES + dp_bytes)
    assert costs[0].memory > costs[1].memory > 0
    only_dp = ShardingPlan((dp,), {"d": TablePlacement.data_parallel(2)}, 2)
    assert estimate_bytes_sent(only_dp, Workload(8, 2.0)) == pytest.approx([dp_bytes] * 2)  # no counts exchange


def test_planner_picks_kinds_by_size() -> None:
    tables = [
        TableConfig("huge", num_rows=4_000_000, dim=32),
        TableConfig("mid", num_rows=20_000, dim=32),
        TableConfig("tiny", num_rows=20, dim=32),
    ]
    p = plan(tables, world_size=2, memory_per_rank=400 << 20, load=Workload(4096), optimizer=RowWiseAdagrad())
    kinds = {n: pl.kind for n, pl in p.placements.items()}
    # huge does not fit one rank (4M x (32 + 1) x 4 B = 503 MiB): split; RowWiseAdagrad avoids column-wise
    assert kinds["huge"] is ShardingKind.ROW_WISE
    assert kinds["tiny"] is ShardingKind.DATA_PARALLEL  # 20 distinct rows beat 4096 vectors
    assert kinds["mid"] is ShardingKind.TABLE_WISE
    assert [line.split(":")[0] for line in p.notes[:3]] == ["huge", "mid", "tiny"]
    assert "the only placement that fits" in p.notes[0] and "estimated per step" in p.notes[-1]
    assert all(b <= 400 << 20 for b in p.bytes_per_rank())
    # an optimizer without the row-wise caveat may split columns: less traffic than row-wise partial sums
    q = plan(tables, world_size=2, memory_per_rank=600 << 20, load=Workload(4096), optimizer=Adagrad())
    assert q.placements["huge"].kind is ShardingKind.COLUMN_WISE


def test_free_communication_spreads_every_table() -> None:
    tables = [TableConfig(f"t{i}", num_rows=50_000, dim=16) for i in range(3)]
    p = plan(tables, world_size=3, load=Workload(512), optimizer=SGD(), cost=CostModel(comm_bytes_per_s=1e12))
    assert all(pl.kind is ShardingKind.ROW_WISE and len(pl.ranks) == 3 for pl in p.placements.values())


def test_planner_balances_table_wise() -> None:
    tables = [TableConfig(f"t{i}", num_rows=50_000, dim=16) for i in range(6)]
    pins = {t.name: Constraint(kind=ShardingKind.TABLE_WISE) for t in tables}
    p = plan(tables, world_size=3, load=Workload(512), optimizer=SGD(), constraints=pins)
    per_rank = [sum(1 for pl in p.placements.values() if pl.ranks == (r,)) for r in range(3)]
    assert per_rank == [2, 2, 2]


def test_constraints_are_honoured() -> None:
    tables = [TableConfig("a", 1000, 8), TableConfig("b", 1000, 8), TableConfig("h", 1000, 8, dynamic=DynamicConfig())]
    p = plan(
        tables,
        world_size=3,
        constraints={
            "a": Constraint(kind=ShardingKind.TABLE_WISE, ranks=(2,)),
            "b": Constraint(kind=ShardingKind.COLUMN_WISE),
            "h": Constraint(ranks=(0, 1)),
        },
    )
    assert p.placements["a"] == TablePlacement.table_wise(2)
    assert p.placements["b"].kind is ShardingKind.COLUMN_WISE and 8 % len(p.placements["b"].ranks) == 0
    assert set(p.placements["h"].ranks) <= {0, 1}
    assert p.placements["h"].kind is not ShardingKind.DATA_PARALLEL
    assert "pinned (table_wise, ranks [2])" in "\n".join(p.notes)


def test_planner_errors() -> None:
    t = TableConfig("big", num_rows=1_000_000, dim=64)
    with pytest.raises(ValueError, match=r"table 'big' \(1000000 rows x 64.*fits nowhere.*row_wise on ranks 0,1"):
        plan([t], world_size=2, memory_per_rank=10 << 20, optimizer=SGD())
    with pytest.raises(ValueError, match=r"constraints for unknown tables \['nope'\]"):
        plan([t], world_size=2, constraints={"nope": Constraint()})
    with pytest.raises(ValueError, match=r"names rank\(s\) \[5\]"):
        plan([t], world_size=2, constraints={"big": Constraint(ranks=(5,))})
    with pytest.raises(ValueError, match="no placement satisfies its constraint"):
        plan(
            [TableConfig("d", 10, 4, dynamic=DynamicConfig())],
            2,
            constraints={"d": Constraint(ShardingKind.DATA_PARALLEL)},
        )
    with pytest.raises(ValueError, match="does not divide its dim 64"):
        plan([t], world_size=3, constraints={"big": Constraint(ShardingKind.COLUMN_WISE, (0, 1, 2))})
    with pytest.raises(ValueError, match="batch_size"):
        Workload(0)
    with pytest.raises(ValueError, match="ids_per_sample"):
        Workload(8, {"a": -1.0})
    with pytest.raises(ValueError, match="throughputs"):
        CostModel(comm_bytes_per_s=0)


def test_plan_round_trips() -> None:
    tables = [TableConfig("a", 1000, 8), TableConfig("b", 30, 8)]
    p = plan(tables, world_size=2, optimizer=Adagrad())
    assert ShardingPlan.from_json(p.to_json()) == p


def test_row_wise_mean_sends_a_count_per_bag() -> None:
    sum_t = TableConfig("t", num_rows=90, dim=8)
    mean_t = TableConfig("t", num_rows=90, dim=8, pooling=Pooling.MEAN)
    place = {"t": TablePlacement.row_wise([0, 1, 2])}
    load = Workload(10)
    extra = [
        m - s
        for m, s in zip(
            estimate_bytes_sent(ShardingPlan((mean_t,), place, 3), load),
            estimate_bytes_sent(ShardingPlan((sum_t,), place, 3), load),
            strict=True,
        )
    ]
    # to each of 2 peers: one fp32 count per bag, forward and (as a zero gradient) backward
    assert extra == pytest.approx([2 * 2 * 10 * 4] * 3)
