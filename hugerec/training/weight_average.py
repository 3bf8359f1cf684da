"""Epoch-tail weight averaging (stochastic weight averaging, Izmailov et al. 2018, taken at epoch ends): the model
that is evaluated and kept is the mean of the weights at the last K epoch ends, while training goes on from the
raw weights. With a constant learning rate the weights wander around a minimum from epoch to epoch; their mean
sits nearer its centre and scores steadier than any one of them.

    tail = EpochAverage(model, k=3)        refuses, in one line, a model it cannot average (below)
    tail.push(step)                        at an epoch end: a copy of the weights as they are, into the ring
    with tail.averaged(step): ...          the mean in the model (evaluate, save it), the raw weights back after
    tail.load_average(step)                the mean in the model for good (the end of training)

The mean at `step` is over the newest K snapshots when a snapshot was taken at `step` (an epoch end); between
epoch ends (an evaluation every N steps, the end of a run cut by max_steps) the weights as they are count as the
newest snapshot, beside the K - 1 before them. Fewer snapshots than that so far: the mean of those there are.
`averaged(step, k)` gives the mean of any k <= K of them (a benchmark reads several K from one run).

What is averaged: every trainable tensor. The dense parameters (requires_grad) and the rows of every in-memory
embedding table (the fused groups' weight buffers, padding columns included: they stay zero). Not averaged: the
optimizer state (the dense optimizer's, the tables' Adam moments and Adagrad sums), the tables' Adam step
counts and the buffers (a batch norm's running statistics: training's own, as they are).

Memory: the ring holds K copies of those tensors (K copies of the tables: a 100 GB table at K = 5 needs 500 GB
more); an evaluation between epoch ends holds one more copy of the raw weights while the mean is in the model.
Means are summed in float64 one chunk of 4M values at a time (a transient 32 MB), then cast to each tensor's
dtype.

Refused: disk-tier tables (their rows live on disk behind a RAM cache: the ring would be the whole table in
RAM) and dynamic tables (a row's key can change between epochs, and a mean of two keys' rows is no one's
row). Sharded models (torch.distributed): each rank averages what it holds, its shard of the tables and its
replica of the dense part; the ring is that rank's state (the trainer keeps it in the rank's checkpoint part).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hugerec.embedding.fused import sparse_tables

CHUNK = 1 << 22  # values summed at a time (float64): bounds the transient memory of a mean


def trainable_tensors(model: nn.Module, key: str = "average_epochs") -> list[torch.Tensor]:
    """The tensors a mean is taken of, live (writes go to the model): every in-memory table group's weight
    buffer, then every dense parameter with requires_grad that is not a view of one of those buffers.
    ValueError naming `key` and the table for a disk-tier or dynamic table."""
    out: list[torch.Tensor] = []
    table_storages: set[int] = set()
    for fused in sparse_tables(model):
        for name, config in fused.configs.items():
            if name in fused.tiers:
                raise ValueError(
                    f"{key}: table {name!r} lives on disk (storage 'disk'); epoch averaging keeps copies of whole "
                    "tables in memory: use average_epochs = 1 for a model with disk tables"
                )
            if config.dynamic is not None:
                raise ValueError(
                    f"{key}: table {name!r} is dynamic (its rows change keys as ids come and go), so a mean of its "
                    "rows across epochs would mix keys: use average_epochs = 1 for a model with dynamic tables"
                )
        for group in fused.groups:
            out.append(group.weight)
            table_storages.add(group.weight.untyped_storage().data_ptr())
    for p in model.parameters():
        if p.requires_grad and p.untyped_storage().data_ptr() not in table_storages:
            out.append(p.data)
    return out


class EpochAverage:
    """The ring of the last K epoch-end snapshots of a model's trainable tensors, and their mean."""

    def __init__(self, model: nn.Module, k: int, key: str = "average_epochs") -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"{key}: the epochs to average must be an int >= 2, got {k!r}")
        self.k, self.key = k, key
        self.tensors = trainable_tensors(model, key)
        self.ring: list[list[torch.Tensor]] = []  # oldest first, at most k
        self.steps: list[int] = []  # the step each snapshot was taken at

    def push(self, step: int) -> None:
        """A snapshot of the weights as they are at `step` (once per step: a second push at the same step is a no-op)."""
        if self.steps and self.steps[-1] == step:
            return
        self.ring.append([t.detach().clone() for t in self.tensors])
        self.steps.append(step)
        del self.ring[: -self.k], self.steps[: -self.k]

    def members(self, step: int, k: int | None = None) -> list[list[torch.Tensor]]:
        """The snapshots whose mean is the model at `step` (the live tensors counting as the newest between
        epoch ends), over the newest `k` (default K)."""
        k = self.k if k is None else k
        if not 1 <= k <= self.k:
            raise ValueError(f"{self.key}: a mean of {k} epochs from a ring of {self.k}")
        if self.steps and self.steps[-1] == step:
            return self.ring[-k:]
        return [*(self.ring[max(len(self.ring) - (k - 1), 0) :] if k > 1 else []), self.tensors]

    def load_average(self, step: int, k: int | None = None) -> None:
        """The mean of `members(step, k)` written into the model's tensors."""
        members = self.members(step, k)
        for i, target in enumerate(self.tensors):
            mean_into(target, [m[i] for m in members])

    @contextmanager
    def averaged(self, step: int, k: int | None = None) -> Iterator[None]:
        """The mean in the model inside the block; the raw weights back after it (from the ring when `step`
        was pushed, else from a copy taken here)."""
        at_push = bool(self.steps) and self.steps[-1] == step
        backup = None if at_push else [t.detach().clone() for t in self.tensors]
        self.load_average(step, k)
        try:
            yield
        finally:
            raw = self.ring[-1] if backup is None else backup
            with torch.no_grad():
                for target, value in zip(self.tensors, raw, strict=True):
                    target.copy_(value)

    def state_dict(self) -> dict[str, Any]:
        """The ring as tensors and plain data (for a checkpoint)."""
        return {"k": self.k, "steps": list(self.steps), "weights": [list(s) for s in self.ring]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The ring of a checkpoint; ValueError naming the key when it does not fit this model or K."""
        if int(state["k"]) != self.k:
            raise ValueError(f"{self.key}: the checkpoint's ring averages {state['k']} epochs, this run {self.k}")
        ring = [list(s) for s in state["weights"]]
        shapes = [tuple(t.shape) for t in self.tensors]
        for snapshot in ring:
            if [tuple(t.shape) for t in snapshot] != shapes:
                raise ValueError(f"{self.key}: the checkpoint's ring holds tensors of another model (shapes differ)")
        self.ring = [
            [t.to(device=live.device, dtype=live.dtype) for t, live in zip(s, self.tensors, strict=True)] for s in ring
        ]
        self.steps = [int(s) for s in state["steps"]]


@torch.no_grad()
def mean_into(target: torch.Tensor, sources: list[torch.Tensor]) -> None:
    """target = the elementwise mean of `sources` (same shape; `target` may be one of them), summed in float64
    chunk by chunk, cast to target's dtype."""
    n = len(sources)
    if not target.is_contiguous() or any(not s.is_contiguous() for s in sources):
        total = torch.zeros(target.shape, dtype=torch.float64, device=target.device)
        for s in sources:
            total += s
        target.copy_(total / n)
        return
    flat = target.view(-1)
    views = [s.view(-1) for s in sources]
    for start in range(0, flat.numel(), CHUNK):
        end = min(start + CHUNK, flat.numel())
        total = torch.zeros(end - start, dtype=torch.float64, device=target.device)
        for v in views:
            total += v[start:end]
        flat[start:end].copy_(total / n)
