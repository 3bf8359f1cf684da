"""shard() in this process (a one-rank gloo group): checks before anything is built, the wrapper, prefetch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hugerec.distributed.launch import free_port
from hugerec.distributed.shard import ShardedModel, resolve_plan, shard, sharded_collections
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adam
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.sparse.features import SparseFeatures

TABLES = (
    TableConfig("u", 50, 4, features=("u1", "u2")),
    TableConfig("i", 30, 4, pooling=Pooling.MEAN, optimizer=SGD(lr=0.5)),
    TableConfig("q", 20, 4, pooling=Pooling.NONE),
)


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(TABLES, Adam(lr=0.1))
        self.head = nn.Linear(self.emb.output_dim, 1)

    def forward(self, sf: SparseFeatures) -> torch.Tensor:
        seq = self.emb.sequences(sf)["q"]
        return self.head(self.emb(sf).values).squeeze(1) + seq.values.sum()

    def dense_parameters(self) -> list[nn.Parameter]:
        return list(self.head.parameters())


def features(seed: int, b: int = 6) -> SparseFeatures:
    g = torch.Generator().manual_seed(seed)
    rows = {"u1": 50, "u2": 50, "i": 30, "q": 20}
    return SparseFeatures.from_lists(
        {
            f: [
                torch.randint(0, r, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist()
                for _ in range(b)
            ]
            for f, r in rows.items()
        }
    )


def every_kind(world: int = 1) -> ShardingPlan:
    return ShardingPlan(
        TABLES,
        {"u": TablePlacement.row_wise([0]), "i": TablePlacement.column_wise([0]), "q": TablePlacement.table_wise(0)},
        world,
    )


def step(model: nn.Module, sf: SparseFeatures) -> None:
    model(sf).square().sum().backward()


def test_shard_needs_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is up")
    with pytest.raises(RuntimeError, match="not initialised"):
        shard(Model(), every_kind())


def test_one_rank_matches_the_unsharded_model(one_rank: None) -> None:
    torch.manual_seed(0)
    ref = Model()
    torch.manual_seed(0)
    sharded = shard(Model(), every_kind())
    assert isinstance(sharded, ShardedModel)
    assert sharded.dense_parameters() == list(sharded.module.head.parameters())  # the wrapped model's method
    (emb,) = sharded.sharded_collections()
    assert emb.feature_names == ("u1", "u2", "i") and emb.output_dim == 12 and emb.sequence_feature_names == ("q",)
    for seed in range(3):
        step(ref, features(seed))
        step(sharded, features(seed))
    assert emb.shards is not None
    for t in ("u", "i", "q"):
        for field, v in ref.emb.state_dict().items():
            if field.startswith(f"tables.{t}."):
                torch.testing.assert_close(emb.shards.state_dict()[field], v)
    assert emb.shards.steps == ref.emb.steps


def test_prefetch_and_eval(one_rank: None) -> None:
    torch.manual_seed(0)
    model = shard(Model(), every_kind())
    (emb,) = sharded_collections(model)
    a, b = features(10), features(11)
    with torch.no_grad():
        plain = emb(a).values
        emb.prefetch(a)
        assert torch.equal(emb(a).values, plain)  # the exchange started early is the one used
        emb.prefetch(b)
        assert torch.equal(emb(a).values, plain)  # a prefetch of another batch is finished and dropped
    model.eval()
    before = emb.shards.state_dict()["tables.u.weight"].clone()  # type: ignore[union-attr]
    model(a).sum()  # eval mode: no backward graph, nothing to update
    assert torch.equal(emb.shards.state_dict()["tables.u.weight"], before)  # type: ignore[union-attr]


def test_bad_plans_fail_before_anything_is_built(one_rank: None) -> None:
    model = Model()
    with pytest.raises(ValueError, match=r"plan is for world_size=2, the process group has 1"):
        shard(model, ShardingPlan(TABLES, dict(every_kind().placements), 2))
    other = ShardingPlan(TABLES[:2], {"u": TablePlacement.table_wise(0), "i": TablePlacement.table_wise(0)}, 1)
    with pytest.raises(ValueError, match=r"model's tables \['q'\] are not in the plan"):
        shard(model, other)
    changed = (TableConfig("u", 51, 4, features=("u1", "u2")), *TABLES[1:])
    with pytest.raises(ValueError, match="table 'u' differs between the plan"):
        shard(model, ShardingPlan(changed, dict(every_kind().placements), 1))
    with pytest.raises(ValueError, match="holds no EmbeddingCollection"):
        shard(nn.Linear(2, 2), every_kind())
    # fits with SGD's state, not with the collection's Adam (2 D per row) : refused with the real optimizer
    sgd_bytes = max(ShardingPlan(TABLES, dict(every_kind().placements), 1, optimizer=SGD()).bytes_per_rank())
    tight = ShardingPlan(TABLES, dict(every_kind().placements), 1, optimizer=SGD(), memory_per_rank=sgd_bytes)
    with pytest.raises(ValueError, match="exceeds memory_per_rank"):
        resolve_plan(tight, [model.emb])
    assert isinstance(model.emb, EmbeddingCollection)  # nothing was replaced
