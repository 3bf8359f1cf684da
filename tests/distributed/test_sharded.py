"""Sharded training == single-process training on the same global batches, for every kind and a mixed plan.

One spawn per world size runs every plan (3 steps each) and returns what each rank holds; the parent
trains the unsharded model once on the concatenated batches and compares every table's weights,
optimizer state and Adam steps, every dynamic table's key -> vector map, and the dense weights.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch
from torch import nn

from hugerec.distributed.launch import spawn
from hugerec.distributed.shard import prefetching, shard, sharded_collections
from hugerec.distributed.sharding_plan import ShardingKind, ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Pooling, TableConfig, Zeros
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor

TABLES = (
    TableConfig("a", 23, 4, features=("a1", "a2"), optimizer=RowWiseAdagrad(lr=0.2)),
    TableConfig("b", 17, 4, pooling=Pooling.MEAN, optimizer=Adam(lr=0.05)),
    TableConfig("c", 9, 4, optimizer=SGD(lr=0.3, weight_decay=0.01)),
    TableConfig("f", 11, 4, optimizer=Ftrl(lr=0.3)),
    TableConfig("s", 12, 4, pooling=Pooling.NONE),
    # dynamic: row-wise shards hand out their own rows, so new keys start from zeros to compare exactly
    TableConfig("h", 40, 4, pooling=Pooling.MEAN, init=Zeros(), dynamic=DynamicConfig()),
    TableConfig("g", 30, 4, dynamic=DynamicConfig()),  # random init: table- and column-wise only
)
FEATURES = {"a1": 23, "a2": 23, "b": 17, "c": 9, "f": 11, "s": 12, "h": 1 << 40, "g": 1 << 40}
DYNAMIC = ("h", "g")
STEPS, BATCH, DENSE = 3, 5, 2


class Tiny(nn.Module):
    """Pooled features and the summed sequence vectors -> a linear logit (model code knows no ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(TABLES, Adagrad(lr=0.2))
        self.top = nn.Linear(DENSE + self.emb.output_dim + 4, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        pooled = self.emb(batch.sparse).values  # [B, 24]
        seq = self.emb.sequences(batch.sparse)["s"]
        b = batch.batch_size
        bags = torch.repeat_interleave(torch.arange(b), seq.lengths.to(torch.int64))
        summed = torch.zeros(b, 4).index_add(0, bags, seq.values)  # [N, 4] -> [B, 4]
        x = torch.cat([batch.dense, pooled, summed], dim=1)
        return self.top(torch.tanh(x)).squeeze(1)


def rank_batches(rank: int, b: int = BATCH) -> list[Batch]:
    """This rank's batches; step 1 carries per-id weights (all ranks alike)."""
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for step in range(STEPS):
        lists: dict[str, list[list[int]]] = {}
        for f, rows in FEATURES.items():
            hi = 25 if f in DYNAMIC else rows  # dynamic keys: raw, sparse over a wide range
            lists[f] = [
                [
                    int(x) * (1 << 20 if f in DYNAMIC else 1)
                    for x in torch.randint(0, hi, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g)
                ]
                for _ in range(b)
            ]
        weights = None
        if step == 1:
            weights = {f: [[0.5 + 0.25 * i for i in range(len(bag))] for bag in bags] for f, bags in lists.items()}
        sf = SparseFeatures.from_lists(lists, weights)
        out.append(Batch(torch.randn(b, DENSE, generator=g), sf, torch.randint(0, 2, (b,), generator=g).float()))
    return out


def global_batch(parts: list[Batch]) -> Batch:
    keys = parts[0].sparse.keys
    jagged = {}
    for k in keys:
        js = [p.sparse[k] for p in parts]
        w = None if js[0].weights is None else torch.cat([j.weights for j in js if j.weights is not None])
        jagged[k] = JaggedTensor(torch.cat([j.values for j in js]), torch.cat([j.lengths for j in js]), w)
    sf = SparseFeatures.from_jagged(jagged)
    return Batch(torch.cat([p.dense for p in parts]), sf, torch.cat([p.labels for p in parts]))


def train(model: nn.Module, batches: Iterable[Batch]) -> None:
    dense = [p for n, p in model.named_parameters() if "top" in n]
    opt = torch.optim.SGD(dense, lr=0.3)
    for batch in batches:
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def plans(world: int) -> list[ShardingPlan]:
    ranks = list(range(world))
    last = world - 1

    def make(**placements: TablePlacement) -> ShardingPlan:
        return ShardingPlan(TABLES, placements, world)

    return [
        # every static table replicated (dynamic tables cannot be)
        make(
            **{t.name: TablePlacement.data_parallel(world) for t in TABLES if t.dynamic is None},
            h=TablePlacement.table_wise(last),
            g=TablePlacement.table_wise(0),
        ),
        make(
            a=TablePlacement.table_wise(last),
            b=TablePlacement.table_wise(0),
            c=TablePlacement.table_wise(1),
            f=TablePlacement.table_wise(0),
            s=TablePlacement.table_wise(last),
            h=TablePlacement.table_wise(1),
            g=TablePlacement.table_wise(last),
        ),
        make(
            **{
                t.name: TablePlacement.row_wise(ranks[::-1] if t.name in "bh" else ranks)
                for t in TABLES
                if t.name != "g"
            },
            g=TablePlacement.column_wise(ranks[:2]),
        ),
        # column-wise everywhere but RowWiseAdagrad's table (its column shards keep their own accumulators)
        make(
            **{t.name: TablePlacement.column_wise([last, 0]) for t in TABLES if t.name != "a"},
            a=TablePlacement.table_wise(0),
        ),
        make(
            a=TablePlacement.row_wise([0, 1]),  # on 3 ranks: table-wise-row-wise
            b=TablePlacement.data_parallel(world),
            c=TablePlacement.column_wise([1, 0]),
            f=TablePlacement.table_wise(last),
            s=TablePlacement.row_wise(ranks[::-1]),
            h=TablePlacement.row_wise(ranks),
            g=TablePlacement.table_wise(1),
        ),
    ]


def holdings(model: nn.Module) -> dict[str, Any]:
    """What this rank holds: per table its shards' fields (dynamic: key -> fields), and the dense weights."""
    (sharded,) = sharded_collections(model)
    tables: dict[str, list[dict[str, Any]]] = {}
    for p in sharded.placed:
        name = p.table.name
        fields = {
            k[len(f"tables.{name}.") :]: v.clone()
            for k, v in p.local.state_dict().items()
            if k.startswith(f"tables.{name}.") and ".hash_table." not in k
        }
        entry: dict[str, Any] = {"index": p.shard.index, "kind": p.kind, "fields": fields}
        if p.table.dynamic is not None:
            held = p.local.hash_tables[name].export()
            entry["keys"] = held.keys
            entry["rows"] = held.rows
        tables.setdefault(name, []).append(entry)
    top = {k: v.clone() for k, v in model.module.top.state_dict().items()}
    return {"tables": tables, "top": top, "bytes": sharded.stats.bytes_sent}


def _run_plans(rank: int, world: int, plan_json: list[str]) -> list[dict[str, Any]]:
    out = []
    for i, pj in enumerate(plan_json):
        torch.manual_seed(0)
        model = shard(Tiny(), ShardingPlan.from_json(pj))
        batches = rank_batches(rank)
        # the mixed plan trains with each batch's ids exchanged a step ahead
        train(model, prefetching(model, batches) if i == len(plan_json) - 1 else batches)
        out.append(holdings(model))
    return out


def _by_key(keys: torch.Tensor, rows: torch.Tensor, v: torch.Tensor) -> dict[int, torch.Tensor]:
    return {int(k): v[int(r)] for k, r in zip(keys, rows, strict=True)}


def assemble(plan: ShardingPlan, per_rank: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The whole table from its shards (replicas checked identical)."""
    entries = sorted((e for r in per_rank for e in r["tables"].get(name, [])), key=lambda e: e["index"])
    kind = plan.placements[name].kind
    if kind is ShardingKind.DATA_PARALLEL:
        for e in entries[1:]:
            for k, v in e["fields"].items():
                assert torch.equal(v, entries[0]["fields"][k]), f"replicas of {name} differ in {k}"
        entries = entries[:1]
    if "keys" in entries[0]:  # dynamic: key -> each field's row
        merged: dict[str, dict[int, torch.Tensor]] = {}
        for field in entries[0]["fields"]:
            if field == "step":
                continue
            maps = [_by_key(e["keys"], e["rows"], e["fields"][field]) for e in entries]
            if kind is ShardingKind.COLUMN_WISE and entries[0]["fields"][field].dim() == 2:
                assert all(set(m) == set(maps[0]) for m in maps), f"{name}: column shards hold different keys"
                merged[field] = {k: torch.cat([m[k] for m in maps]) for k in maps[0]}
            else:
                merged[field] = {k: v for m in maps for k, v in m.items()}
        return merged
    out = {}
    for field in entries[0]["fields"]:
        parts = [e["fields"][field] for e in entries]
        if field == "step":
            assert all(int(p) == int(parts[0]) for p in parts), f"{name}: shards took different numbers of steps"
            out[field] = parts[0]
        elif kind is ShardingKind.ROW_WISE:
            out[field] = torch.cat(parts)
        elif kind is ShardingKind.COLUMN_WISE and parts[0].dim() == 2:
            out[field] = torch.cat(parts, dim=1)
        else:
            out[field] = parts[0]
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_training_matches_one_process(world: int) -> None:
    # the reference first: it also compiles the kernels into numba's cache for the workers
    torch.manual_seed(0)
    ref = Tiny()
    per_rank = [rank_batches(r) for r in range(world)]
    train(ref, [global_batch([per_rank[r][i] for r in range(world)]) for i in range(STEPS)])
    want = {k: v for k, v in ref.emb.state_dict().items() if ".hash_table." not in k}
    want_dynamic = {}
    for name in DYNAMIC:
        held = ref.emb.hash_tables[name].export()
        want_dynamic[name] = {f: _by_key(held.keys, held.rows, want[f"tables.{name}.{f}"]) for f in ("weight", "sum")}

    the_plans = plans(world)
    results = spawn(world, _run_plans, [p.to_json() for p in the_plans])
    for i, plan in enumerate(the_plans):
        per_rank = [r[i] for r in results]
        where = f"world {world}, plan {i}:\n{plan}"
        for t in TABLES:
            got = assemble(plan, per_rank, t.name)
            if t.dynamic is not None:
                for field, by_key in want_dynamic[t.name].items():
                    assert set(got[field]) == set(by_key), where
                    for key, v in by_key.items():
                        torch.testing.assert_close(
                            got[field][key], v, rtol=1e-5, atol=1e-6, msg=lambda m, t=t, f=field: f"{t.name}.{f}: {m}"
                        )
                continue
            for field, v in got.items():
                torch.testing.assert_close(
                    v,
                    want[f"tables.{t.name}.{field}"],
                    rtol=1e-5,
                    atol=1e-6,
                    msg=lambda m, t=t, field=field, where=where: f"{where}\n{t.name}.{field}: {m}",
                )
        for k, v in per_rank[0]["top"].items():
            torch.testing.assert_close(v, ref.top.state_dict()[k], rtol=1e-5, atol=1e-6)
        assert all(r["bytes"] > 0 for r in per_rank)
