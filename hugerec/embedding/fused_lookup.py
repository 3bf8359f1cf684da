"""The fused lookups as autograd ops: forward runs one kernel per table group, backward is the sparse update.

The rows are not Parameters, so autograd would never call our backward. A zero-size `anchor` tensor
that requires grad is passed as an input to record the op; backward then receives the output
gradient, applies the fused optimizer to the touched rows in place and returns no gradient for the
rows (only, when asked, for the per-sample weights).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hugerec import ops
from hugerec.embedding.fused import FusedTables
from hugerec.ops.lookup_plan import FEATURE, MISSING_OK, NUM_ROWS, TABLE


@dataclass(frozen=True)
class GroupPlan:
    """The part of one lookup that a table group serves: plan [F_g, 7] (see `hugerec.ops.lookup_plan`)."""

    group: int
    plan: torch.Tensor
    features: tuple[str, ...]  # feature name of each plan line, for error messages


def raise_invalid(
    fused: FusedTables, plans: Sequence[GroupPlan], values: torch.Tensor, offsets: torch.Tensor, batch: int
) -> None:
    """Names the first invalid id of the plans (the kernels only count them)."""
    for gp in plans:
        _raise_first_invalid(fused, gp, values, offsets, batch)
    raise AssertionError("a kernel counted invalid ids that the check did not find")


def _raise_first_invalid(
    fused: FusedTables, gp: GroupPlan, values: torch.Tensor, offsets: torch.Tensor, batch: int
) -> None:
    group = fused.groups[gp.group]
    for name, line in zip(gp.features, gp.plan.tolist(), strict=True):
        f, num_rows, missing_ok = line[FEATURE], line[NUM_ROWS], line[MISSING_OK]
        start, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
        ids = values[start:end]
        bad = ((ids < 0) | (ids >= num_rows)) & ~((ids == -1) & bool(missing_ok))
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            example = int(torch.searchsorted(offsets[f * batch : (f + 1) * batch + 1], start + i, right=True)) - 1
            table = group.tables[line[TABLE]]
            raise ValueError(
                f"feature {name!r} (table {table!r}, num_rows {num_rows}): id {int(ids[i])} of example {example} "
                f"is outside [0, {num_rows})"
            )


def _pooled_forward(
    fused: FusedTables,
    plans: Sequence[GroupPlan],
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    batch: int,
    columns: int,
) -> torch.Tensor:
    out = fused.outputs.empty((batch, columns), torch.float32, values.device)  # every column gets written
    groups = [fused.groups[gp.group] for gp in plans]
    weights, dims = [g.weight for g in groups], [g.dim for g in groups]
    if ops.pooled_lookup_groups(weights, values, offsets, per_sample_weights, [gp.plan for gp in plans], dims, out):
        raise_invalid(fused, plans, values, offsets, batch)
    return out


def _update(
    fused: FusedTables,
    gp: GroupPlan,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    batch: int,
    sequence: bool,
    grad: torch.Tensor,
) -> None:
    g = fused.groups[gp.group]
    lrs = fused.advance(gp.group, sorted(set(gp.plan[:, TABLE].tolist())))
    ops.sparse_backward(
        g.weight,
        g.state,
        values,
        offsets,
        per_sample_weights,
        gp.plan,
        g.dim,
        batch,
        sequence,
        grad.to(torch.float32).contiguous(),
        g.rule,
        lrs,
        g.workspace,
    )


class _PooledLookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
        fused: FusedTables,
        plans: Sequence[GroupPlan],
        values: torch.Tensor,
        offsets: torch.Tensor,
        batch: int,
        columns: int,
        update: bool,
    ) -> torch.Tensor:
        w = None if per_sample_weights is None else per_sample_weights.detach()
        out = _pooled_forward(fused, plans, values, offsets, w, batch, columns)
        ctx.args = (fused, plans, values, offsets, w, batch, update)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        fused, plans, values, offsets, w, batch, update = ctx.args
        w_grad = None
        if ctx.needs_input_grad[1]:  # before the update: the gradient is taken at the forward's rows
            w_grad = torch.zeros(values.shape[0], dtype=torch.float32, device=grad.device)
            for gp in plans:
                g = fused.groups[gp.group]
                ops.per_sample_weight_grad(g.weight, values, offsets, gp.plan, g.dim, grad, w_grad)
        if update:
            for gp in plans:
                _update(fused, gp, values, offsets, w, batch, False, grad)
        return (None, w_grad, None, None, None, None, None, None, None)


def pooled_lookup(
    fused: FusedTables,
    plans: Sequence[GroupPlan],
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    batch: int,
    columns: int,
    update: bool,
) -> torch.Tensor:
    """[B, columns] fp32 pooled embeddings; with `update` (and grad enabled) backward updates the rows.

    values [N] int64, offsets [F*B + 1] int64, per_sample_weights [N] fp32 or None, all contiguous.
    """
    weights_grad = per_sample_weights is not None and per_sample_weights.requires_grad
    if torch.is_grad_enabled() and (update or weights_grad):
        anchor = torch.empty(0, requires_grad=True)
        out: torch.Tensor = _PooledLookup.apply(
            anchor, per_sample_weights, fused, plans, values, offsets, batch, columns, update
        )
        return out
    with torch.no_grad():
        return _pooled_forward(fused, plans, values, offsets, per_sample_weights, batch, columns)


def _sequence_forward(
    fused: FusedTables,
    plans: Sequence[GroupPlan],
    values: torch.Tensor,
    offsets: torch.Tensor,
    batch: int,
    sizes: Sequence[int],
) -> tuple[torch.Tensor, ...]:
    outs = []
    for gp, size in zip(plans, sizes, strict=True):
        g = fused.groups[gp.group]
        out = fused.outputs.empty((size, g.dim), torch.float32, values.device)
        if ops.sequence_lookup(g.weight, values, offsets, gp.plan, g.dim, batch, out):
            raise_invalid(fused, [gp], values, offsets, batch)
        outs.append(out)
    return tuple(outs)


class _SequenceLookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        fused: FusedTables,
        plans: Sequence[GroupPlan],
        values: torch.Tensor,
        offsets: torch.Tensor,
        batch: int,
        sizes: Sequence[int],
    ) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused output must not count as a zero gradient (Adam would move)
        ctx.args = (fused, plans, values, offsets, batch)
        return _sequence_forward(fused, plans, values, offsets, batch, sizes)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[None, ...]:
        fused, plans, values, offsets, batch = ctx.args
        for gp, grad in zip(plans, grads, strict=True):
            if grad is not None:
                _update(fused, gp, values, offsets, None, batch, True, grad)
        return (None,) * 7


def sequence_lookup(
    fused: FusedTables,
    plans: Sequence[GroupPlan],
    values: torch.Tensor,
    offsets: torch.Tensor,
    batch: int,
    sizes: Sequence[int],
    update: bool,
) -> tuple[torch.Tensor, ...]:
    """One [sizes[i], D_i] fp32 tensor of rows per group plan (plan COLUMN = first output row of each feature)."""
    if torch.is_grad_enabled() and update:
        out: tuple[torch.Tensor, ...] = _SequenceLookup.apply(
            torch.empty(0, requires_grad=True), fused, plans, values, offsets, batch, sizes
        )
        return out
    with torch.no_grad():
        return _sequence_forward(fused, plans, values, offsets, batch, sizes)
