"""hugerec.distributed: hybrid-parallel training on torch.distributed (gloo on CPU, NCCL on GPU).

tables = [...]                                   # the TableConfigs of the model's collections
env = init_from_env()                            # under torchrun (or spawn(world_size, fn) in tests)
sharding = plan(tables, env.world_size, memory_per_rank=8 << 30, load=Workload(batch_size=4096))
model = shard(model, sharding)                   # sharded embeddings, dense part under DDP
for batch in prefetching(model, loader): ...     # each batch's ids travel a step ahead
hugerec.training.checkpoint.save_checkpoint("ckpt/", step, model, optimizer)   # load_checkpoint on any number of ranks
"""

from hugerec.distributed.launch import init_from_env, spawn
from hugerec.distributed.planner import Constraint, Workload, plan
from hugerec.distributed.shard import shard
from hugerec.distributed.sharding_plan import ShardingKind, ShardingPlan

__all__ = [
    "Constraint",
    "ShardingKind",
    "ShardingPlan",
    "Workload",
    "init_from_env",
    "plan",
    "shard",
    "spawn",
]
