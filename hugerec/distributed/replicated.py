"""Data-parallel tables: a replica on every rank, updated alike by the fused sparse optimizer.

Forward: each rank looks up its own examples in its replica (no communication). Backward: each rank
turns its output gradient into its touched rows' gradients [U, D] (summed per row, scaled by 1/W as
every gradient of a ShardedEmbeddingCollection), all ranks exchange them (an all-gather by uneven
all_to_all), and every replica applies one fused update to the union of the rows with the summed
gradients: the same step, and the same optimizer state, everywhere. Static tables only: the
replicas of a dynamic table would admit and evict different keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from hugerec.distributed.comm import CommStats, all_to_all
from hugerec.distributed.routing import regroup
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Optimizer
from hugerec.embedding.table_config import Pooling, TableConfig
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor


class _DataParallelUpdate(torch.autograd.Function):
    """Identity on the replicas' output; backward exchanges the touched rows' gradients and updates every replica."""

    @staticmethod
    def forward(
        ctx: Any, values: torch.Tensor, owner: ReplicatedTables, features: SparseFeatures, sequence: bool
    ) -> torch.Tensor:
        ctx.args = (owner, features, sequence)
        return values.view_as(values)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, ...]:
        owner, features, sequence = ctx.args
        owner.step(features, grad, sequence)
        return None, None, None, None


class ReplicatedTables(nn.Module):
    """`tables` replicated on every rank of `group` (their rows live in `collection`)."""

    def __init__(
        self,
        tables: Sequence[TableConfig],
        optimizer: Optimizer,
        device: torch.device,
        group: ProcessGroup | None,
        stats: CommStats,
    ) -> None:
        super().__init__()
        self.collection = EmbeddingCollection(tables, optimizer, device)
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.stats = stats
        self._dims = {f: t.dim for t in tables for f in t.features}

    def lookup(self, features: SparseFeatures, names: list[str], sequence: bool) -> dict[str, torch.Tensor]:
        """The pooled (or sequence) vectors of `names` for this rank's own examples."""
        sub = features.select(names)
        with torch.no_grad():
            if sequence:
                values = [self.collection.sequences(sub)[f].values for f in names]
            else:
                pooled = self.collection(sub)
                values = [pooled[f] for f in names]
        if not (self.training and torch.is_grad_enabled()):
            return dict(zip(names, values, strict=True))
        # one autograd node for all of them: backward gets every feature's gradient at once
        flat = torch.cat([v.reshape(-1) for v in values]).requires_grad_()
        flat = _DataParallelUpdate.apply(flat, self, sub, sequence)
        sizes = [v.numel() for v in values]
        return {f: x.view_as(v) for f, x, v in zip(names, flat.split(sizes), values, strict=True)}

    def step(self, features: SparseFeatures, grad: torch.Tensor, sequence: bool) -> None:
        """Every rank's touched rows and their gradients -> the same fused update on every replica."""
        tables = [t for t in self.collection.tables if (t.pooling is Pooling.NONE) == sequence]
        b = features.batch_size
        grads = grad.split(
            [features[f].values.numel() * self._dims[f] if sequence else b * self._dims[f] for f in features.keys]
        )
        per_feature = dict(zip(features.keys, grads, strict=True))
        rows, row_grads = [], []
        for t in tables:
            ids_t, g_t = [], []
            for f in t.features:
                if f not in per_feature:
                    continue
                j = features[f]
                g = per_feature[f].view(-1, t.dim)  # [n, D] (sequence) or [B, D] (pooled)
                if not sequence:
                    lengths = j.lengths.to(torch.int64)
                    bags = torch.repeat_interleave(torch.arange(b, device=g.device), lengths)  # [n]
                    scale = torch.ones(bags.numel(), device=g.device) if j.weights is None else j.weights.float()
                    if t.pooling is Pooling.MEAN:
                        scale = scale / lengths.clamp(min=1)[bags]
                    g = g[bags] * scale.unsqueeze(1)  # [n, D]: each id's share of its bag's gradient
                ids_t.append(j.values)
                g_t.append(g)
            ids = torch.cat(ids_t) if ids_t else torch.zeros(0, dtype=torch.int64, device=grad.device)
            gs = torch.cat(g_t) if g_t else torch.zeros(0, t.dim, device=grad.device)
            gs = gs / self.world_size  # averaged over the ranks, as the sharded tables' gradients are
            unique, inverse = torch.unique(ids, return_inverse=True)
            rows.append(unique)
            row_grads.append(torch.zeros(unique.numel(), t.dim, device=grad.device).index_add_(0, inverse, gs))
        all_rows, all_grads = self._exchange_rows(rows, row_grads, [t.dim for t in tables])
        self._apply_row_grads(tables, all_rows, all_grads, sequence)

    def _exchange_rows(
        self, rows: list[torch.Tensor], grads: list[torch.Tensor], dims: list[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """All-gather (by all_to_all with uneven sizes) per table: rows [U_t] and gradients [U_t, D_t]."""
        w, t = self.world_size, len(rows)
        counts = torch.tensor([r.numel() for r in rows], dtype=torch.int64, device=rows[0].device if rows else None)
        got = all_to_all(counts.repeat(w), [t] * w, [t] * w, self.group, self.stats, "replica counts").wait()
        sizes = got.view(w, t).cpu()  # [W, T] rows of each table from each rank
        d = torch.tensor(dims, dtype=torch.int64)
        row_buf = torch.cat(rows)
        grad_buf = torch.cat([g.reshape(-1) for g in grads])
        row_all = all_to_all(
            row_buf.repeat(w), [row_buf.numel()] * w, sizes.sum(dim=1).tolist(), self.group, self.stats, "replica rows"
        )
        grad_all = all_to_all(
            grad_buf.repeat(w),
            [grad_buf.numel()] * w,
            (sizes * d).sum(dim=1).tolist(),
            self.group,
            self.stats,
            "replica grads",
        )
        by_table = regroup(row_all.wait(), sizes).split(sizes.sum(dim=0).tolist())
        g_by_table = regroup(grad_all.wait(), sizes * d).split((sizes * d).sum(dim=0).tolist())
        return list(by_table), [g.view(-1, dim) for g, dim in zip(g_by_table, dims, strict=True)]

    def _apply_row_grads(
        self, tables: list[TableConfig], rows: list[torch.Tensor], grads: list[torch.Tensor], sequence: bool
    ) -> None:
        """Apply gradients [U_t, D] of rows [U_t] (repeats summed) with the replicas' fused optimizer.

        A lookup of one-id bags [[row_0], [row_1], ...] followed by its backward with the row gradients
        is exactly "the fused optimizer step on these rows with these gradients".
        """
        names = self.collection.sequence_feature_names if sequence else self.collection.feature_names
        batch = max([1, *(r.numel() for r in rows)])
        device = rows[0].device
        bags, first = {}, {}
        for t, r in zip(tables, rows, strict=True):
            for i, f in enumerate(t.features):
                lengths = torch.zeros(batch, dtype=torch.int32, device=device)
                if i == 0:
                    lengths[: r.numel()] = 1
                    first[f] = (t, r.numel())
                bags[f] = JaggedTensor(r if i == 0 else r[:0], lengths)
        sf = SparseFeatures.from_jagged({f: bags[f] for f in names}, batch_size=batch)
        by_table = {t.name: g for t, g in zip(tables, grads, strict=True)}
        with torch.enable_grad():
            if sequence:
                seqs = self.collection.sequences(sf)
                outs = [seqs[f].values for f in first]
                gs = [by_table[first[f][0].name] for f in first]
                torch.autograd.backward(outs, gs)
            else:
                out = self.collection(sf)
                g_full = torch.zeros_like(out.values)
                offsets = dict(zip(out.keys, out.column_offsets(), strict=True))
                for f, (t, n) in first.items():
                    g_full[:n, offsets[f] : offsets[f] + t.dim] = by_table[t.name]
                out.values.backward(g_full)
