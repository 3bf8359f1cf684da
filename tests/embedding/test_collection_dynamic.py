"""EmbeddingCollection with dynamic tables: raw keys through hash tables inside the fused lookup."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing, Pooling, TableConfig, Uniform, Zeros
from hugerec.sparse.features import SparseFeatures

BIG = 2**62  # raw keys far outside any table


def _batches(seed: int, num: int, batch: int = 16) -> list[dict[str, list[list[int]]]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        out.append(
            {
                "user": [[int(BIG - 7 * rng.integers(0, 30))] for _ in range(batch)],
                "item": [[int(-BIG + rng.integers(0, 40)) for _ in range(rng.integers(0, 4))] for _ in range(batch)],
                "last": [[int(-BIG + rng.integers(0, 40))] for _ in range(batch)],
            }
        )
    return out


def _train(emb: EmbeddingCollection, batches: list[SparseFeatures]) -> list[torch.Tensor]:
    outs = []
    for b in batches:
        pooled = emb(b)
        outs.append(pooled.values.detach().clone())
        (pooled.values * torch.linspace(-1, 1, pooled.values.shape[1])).square().sum().backward()
    return outs


@pytest.mark.parametrize("optimizer", [RowWiseAdagrad(lr=0.1), Adam(lr=0.05)])
def test_dynamic_tables_train_exactly_like_static_tables_on_remapped_ids(optimizer: object) -> None:
    raw = _batches(0, 6)
    # the rows a dynamic table hands out: 0, 1, 2, ... in order of first sight
    first_seen: dict[str, dict[int, int]] = {"user": {}, "item": {}}
    static = []
    for b in raw:
        ids = {}
        for f, table in (("user", "user"), ("item", "item"), ("last", "item")):
            ids[f] = [[first_seen[table].setdefault(k, len(first_seen[table])) for k in bag] for bag in b[f]]
        static.append(SparseFeatures.from_lists(ids))

    def tables(dynamic: DynamicConfig | None) -> list[TableConfig]:
        return [
            TableConfig("user", num_rows=40, dim=4, dynamic=dynamic),
            TableConfig("item", num_rows=50, dim=4, features=("item", "last"), pooling=Pooling.MEAN, dynamic=dynamic),
        ]

    torch.manual_seed(0)
    emb_static = EmbeddingCollection(tables(None), optimizer=optimizer)  # type: ignore[arg-type]
    torch.manual_seed(0)
    emb_dynamic = EmbeddingCollection(tables(DynamicConfig(eviction=Eviction.LRU)), optimizer=optimizer)  # type: ignore[arg-type]
    out_static = _train(emb_static, static)
    out_dynamic = _train(emb_dynamic, [SparseFeatures.from_lists(b) for b in raw])
    for a, b in zip(out_static, out_dynamic, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(emb_static.table_weight("item"), emb_dynamic.table_weight("item"))
    assert all(torch.equal(v, emb_dynamic.table_state("user")[k]) for k, v in emb_static.table_state("user").items())
    assert emb_dynamic.hash_tables["user"].stats().size == len(first_seen["user"])


def test_static_and_dynamic_tables_mix_and_eval_only_finds() -> None:
    tables = [
        TableConfig("user", num_rows=8, dim=2, dynamic=DynamicConfig()),
        TableConfig("slot", num_rows=5, dim=2),  # same dim as "user": one fused group, one kernel call
        TableConfig(
            "hist", num_rows=8, dim=2, pooling=Pooling.NONE, dynamic=DynamicConfig(missing=Missing.UNKNOWN_ROW)
        ),
    ]
    emb = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.1))
    train = SparseFeatures.from_lists({"user": [[BIG], [-BIG]], "slot": [[4], [0, 1]], "hist": [[5, 6], [BIG]]})
    slot, user = emb.table_weight("slot").clone(), emb.table_weight("user").clone()
    pooled = emb(train)
    assert torch.equal(pooled["slot"], torch.stack([slot[4], slot[0] + slot[1]]))  # static ids are rows
    assert torch.equal(pooled["user"], user[:2])  # raw keys got rows 0 and 1
    seqs = emb.sequences(train)
    (pooled.values.sum() + seqs["hist"].values.sum()).backward()
    assert emb.hash_tables["user"].find(torch.tensor([BIG, -BIG])).tolist() == [0, 1]
    assert emb.hash_tables["hist"].find(torch.tensor([5, 6, BIG])).tolist() == [0, 1, 2]

    emb.eval()
    unseen = SparseFeatures.from_lists({"user": [[12345]], "slot": [[2]], "hist": [[999]]})
    out = emb(unseen)
    assert torch.equal(out["user"], torch.zeros(1, 2))  # Missing.ZEROS: a zero vector
    assert torch.equal(emb.sequences(unseen)["hist"].values[0], emb.table_weight("hist")[7])  # the unknown row
    assert len(emb.hash_tables["user"]) == 2 and len(emb.hash_tables["hist"]) == 3  # eval inserted nothing
    emb.train()
    with torch.no_grad():
        emb(unseen)
    assert len(emb.hash_tables["user"]) == 2  # no_grad: no update will follow, so no insertion either


def test_evicted_rows_are_reinitialised_with_fresh_optimizer_state() -> None:
    tables = [TableConfig("user", num_rows=2, dim=3, init=Zeros(), dynamic=DynamicConfig(eviction=Eviction.LRU))]
    emb = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.5))
    for keys in ([[1], [2]], [[2]]):
        emb(SparseFeatures.from_lists({"user": keys})).values.sum().backward()
    assert bool((emb.table_weight("user")[0] != 0).all())  # key 1's row was trained
    out = emb(SparseFeatures.from_lists({"user": [[3]]}))  # evicts key 1 (least recently used)
    assert emb.hash_tables["user"].find(torch.tensor([1, 3])).tolist() == [-1, 0]
    assert torch.equal(out.values, torch.zeros(1, 3))  # the re-initialised row (Zeros init)
    assert emb.table_state("user")["sum"][0].item() == 0.0
    assert emb.hash_tables["user"].stats().evictions == 1


def test_admission_keeps_rare_keys_out_and_untrained() -> None:
    tables = [TableConfig("user", num_rows=4, dim=2, dynamic=DynamicConfig(min_count=2, sketch_width=256))]
    emb = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.5))
    before = emb.table_weight("user").clone()
    out = emb(SparseFeatures.from_lists({"user": [[10], [11]]}))
    out.values.sum().backward()
    assert torch.equal(out.values, torch.zeros(2, 2))
    assert torch.equal(emb.table_weight("user"), before)
    assert emb.hash_tables["user"].stats().refused == 2
    emb(SparseFeatures.from_lists({"user": [[10]]})).values.sum().backward()
    assert emb.hash_tables["user"].find(torch.tensor([10, 11])).tolist() == [0, -1]


def test_state_dict_restores_the_mapping() -> None:
    tables = [TableConfig("user", num_rows=10, dim=2, dynamic=DynamicConfig(eviction=Eviction.LFU))]
    a = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.1))
    for b in _batches(1, 6, batch=6):
        a(SparseFeatures.from_lists({"user": b["user"]})).values.sum().backward()
    state = a.state_dict()
    assert "tables.user.hash_table.keys" in state
    b = EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.1))
    b.load_state_dict(state)
    assert a.hash_tables["user"].stats().evictions > 0
    nxt = SparseFeatures.from_lists({"user": _batches(2, 1, batch=6)[0]["user"]})
    torch.manual_seed(5)  # recycled rows are re-initialised at random: the same draws for both
    out_a = a(nxt).values
    torch.manual_seed(5)
    assert torch.equal(out_a, b(nxt).values)
    assert a.hash_tables["user"].stats() == b.hash_tables["user"].stats()
    del state["tables.user.hash_table.keys"]
    with pytest.raises(RuntimeError, match=r"tables.user.hash_table.keys"):
        EmbeddingCollection(tables).load_state_dict(state)


def test_too_many_new_keys_without_eviction_raise_with_the_table_name() -> None:
    tables = [TableConfig("user", num_rows=2, dim=2, dynamic=DynamicConfig(eviction=Eviction.NONE))]
    emb = EmbeddingCollection(tables)
    with pytest.raises(ValueError, match=r"HashTable 'user'.*eviction NONE"):
        emb(SparseFeatures.from_lists({"user": [[1], [2], [3]]}))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    tables = [
        # evicting, with a constant initializer: re-initialised rows match without sharing an RNG
        TableConfig("user", 12, 4, init=Uniform(0.1, 0.1), dynamic=DynamicConfig(eviction=Eviction.LRU)),
        TableConfig("item", num_rows=50, dim=4, features=("item", "last"), dynamic=DynamicConfig()),
    ]
    cpu = EmbeddingCollection(tables, RowWiseAdagrad(lr=0.1))
    gpu = EmbeddingCollection(tables, RowWiseAdagrad(lr=0.1)).to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    for b in _batches(3, 4, batch=8):
        features = SparseFeatures.from_lists(b)
        cpu(features).values.pow(2).sum().backward()
        gpu(features.to("cuda")).values.pow(2).sum().backward()
    assert cpu.hash_tables["user"].stats().evictions > 0
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(gpu.state_dict()[k].cpu(), v, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's twin of test_cuda_matches_cpu")
def test_the_gpu_path_trains_like_the_cpu_path() -> None:
    """The CUDA path without CUDA: the Triton lookup and backward (`ops.triton_on_cpu`) and the hash
    tables on a device, all under Triton's interpreter on the CPU, train as the Numba path does."""
    pytest.importorskip("triton")
    from hugerec import ops

    tables = [
        TableConfig("user", 12, 4, init=Uniform(0.1, 0.1), dynamic=DynamicConfig(eviction=Eviction.LRU)),
        TableConfig("item", num_rows=50, dim=4, features=("item", "last"), dynamic=DynamicConfig()),
    ]
    cpu = EmbeddingCollection(tables, Adam(lr=0.05))
    gpu = EmbeddingCollection(tables, Adam(lr=0.05))
    gpu.load_state_dict(cpu.state_dict())
    batches = [SparseFeatures.from_lists(b) for b in _batches(3, 4, batch=8)]
    want = _train(cpu, batches)
    for h in gpu.hash_tables.values():
        h.move(torch.device("cpu"))
    with ops.triton_on_cpu():
        got = _train(gpu, batches)
    assert cpu.hash_tables["user"].stats().evictions > 0
    for g, w in zip(got, want, strict=True):  # fp32 sums in another order: Adam's tiny steps differ in the last bits
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(gpu.state_dict()[k], v, rtol=1e-4, atol=1e-5)
