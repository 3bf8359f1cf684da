"""Sharded disk-tier tables (2 ranks, gloo): bit for bit the same sharded model on in-memory tables, with
and without the training pipeline (which then also exchanges batch i + 1's ids while step i runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hugerec.distributed.launch import spawn
from hugerec.distributed.shard import shard, sharded_collections
from hugerec.distributed.sharding_plan import ShardingKind, ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad, Adam, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, TableConfig, Zeros
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.pipeline import Pipeline
from hugerec.training.trainer import TrainConfig, fit

WORLD, STEPS, BATCH = 2, 8, 4
# a global batch has 16 ids per table: a cache of CACHE rows holds two batches' rows and evicts
TABLES = (
    TableConfig("a", 60, 4, optimizer=RowWiseAdagrad(lr=0.2)),
    TableConfig("b", 60, 4, optimizer=Adam(lr=0.05)),
    TableConfig("c", 60, 4),
    TableConfig("h", 60, 4, init=Zeros(), dynamic=DynamicConfig()),
)
CACHE = 34


def disk_tables(d: Path) -> tuple[TableConfig, ...]:
    return tuple(
        dataclasses.replace(t, storage="disk", cache_rows=CACHE, path=str(d / f"{t.name}.rows"))  # type: ignore[arg-type]
        for t in TABLES
    )


class Tiny(nn.Module):
    def __init__(self, tables: tuple[TableConfig, ...]) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(tables, Adagrad(lr=0.2))
        self.top = nn.Linear(self.emb.output_dim, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.top(torch.tanh(self.emb(batch.sparse).values)).squeeze(1)


def rank_batches(rank: int) -> list[Batch]:
    g = torch.Generator().manual_seed(50 + rank)
    out = []
    for _ in range(STEPS):
        lists = {
            t.name: [
                [int(x) * (1000 if t.dynamic else 1) for x in torch.randint(0, t.num_rows, (2,), generator=g)]
                for _ in range(BATCH)
            ]
            for t in TABLES
        }
        labels = torch.randint(0, 2, (BATCH,), generator=g).float()
        out.append(Batch(torch.zeros(BATCH, 0), SparseFeatures.from_lists(lists), labels))
    return out


def plan() -> ShardingPlan:
    return ShardingPlan(
        TABLES,
        {
            "a": TablePlacement.row_wise([0, 1]),
            "b": TablePlacement.column_wise([1, 0]),
            "c": TablePlacement.table_wise(1),
            "h": TablePlacement.table_wise(0),
        },
        WORLD,
    )


def _train(rank: int, world: int, d: str, storage: str, pipeline: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    # a directory per rank: a disk table draws its initial rows from the RNG only when it creates its
    # file, so ranks racing to create one shared file would leave rank 0's RNG (its dense init) to chance
    tables = TABLES if storage == "memory" else disk_tables(Path(d) / f"rank{rank}")
    if storage == "disk":
        (Path(d) / f"rank{rank}").mkdir()
    p = dataclasses.replace(plan(), tables=tables)
    model = shard(Tiny(tables), p)
    opt = torch.optim.SGD([q for n, q in model.named_parameters() if "top" in n], lr=0.3)
    batches = rank_batches(rank)
    logits = []
    for batch in Pipeline(model, torch.device("cpu"))(batches) if pipeline else batches:
        out = model(batch)
        logits.append(out.detach().clone())
        loss = nn.functional.binary_cross_entropy_with_logits(out, batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {"logits": torch.cat(logits), **_held(model)}


def _fit(rank: int, world: int, d: str, storage: str, pipeline: bool) -> dict[str, Any]:
    """The trainer's run: with the pipeline, batch i + 1's ids go out and its rows come in during step i."""
    torch.manual_seed(0)
    tables = TABLES if storage == "memory" else disk_tables(Path(d) / f"rank{rank}")
    if storage == "disk":
        (Path(d) / f"rank{rank}").mkdir()
    model = shard(Tiny(tables), dataclasses.replace(plan(), tables=tables))
    cfg = TrainConfig(progress=False, tensorboard=False, plot=False, log_every=4, pipeline=pipeline, seed=None)
    history = fit(model, rank_batches(rank), config=cfg)
    return {"logits": torch.zeros(0), "history": history.train, **_held(model)}


def _held(model: nn.Module) -> dict[str, Any]:
    (sharded,) = sharded_collections(model)
    held: dict[str, Any] = {}
    for placed in sharded.placed:
        name = placed.table.name
        if placed.table.dynamic is not None:
            keys = placed.local.hash_tables[name].export()
            rows = keys.rows
            held[name] = (keys.keys, *_rows(placed.local, name, rows))
        else:
            held[name] = _rows(placed.local, name, torch.arange(placed.shard.num_rows))
    stats = sharded.shards.disk_stats() if sharded.shards is not None else {}
    return {"tables": held, "disk": stats}


def _rows(local: EmbeddingCollection, name: str, rows: torch.Tensor) -> tuple[Any, ...]:
    weights, state = local.read_rows(name, rows)
    return (weights, *(state[k] for k in sorted(state)), local.adam_step(name))


@pytest.mark.slow
def test_sharded_disk_tables_train_like_memory_tables(tmp_path: Path) -> None:
    runs = {}
    for storage, pipeline in (("memory", False), ("disk", True)):  # the pipeline's hand loop; fit below
        d = tmp_path / f"{storage}{pipeline}"
        d.mkdir()
        runs[storage, pipeline] = spawn(WORLD, _train, str(d), storage, pipeline)
        if storage == "disk":  # every shard got a file of its own beside the table's
            assert {f"{p.parent.name}/{p.name}" for p in d.glob("*/*.shard*")} == {
                "rank0/a.rows.shard0", "rank1/a.rows.shard1", "rank0/b.rows.shard1", "rank1/b.rows.shard0",
                "rank1/c.rows.shard0", "rank0/h.rows.shard0",
            }  # fmt: skip
    assert_same(runs["memory", False], runs["disk", True], "disk")


@pytest.mark.slow
def test_sharded_fit_with_the_pipeline_and_disk_tables(tmp_path: Path) -> None:
    """fit on 2 ranks: disk tables without the pipeline == disk tables with it (ids exchanged and rows
    staged a step ahead) == memory tables (the test above); each rank's log records the cache's hit
    rate and the hidden share."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "piped").mkdir()
    want = spawn(WORLD, _fit, str(tmp_path / "plain"), "disk", False)
    got = spawn(WORLD, _fit, str(tmp_path / "piped"), "disk", True)
    assert_same(want, got, "fit")
    for rank in range(WORLD):
        last = got[rank]["history"][-1]
        assert 0 < last["cache_hit_rate"] < 1 and last["disk_rows_read"] > 0 and "prefetch_hidden" in last


def assert_same(want: list[dict[str, Any]], got: list[dict[str, Any]], key: object) -> None:
    for rank in range(WORLD):
        assert torch.equal(got[rank]["logits"], want[rank]["logits"]), (key, rank)
        assert got[rank]["tables"].keys() == want[rank]["tables"].keys()
        for name, fields in want[rank]["tables"].items():
            for x, y in zip(fields, got[rank]["tables"][name], strict=True):
                assert (x == y) if not isinstance(x, torch.Tensor) else torch.equal(x, y), (key, rank, name)
        assert got[rank]["disk"]["misses"] > 0 and got[rank]["disk"]["rows_written"] > 0  # every batch evicts


def test_a_disk_table_is_not_data_parallel() -> None:
    from hugerec.distributed.planner import _candidates

    t = disk_tables(Path("/nonexistent"))[0]
    assert all(c.kind is not ShardingKind.DATA_PARALLEL for c in _candidates(t, 2, None, [0, 1]))
