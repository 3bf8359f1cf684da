"""shard(model, plan): a single-device model -> the same model trained on W ranks, model code unchanged.

    model = DLRM(EmbeddingCollection(tables, RowWiseAdagrad()), ...)     # same seed on every rank
    model = shard(model, plan(tables, world_size=dist.get_world_size()))
    loss = bce(model(batch), batch.labels); loss.backward(); dense_opt.step()

Every EmbeddingCollection inside becomes a ShardedEmbeddingCollection (this rank's shards copied from
it); the rest, the dense parameters, goes under DistributedDataParallel. The result forwards unknown
attributes to the wrapped model, so `model.dense_parameters()` and friends keep working.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.nn.parallel import DistributedDataParallel

from hugerec.distributed.sharded import ShardedEmbeddingCollection
from hugerec.distributed.sharding_plan import ShardingPlan
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.sparse.batch import Batch


class ShardedModel(DistributedDataParallel):
    """DistributedDataParallel over a model whose embedding collections are sharded.

    Attributes it does not have are looked up on the wrapped model (`model.module`).
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":  # not set yet (inside DistributedDataParallel.__init__)
                raise
            return getattr(self.module, name)

    def sharded_collections(self) -> list[ShardedEmbeddingCollection]:
        return sharded_collections(self.module)


def sharded_collections(model: nn.Module) -> list[ShardedEmbeddingCollection]:
    """The ShardedEmbeddingCollections inside `model`, in module order."""
    return [m for m in model.modules() if isinstance(m, ShardedEmbeddingCollection)]


def _embedding_collections(model: nn.Module) -> list[tuple[nn.Module | None, str, EmbeddingCollection]]:
    out: list[tuple[nn.Module | None, str, EmbeddingCollection]] = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, EmbeddingCollection):
                out.append((parent, name, child))
    return out


def resolve_plan(plan: ShardingPlan, collections: list[EmbeddingCollection]) -> ShardingPlan:
    """The plan checked against the collections it is applied to: same tables, and memory counted with
    each table's actual optimizer. Raises ValueError before anything is built."""
    tables = [t for c in collections for t in c.tables]
    names = [t.name for t in tables]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"shard: table names {dup} appear in more than one embedding collection; names must be unique")
    planned = {t.name: t for t in plan.tables}
    missing = [n for n in names if n not in planned]
    extra = sorted(set(planned) - set(names))
    if missing or extra:
        raise ValueError(
            f"shard: the model's tables {missing} are not in the plan; the plan's tables {extra} are not in the model"
        )
    for t in tables:
        if planned[t.name] != t:
            raise ValueError(
                f"shard: table {t.name!r} differs between the plan ({planned[t.name]}) and the model ({t})"
            )
    resolved = [dataclasses.replace(t, optimizer=t.optimizer or c.optimizer) for c in collections for t in c.tables]
    return ShardingPlan(
        tuple(resolved),
        dict(plan.placements),
        plan.world_size,
        optimizer=plan.optimizer,
        memory_per_rank=plan.memory_per_rank,
        notes=plan.notes,
    )


def shard(
    model: nn.Module,
    plan: ShardingPlan,
    group: ProcessGroup | None = None,
    device: torch.device | None = None,
    **ddp_kwargs: Any,
) -> nn.Module:
    """Shard `model`'s embedding collections by `plan` and wrap it in DistributedDataParallel.

    Call it on every rank with a model built the same way (same seed): each rank keeps its shards
    and the replicas; dense parameters start from rank 0's. The embedding all_to_alls run on a
    process group of their own (a new group over `group`'s ranks), apart from DDP's all-reduces.
    model    any nn.Module; an EmbeddingCollection itself gives a ShardedEmbeddingCollection
    device   where the dense part runs (default: the collections' device); CUDA devices get
             device_ids=[device] in DDP
    A model with `optional_parameters = True` (some parameters train only in some runs: HSTU's ranking
    head, its time bias) gets find_unused_parameters=True unless ddp_kwargs say otherwise.
    Returns a ShardedModel (DistributedDataParallel), or the model itself when it has no dense
    parameter to train.
    """
    if not dist.is_initialized():
        raise RuntimeError(
            "shard: torch.distributed is not initialised; call hugerec.distributed.init_from_env() or use spawn()"
        )
    world = dist.get_world_size(group)
    if plan.world_size != world:
        raise ValueError(f"shard: the plan is for world_size={plan.world_size}, the process group has {world} ranks")
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    emb_group = dist.new_group(ranks)
    found = [(None, "", model)] if isinstance(model, EmbeddingCollection) else _embedding_collections(model)
    if not found:
        raise ValueError(f"shard: {type(model).__name__} holds no EmbeddingCollection")
    resolve_plan(plan, [c for _, _, c in found])  # raises before anything is built
    for parent, name, collection in found:
        names = {t.name for t in collection.tables}
        sub = ShardingPlan(
            collection.tables,
            {n: p for n, p in plan.placements.items() if n in names},
            plan.world_size,
            optimizer=collection.optimizer,
        )
        sharded = ShardedEmbeddingCollection(collection, sub, emb_group)
        if parent is None:
            return sharded
        parent.register_module(name, sharded)  # the model annotates it as an EmbeddingModule: both fit
    if not any(p.requires_grad for p in model.parameters()):
        return model
    device = device or found[0][2].device
    model.to(device)
    if device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [device])
    if getattr(model, "optional_parameters", False):  # e.g. HSTU's ranking head, trained only with its loss
        ddp_kwargs.setdefault("find_unused_parameters", True)
    return ShardedModel(model, process_group=group, **ddp_kwargs)


def prefetching(model: nn.Module, batches: Iterable[Batch]) -> Iterator[Batch]:
    """`batches`, each one's id exchange started a step ahead: while a step trains, the next batch's ids
    travel to their owners (`ShardedEmbeddingCollection.prefetch`). Use it in the training loop of a
    sharded model on every rank: `for batch in prefetching(model, loader): ...`."""
    collections = sharded_collections(model)
    ahead: list[Batch] = []
    for batch in batches:
        for c in collections:
            c.prefetch(batch.sparse)
        ahead.append(batch)
        if len(ahead) == 2:  # batch i is handed out once batch i + 1's exchange has started
            yield ahead.pop(0)
    yield from ahead
