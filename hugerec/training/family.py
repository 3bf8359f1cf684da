"""What a model family gives the one trainer (`fit`): its batch, its loss and its validation metrics.

    fit(dlrm, loader, valid_batches, config)                                      # RankingFamily() by default
    fit(two_tower, example_batches, RetrievalValidation(...), config, family=RetrievalFamily(item_counts))
    fit(sasrec, window_batches(windows, 128), NextItemValidation(...), config, family=SequentialFamily(FullSoftmax()))

A family is a small frozen object (`RankingFamily` in trainer.py, `RetrievalFamily` in retrieval.py, `SequentialFamily`
in sequential.py), not a subclass of anything: the trainer only calls the methods of `TrainerFamily`
(the registry's `hugerec.models.Family` enum names a model type's family; this is what it trains by).

    prepare(model, batch, ctx)   the step's inputs from one training batch: moved to the device, negatives
                                 drawn from ctx.generator, the SparseFeatures of each embedding lookup built.
                                 Runs in the training pipeline's worker thread (one batch ahead), or in the
                                 main thread without the pipeline; both give the same steps bit for bit (the
                                 family's random draws come from its own generator, in batch order)
    step_loss(model, prepared, ctx)  forward + the scalar loss, in the main thread
    evaluate(model, data, ...)   the validation metrics ({"auc", ...} or {"recall@10", ...})
    settings()                   the JSON a resumed run must not change (the trainer refuses and names keys)

Under torch.distributed each rank trains its own part of the global batch. A family whose loss couples
the rows of a batch (in-batch negatives) gathers what it needs from the other ranks (`gather_rows`:
an all-gather whose backward sums the gradients over the ranks), and every family scales its rank's
mean loss by `share` so that the ranks' mean is the global batch's mean: W ranks then take the step one
process takes on the whole batch (the same rule as DistributedDataParallel's averaged gradients).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import once_differentiable
from torch.distributed import ProcessGroup

from hugerec.sparse.device_copy import DeviceCopy
from hugerec.sparse.features import SparseFeatures
from hugerec.training.precision import Precision
from hugerec.training.schedule import Schedule


@dataclass(frozen=True)
class Prepared:
    """One training step's inputs, as `TrainerFamily.prepare` made them.

    inputs    the family's own (a Batch for ranking; tensors and negatives for the others)
    sparse    the SparseFeatures the model's embedding lookups will take, the very tensor objects (the
              training pipeline stages them in the collections that know their features ahead of the step)
    examples  rows of this rank's batch (sequences for sequential models): the samples/s count
    """

    inputs: Any
    sparse: tuple[SparseFeatures, ...]
    examples: int


@dataclass(frozen=True)
class StepContext:
    """What a family's step may use besides the model: the device, its random generator, and this rank's
    place in the process group (rank 0 of 1 in one process; `group` is the family's own process group
    for per-step collectives, None in one process). `copy` moves a ranking Batch to the device (one copy
    stream per context under CUDA)."""

    device: torch.device
    generator: torch.Generator
    rank: int = 0
    world: int = 1
    group: ProcessGroup | None = None
    copy: DeviceCopy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "copy", DeviceCopy(self.device))


class TrainerFamily(Protocol):
    """The seam between the trainer and a model family (see the module docstring)."""

    @property
    def name(self) -> str:
        """"ranking" | "retrieval" | "sequential": kept in every checkpoint; another family's is refused."""
        ...

    @property
    def metric(self) -> str:
        """The early-stopping metric when TrainConfig.early_stopping names none."""
        ...

    @property
    def schedule(self) -> Schedule:
        """The learning-rate schedule when TrainConfig.schedule is None (the dense lr's; the tables' too
        when its `sparse` is set)."""
        ...

    def settings(self) -> dict[str, Any]: ...

    def prepare(self, model: nn.Module, batch: Any, ctx: StepContext) -> Prepared: ...

    def step_loss(self, model: nn.Module, prepared: Prepared, ctx: StepContext) -> torch.Tensor: ...

    def evaluate(
        self, model: nn.Module, data: Any, device: torch.device | None, precision: Precision
    ) -> dict[str, float]: ...


# -- what the families share under torch.distributed ----------------------------------------------
def rank_rows(n: int, rank: int, world: int) -> slice:
    """Rank `rank`'s contiguous share of n rows of a global batch (the first ranks get the larger parts:
    in rank order the shares are the batch in its order, as the gathered candidates are)."""
    return slice(n * rank // world, n * (rank + 1) // world)


def rows_of_ranks(n: int, ctx: StepContext) -> list[int]:
    """Every rank's row count, in rank order ([n] in one process): one small all_gather."""
    if ctx.world == 1:
        return [n]
    mine = torch.tensor([n], dtype=torch.int64)
    parts = [torch.zeros(1, dtype=torch.int64) for _ in range(ctx.world)]
    dist.all_gather(parts, mine, group=ctx.group)
    return [int(p) for p in parts]


def share(n: int, sizes: list[int]) -> float:
    """The factor that turns this rank's mean loss over its n rows into its part of the global mean:
    n * W / N (exactly 1.0 when the ranks hold equal parts, and in one process)."""
    total = sum(sizes)
    return n * len(sizes) / total if total else 1.0


def gather_rows(x: torch.Tensor, sizes: list[int], ctx: StepContext) -> torch.Tensor:
    """[n_r, ...] on each rank -> [sum n, ...], ranks in order (x itself in one process).

    Differentiable: the backward sums the gradient of the whole [N, ...] over the ranks and hands each
    rank its rows, as the gradient of sum_r loss_r needs (the trainer then averages over the ranks).
    Integer tensors (ids) are gathered without a graph."""
    if ctx.world == 1:
        return x
    if x.requires_grad:
        out: torch.Tensor = _GatherRows.apply(x, sizes, ctx.rank, ctx.group)
        return out
    return _all_gather(x, sizes, ctx.group)


def _all_gather(x: torch.Tensor, sizes: list[int], group: ProcessGroup | None) -> torch.Tensor:
    longest = max(sizes)
    padded = x.new_zeros((longest, *x.shape[1:]))  # gloo gathers equal shapes: pad to the longest part
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, sizes: list[int], rank: int, group: ProcessGroup | None) -> torch.Tensor:
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        return _all_gather(x.detach(), sizes, group)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        total = grad.contiguous().clone()
        dist.all_reduce(total, group=ctx.group)  # d(sum_r loss_r) / d(every gathered row)
        start = sum(ctx.sizes[: ctx.rank])
        return total[start : start + ctx.sizes[ctx.rank]], None, None, None
