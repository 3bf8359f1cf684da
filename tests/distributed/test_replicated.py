"""Data-parallel tables in this process (a one-rank gloo group): replicas updated like the unsharded tables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from hugerec.distributed.launch import free_port
from hugerec.distributed.shard import shard
from hugerec.distributed.sharded import ShardedEmbeddingCollection
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adam
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.sparse.features import SparseFeatures

TABLES = (
    TableConfig("u", 50, 4, features=("u1", "u2")),
    TableConfig("i", 30, 4, pooling=Pooling.MEAN, optimizer=SGD(lr=0.5, weight_decay=0.1)),
    TableConfig("q", 20, 4, pooling=Pooling.NONE),
)


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def features(seed: int, b: int = 6) -> SparseFeatures:
    g = torch.Generator().manual_seed(seed)
    rows = {"u1": 50, "u2": 50, "i": 30, "q": 20}
    lists = {
        f: [torch.randint(0, r, (int(torch.randint(0, 4, (1,), generator=g)),), generator=g).tolist() for _ in range(b)]
        for f, r in rows.items()
    }
    weights = {f: [[0.5 + i for i in range(len(bag))] for bag in bags] for f, bags in lists.items()}
    return SparseFeatures.from_lists(lists, weights)


def loss(emb: EmbeddingCollection | ShardedEmbeddingCollection, sf: SparseFeatures) -> torch.Tensor:
    return emb(sf).values.pow(2).sum() + emb.sequences(sf)["q"].values.sin().sum()


def test_replicas_step_like_the_unsharded_tables(one_rank: None) -> None:
    torch.manual_seed(0)
    ref = EmbeddingCollection(TABLES, Adam(lr=0.1))
    torch.manual_seed(0)
    plan = ShardingPlan(TABLES, {t.name: TablePlacement.data_parallel(1) for t in TABLES}, 1)
    alone = shard(EmbeddingCollection(TABLES, Adam(lr=0.1)), plan)
    assert isinstance(alone, ShardedEmbeddingCollection) and alone.replicas is not None
    for seed in range(3):  # weighted bags, MEAN, a shared table, sequences, weight decay, Adam's steps
        loss(ref, features(seed)).backward()
        loss(alone, features(seed)).backward()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(alone.replicas.collection.state_dict()[k], v)
    assert alone.replicas.collection.steps == ref.steps
    with torch.no_grad():  # lookups without a backward graph leave the rows alone
        before = alone.replicas.collection.state_dict()["tables.u.weight"].clone()
        loss(alone, features(9))
        assert torch.equal(alone.replicas.collection.state_dict()["tables.u.weight"], before)
