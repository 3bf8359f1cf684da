"""Embedding kernels: tensor in, tensor out. Each op below is the contract; it runs the Numba kernel
for CPU tensors, the Triton kernel (`hugerec.ops.gpu`) for CUDA tensors where Triton is installed
(`HAS_TRITON`, decided once at import; Triton itself is imported only by the first CUDA call), and
the plain-torch reference (`hugerec.ops.reference`) anywhere else.

Common arguments (shape letters: B batch, F features, N ids, R rows, D dim, C output columns):
    weight             [R, D_pad] fp32 / bf16 / fp16: one table group, tables' rows back to back;
                       only columns [:dim] are read or written
    state              [R, S] fp32 optimizer state (layout: `hugerec.ops.update_rule`)
    values             [N] int64 ids of every feature of a SparseFeatures batch (feature-major)
    offsets            [F*B + 1] int64 bag offsets into values
    per_sample_weights [N] fp32 or None
    plan               [F_g, 7] int64 on the CPU: the features this group serves (`hugerec.ops.lookup_plan`)
    dim                D
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Sequence
from types import ModuleType

import torch

from hugerec.ops import reference
from hugerec.ops.cpu import lookup_kernels as cpu_lookup
from hugerec.ops.cpu import sparse_backward as cpu_backward
from hugerec.ops.update_rule import UpdateRule
from hugerec.ops.workspace import Workspace

__all__ = [
    "pooled_lookup",
    "sequence_lookup",
    "sparse_backward",
]


HAS_TRITON = importlib.util.find_spec("triton") is not None
_TRITON_ON_CPU = [False]


@contextlib.contextmanager
def triton_on_cpu() -> Iterator[None]:
    """Within it, CPU tensors take the Triton kernels too (run by Triton's interpreter: set TRITON_INTERPRET=1
    before anything imports hugerec.ops.gpu). How the tests and the GPU benchmark's dry run exercise the CUDA
    path without CUDA; far too slow for anything else."""
    _TRITON_ON_CPU[0] = True
    try:
        yield
    finally:
        _TRITON_ON_CPU[0] = False


def _numba(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and not _TRITON_ON_CPU[0]


def _triton(weight: torch.Tensor) -> bool:
    return HAS_TRITON and (weight.device.type == "cuda" or (_TRITON_ON_CPU[0] and weight.device.type == "cpu"))


def triton_applies(t: torch.Tensor) -> bool:
    """Whether ops on tensors of t's device run the Triton kernels."""
    return _triton(t)


def _gpu(module: str) -> ModuleType:
    """hugerec.ops.gpu.<module>, imported on first use (it imports Triton)."""
    return importlib.import_module(f"hugerec.ops.gpu.{module}")


def bag_offsets(lengths: torch.Tensor, out: torch.Tensor) -> None:
    """out [K + 1] int64 = [0, cumulative sums of lengths [K] (int32 or int64)]: a batch's bag offsets.

    Written into a buffer the caller reuses (SparseFeatures.offsets() allocates, which costs page faults
    at every step under glibc's malloc).
    """
    if _numba(out):
        cpu_lookup.bag_offsets(lengths, out)
    elif _triton(out):
        _gpu("lookup_kernels").bag_offsets(lengths, out)
    else:
        reference.bag_offsets(lengths, out)


def pooled_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    out: torch.Tensor,
) -> int:
    """Pooled bags of the plan's features, written into out [B, C] fp32 (contiguous) in place.

    out[b, COLUMN:COLUMN+dim] = sum over the bag's ids i with a row of
        per_sample_weights[i] * weight[ROW_OFFSET + values[i], :dim]   (/ that count for MEAN; 0 if none)
    Returns the number of invalid ids (skipped); the caller raises when it is not 0.
    """
    if _numba(weight):
        return cpu_lookup.pooled_lookup(weight, values, offsets, per_sample_weights, plan, dim, out)
    if _triton(weight):
        return int(_gpu("lookup_kernels").pooled_lookup(weight, values, offsets, per_sample_weights, plan, dim, out))
    return reference.pooled_lookup(weight, values, offsets, per_sample_weights, plan, dim, out)


def pooled_lookup_groups(
    weights: Sequence[torch.Tensor],
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plans: Sequence[torch.Tensor],
    dims: Sequence[int],
    out: torch.Tensor,
) -> int:
    """`pooled_lookup` of several table groups (weights[g], plans[g], dims[g]) into one out [B, C]; returns
    the invalid ids of all groups. On CUDA the groups of one storage dtype share one launch (tables of
    mixed dims in one kernel), and the count is read back once for all of them."""
    if not weights or not _triton(weights[0]):
        return sum(
            pooled_lookup(w, values, offsets, per_sample_weights, p, d, out)
            for w, p, d in zip(weights, plans, dims, strict=True)
        )
    kernels = _gpu("lookup_kernels")
    counts = []
    for dtype in dict.fromkeys(w.dtype for w in weights):
        picked = [i for i, w in enumerate(weights) if w.dtype == dtype]
        counts.append(
            kernels.pooled_lookup_groups(
                [weights[i] for i in picked],
                values,
                offsets,
                per_sample_weights,
                [plans[i] for i in picked],
                [dims[i] for i in picked],
                out,
            )
        )
    return int(torch.cat(counts).sum().item())


def sequence_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    out: torch.Tensor,
) -> int:
    """One row per id: out[COLUMN + p] = weight[ROW_OFFSET + id_p, :dim] for the p-th id of each plan feature.

    out [N_g, D] fp32 contiguous; ids without a row give zeros. Returns the number of invalid ids.
    """
    if _numba(weight):
        return cpu_lookup.sequence_lookup(weight, values, offsets, plan, dim, batch_size, out)
    if _triton(weight):
        return int(_gpu("lookup_kernels").sequence_lookup(weight, values, offsets, plan, dim, batch_size, out))
    return reference.sequence_lookup(weight, values, offsets, plan, dim, batch_size, out)


def sparse_backward(
    weight: torch.Tensor,
    state: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    sequence: bool,
    grad: torch.Tensor,
    rule: UpdateRule,
    lrs: torch.Tensor,
    workspace: Workspace,
) -> None:
    """The fused backward of `pooled_lookup` (sequence=False, grad [B, C]) or `sequence_lookup`
    (sequence=True, grad [N_g, D]): for each table of the plan, the gradients of its touched rows are
    deduplicated and summed, then `rule` updates those rows of weight and state in place with the
    table's learning rate lrs[TABLE] (lrs: [T_g] float64 on the CPU). Ids without a row are skipped.
    """
    if _numba(weight):
        cpu_backward.sparse_backward(
            weight,
            state,
            values,
            offsets,
            per_sample_weights,
            plan,
            dim,
            batch_size,
            sequence,
            grad,
            rule,
            lrs,
            workspace,
        )
    else:
        backward = _gpu("sparse_backward").sparse_backward if _triton(weight) else reference.sparse_backward
        backward(
            weight,
            state,
            values,
            offsets,
            per_sample_weights,
            plan,
            dim,
            batch_size,
            sequence,
            grad,
            rule,
            lrs,
            workspace,
        )


def per_sample_weight_grad(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    grad: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Adds d loss / d per_sample_weights of the plan's ids into out [N] (torch on every device: a rare path)."""
    reference.per_sample_weight_grad(weight, values, offsets, plan, dim, grad, out)
