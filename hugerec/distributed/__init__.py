"""hugerec.distributed: hybrid-parallel training on torch.distributed (gloo on CPU, NCCL on GPU).

tables = [...]                                   # the TableConfigs of the model's collections
env = init_from_env()                            # under torchrun (or spawn(world_size, fn) in tests)
sharding = plan(tables, env.world_size, memory_per_rank=8 << 30, load=Workload(batch_size=4096))
model = shard(model, sharding)                   # sharded embeddings, dense part under DDP
for batch in prefetching(model, loader): ...     # each batch's ids travel a step ahead
hugerec.training.save_checkpoint("ckpt/", step, model, optimizer)   # load_checkpoint on any number of ranks
"""

from hugerec.distributed.comm import CommStats, all_to_all
from hugerec.distributed.launch import DistEnv, init_from_env, launched_by_torchrun, spawn
from hugerec.distributed.planner import Constraint, CostModel, Workload, estimate_bytes_sent, plan
from hugerec.distributed.shard import ShardedModel, prefetching, shard, sharded_collections
from hugerec.distributed.sharded import ShardedEmbeddingCollection
from hugerec.distributed.sharding_plan import ShardingKind, ShardingPlan, TablePlacement

__all__ = [
    "CommStats",
    "Constraint",
    "CostModel",
    "DistEnv",
    "ShardedEmbeddingCollection",
    "ShardedModel",
    "ShardingKind",
    "ShardingPlan",
    "TablePlacement",
    "Workload",
    "all_to_all",
    "estimate_bytes_sent",
    "init_from_env",
    "launched_by_torchrun",
    "plan",
    "prefetching",
    "shard",
    "sharded_collections",
    "spawn",
]
