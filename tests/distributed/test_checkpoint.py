"""Save on 3 ranks, load on 2 and on 1, continue: the same as training in one process without a break."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hugerec.distributed.checkpoint import holdings, load_checkpoint, save_checkpoint
from hugerec.distributed.launch import spawn
from hugerec.distributed.plan import ShardingPlan, TablePlacement
from hugerec.distributed.shard import shard
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.config import DynamicConfig, Pooling, TableConfig, Zeros
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, RowWiseAdagrad
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

TABLES = (
    TableConfig("a", 20, 4, optimizer=RowWiseAdagrad(lr=0.2)),
    TableConfig("b", 14, 4, pooling=Pooling.MEAN, optimizer=Adam(lr=0.05)),
    TableConfig("c", 9, 4, optimizer=SGD(lr=0.3)),
    TableConfig("h", 30, 4, init=Zeros(), dynamic=DynamicConfig()),  # new keys start at zero in any layout
    TableConfig("g", 24, 4, dynamic=DynamicConfig()),
)
ROWS = {"a": 20, "b": 14, "c": 9, "h": 0, "g": 0}
GLOBAL_BATCH, STEPS, SAVED_AT = 6, 4, 2


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(TABLES, Adagrad(lr=0.2))
        self.top = nn.Linear(self.emb.output_dim, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.top(torch.tanh(self.emb(batch.sparse).values)).squeeze(1)


def batches() -> list[Batch]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        lists = {
            f: [
                (
                    torch.randint(0, rows, (2,), generator=g) if rows else torch.randint(0, 12, (2,), generator=g) * 977
                ).tolist()
                for _ in range(GLOBAL_BATCH)
            ]
            for f, rows in ROWS.items()
        }
        labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
        out.append(Batch(torch.zeros(GLOBAL_BATCH, 0), SparseFeatures.from_lists(lists), labels))
    return out


def local(batch: Batch, rank: int, world: int) -> Batch:
    """Examples [rank * B / W, (rank + 1) * B / W) of a global batch."""
    per = batch.batch_size // world
    keep = slice(rank * per, (rank + 1) * per)
    sf = SparseFeatures.from_jagged(
        {k: type(batch.sparse[k]).from_lists(batch.sparse[k].to_lists()[keep]) for k in batch.sparse.keys}
    )
    return Batch(batch.dense[keep], sf, batch.labels[keep])


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: list[Batch]) -> None:
    for batch in steps:
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def dense_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam([p for n, p in model.named_parameters() if "top" in n], lr=0.05)


PLAN_3 = ShardingPlan(
    TABLES,
    {
        "a": TablePlacement.row_wise([0, 1, 2]),
        "b": TablePlacement.column_wise([2, 0]),
        "c": TablePlacement.data_parallel(3),
        "h": TablePlacement.row_wise([0, 1, 2]),
        "g": TablePlacement.table_wise(1),
    },
    world_size=3,
)
PLAN_2 = ShardingPlan(
    TABLES,
    {
        "a": TablePlacement.table_wise(1),
        "b": TablePlacement.row_wise([1, 0]),
        "c": TablePlacement.column_wise([0, 1]),
        "h": TablePlacement.table_wise(0),  # 3 hash shards -> one table: keys collected from every piece
        "g": TablePlacement.table_wise(0),  # the same layout as saved: restored as it was
    },
    world_size=2,
)


def _first_part(rank: int, world: int, path: str) -> None:
    torch.manual_seed(0)
    model = shard(Small(), PLAN_3)
    opt = dense_optimizer(model)
    train(model, opt, [local(b, rank, world) for b in batches()[:SAVED_AT]])
    save_checkpoint(path, model, opt, extra={"step": SAVED_AT})


def _second_part(rank: int, world: int, path: str, out: str) -> int:
    torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
    model = shard(Small(), PLAN_2)
    opt = dense_optimizer(model)
    extra = load_checkpoint(path, model, opt)
    train(model, opt, [local(b, rank, world) for b in batches()[extra["step"] :]])
    save_checkpoint(out, model, opt)
    return int(extra["step"])


def _key_map(model: Small, name: str, field: str) -> dict[int, torch.Tensor]:
    held = model.emb.hash_tables[name].export()
    values = model.emb.state_dict()[f"tables.{name}.{field}"]
    return {int(k): values[int(r)] for k, r in zip(held.keys, held.rows, strict=True)}


def assert_same(got: Small, want: Small) -> None:
    g, w = got.state_dict(), want.state_dict()
    for k, v in w.items():
        if ".hash_table." in k or any(f"tables.{d}." in k for d in ("h", "g")):
            continue
        torch.testing.assert_close(g[k], v, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    for name in ("h", "g"):
        for field in ("weight", "sum"):
            a, b = _key_map(got, name, field), _key_map(want, name, field)
            assert set(a) == set(b), name
            for key in b:
                torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert got.emb.steps["b"] == want.emb.steps["b"] == STEPS


def test_save_on_3_load_on_2_and_1(tmp_path: Path) -> None:
    torch.manual_seed(0)
    want = Small()
    train(want, dense_optimizer(want), batches())  # never interrupted, one process
    first, second = str(tmp_path / "three"), str(tmp_path / "two")
    spawn(3, _first_part, first)
    assert spawn(2, _second_part, first, second) == [SAVED_AT, SAVED_AT]

    # 3 ranks -> one process, then the rest of the steps
    torch.manual_seed(5)
    one = Small()
    opt = dense_optimizer(one)
    assert load_checkpoint(first, one, opt) == {"step": SAVED_AT}
    train(one, opt, batches()[SAVED_AT:])
    assert_same(one, want)

    # 3 ranks -> 2 ranks (trained on) -> one process
    torch.manual_seed(6)
    final = Small()
    load_checkpoint(second, final)
    assert_same(final, want)


def test_unsharded_round_trip_and_errors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Small()
    opt = dense_optimizer(model)
    train(model, opt, batches()[:1])
    save_checkpoint(tmp_path / "ck", model, opt, extra=[1, "x"])
    names, placed = holdings(model)
    assert names == ["emb"] and [p.table.name for p in placed] == [t.name for t in TABLES]

    fresh = Small()
    assert load_checkpoint(tmp_path / "ck", fresh) == [1, "x"]
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k

    other = nn.Module()
    other.emb = EmbeddingCollection([TableConfig("a", 21, 4, optimizer=RowWiseAdagrad(lr=0.2))], Adagrad(lr=0.2))
    with pytest.raises(ValueError, match=r"table 'a' has num_rows=21 but .* saved 20"):
        load_checkpoint(tmp_path / "ck", other)
    other.emb = EmbeddingCollection([TableConfig("zz", 3, 4)])
    with pytest.raises(ValueError, match="holds no table 'zz'"):
        load_checkpoint(tmp_path / "ck", other)
