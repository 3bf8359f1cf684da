import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hugerec.distributed.routing import Routing, bucketize, key_shard, receive, regroup
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement, row_bounds
from hugerec.embedding.table_config import DynamicConfig, Pooling, TableConfig
from hugerec.sparse.features import SparseFeatures

TABLES = (
    TableConfig("a", 10, 4, features=("a1", "a2")),
    TableConfig("b", 7, 4),
    TableConfig("h", 9, 4, dynamic=DynamicConfig()),
    TableConfig("s", 5, 2, pooling=Pooling.NONE),
    TableConfig("d", 3, 2),
)
PLAN = ShardingPlan(
    TABLES,
    {
        "a": TablePlacement.row_wise([0, 1, 2]),
        "b": TablePlacement.column_wise([2, 1]),
        "h": TablePlacement.row_wise([1, 0]),
        "s": TablePlacement.row_wise([0, 2]),
        "d": TablePlacement.data_parallel(3),
    },
    world_size=3,
)
ROWS = {"a1": 10, "a2": 10, "b": 7, "h": 1 << 40, "s": 5, "d": 3}


def test_routes_per_rank() -> None:
    rt = Routing(PLAN)
    assert [[(r.feature, r.shard.index) for r in s] for s in rt.serve] == [
        [("a1", 0), ("a2", 0), ("h", 1)],
        [("a1", 1), ("a2", 1), ("b", 1), ("h", 0)],
        [("a1", 2), ("a2", 2), ("b", 0)],
    ]
    assert "d" not in rt.by_feature  # data-parallel tables are looked up locally
    seq = Routing(PLAN, sequence=True)
    assert [[(r.feature, r.shard.index) for r in s] for s in seq.serve] == [[("s", 0)], [], [("s", 1)]]


def test_regroup() -> None:
    values = torch.arange(10)
    sizes = torch.tensor([[1, 2], [3, 0], [0, 4]])  # 3 sources, 2 routes
    # source-major segments: s0e0=[0] s0e1=[1,2] s1e0=[3,4,5] s1e1=[] s2e0=[] s2e1=[6,7,8,9]
    assert regroup(values, sizes).tolist() == [0, 3, 4, 5, 1, 2, 6, 7, 8, 9]
    assert regroup(torch.zeros(0), torch.zeros(2, 0, dtype=torch.int64)).numel() == 0


def test_key_shard_is_spread_and_stable() -> None:
    keys = torch.arange(-5000, 5000)
    s = key_shard(keys, 3)
    assert s.min() >= 0 and s.max() <= 2
    assert torch.bincount(s, minlength=3).min() > 3000
    assert torch.equal(key_shard(keys, 3), s)


def _batch(draw: st.DrawFn, b: int, weighted: bool) -> SparseFeatures:
    lists = {f: [draw(st.lists(st.integers(0, rows - 1), max_size=4)) for _ in range(b)] for f, rows in ROWS.items()}
    weights = {f: [[float(i + 1) for i in range(len(bag))] for bag in bags] for f, bags in lists.items()}
    return SparseFeatures.from_lists(lists, weights if weighted else None)


@st.composite
def batches(draw: st.DrawFn) -> list[SparseFeatures]:
    weighted = draw(st.booleans())
    return [_batch(draw, draw(st.integers(0, 4)), weighted) for _ in range(3)]


@settings(max_examples=25, deadline=None)
@given(batches())
def test_bucketize_then_receive_reassembles_every_bag(sources: list[SparseFeatures]) -> None:
    """Simulate the all_to_all: what every shard receives, put back together, is each rank's batch."""
    for rt in (Routing(PLAN), Routing(PLAN, sequence=True)):
        _check_reassembly(rt, sources)


def _check_reassembly(rt: Routing, sources: list[SparseFeatures]) -> None:
    bk = [bucketize(x, rt) for x in sources]
    got: dict[tuple[str, int], SparseFeatures] = {}
    for d in range(3):
        parts, wparts = [], []
        for s in range(3):
            off = sum(bk[s].send[:d])
            parts.append(bk[s].ids[off : off + bk[s].send[d]])
            if bk[s].weights is not None:
                woff = sum(bk[s].send_values[:d])
                wparts.append(bk[s].weights[woff : woff + bk[s].send_values[d]])
        weights = torch.cat(wparts) if sources[0].weights is not None else None
        sf, sizes = receive(
            torch.cat(parts), weights, [x.batch_size for x in sources], [b.send_values[d] for b in bk], rt.serve[d]
        )
        assert sf.batch_size == (sum(x.batch_size for x in sources) if rt.serve[d] else 0)
        assert sizes.shape == (3, len(rt.serve[d]))
        for r in rt.serve[d]:
            got[r.feature, r.shard.index] = sf
    starts = [0, sources[0].batch_size, sources[0].batch_size + sources[1].batch_size]
    for f, routes in rt.by_feature.items():
        r0 = routes[0]
        for s, src in enumerate(sources):
            want = _pairs(src, f, 0, src.batch_size)
            rebuilt: list[list[tuple[int, float]]] = [[] for _ in want]
            for r in routes:
                bags = _pairs(got[f, r.shard.index], f, starts[s], src.batch_size)
                if r0.kind.value != "row_wise":
                    assert bags == want  # every shard of a table-/column-wise table sees every id
                    continue
                for i, bag in enumerate(bags):
                    if r.table.dynamic is None:
                        lo = row_bounds(r.table.num_rows, r0.num_shards)[r.shard.index]
                        assert all(0 <= x < r.shard.num_rows for x, _ in bag)
                        bag = [(x + lo, w) for x, w in bag]
                    else:
                        assert all(int(key_shard(torch.tensor([x]), r0.num_shards)) == r.shard.index for x, _ in bag)
                    rebuilt[i].extend(bag)
            if r0.kind.value == "row_wise":
                assert [sorted(x) for x in rebuilt] == [sorted(x) for x in want]


def _pairs(sf: SparseFeatures, f: str, start: int, count: int) -> list[list[tuple[int, float]]]:
    """Bags start..start+count of feature f as (id, weight) lists (weight 1 without weights)."""
    j = sf[f]
    ids = j.values.tolist()
    w = [1.0] * len(ids) if j.weights is None else j.weights.tolist()
    o = j.offsets().tolist()
    return [list(zip(ids[o[i] : o[i + 1]], w[o[i] : o[i + 1]], strict=True)) for i in range(start, start + count)]


def test_bad_ids_and_missing_features_raise_before_sending() -> None:
    rt = Routing(PLAN)
    ok = {f: [[0]] for f in ROWS}
    bucketize(SparseFeatures.from_lists(ok), rt)
    with pytest.raises(ValueError, match=r"feature 'a2' of table 'a': id 10 is outside the table's rows \[0, 10\)"):
        bucketize(SparseFeatures.from_lists(dict(ok, a2=[[10]])), rt)
    with pytest.raises(ValueError, match=r"id -1 is outside"):
        bucketize(SparseFeatures.from_lists(dict(ok, b=[[-1]])), rt)
    del ok["b"]
    with pytest.raises(ValueError, match=r"lacks features \['b'\]"):
        bucketize(SparseFeatures.from_lists(ok), rt)
