"""Numba CPU kernels of the fused lookups (specs: `hugerec.ops.reference.pooled_lookup` / `sequence_lookup`).

One call serves every feature of a table group and writes straight into the output: pooled bags
at their feature's columns of out [B, C], sequence rows at their feature's rows of out [N_g, D].
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from hugerec.ops.cpu.rows import get
from hugerec.ops.plan import COLUMN, FEATURE, MEAN, MISSING_OK, NUM_ROWS, ROW_OFFSET


def num_chunks(per_thread: int) -> int:
    """Static chunks a prange splits its work into (numba.get_num_threads() inside a kernel would block caching)."""
    return numba.get_num_threads() * per_thread


def as_numpy(weight: torch.Tensor) -> np.ndarray:
    """The storage as the array type `hugerec.ops.cpu.rows` reads: fp32, bf16 bits (int16), fp16 bits (uint16)."""
    if weight.dtype == torch.bfloat16:
        return weight.view(torch.int16).numpy()
    if weight.dtype == torch.float16:
        return weight.view(torch.uint16).numpy()
    return weight.numpy()


def weights_numpy(per_sample_weights: torch.Tensor | None) -> np.ndarray:
    """[N] fp32, or an empty array for "unweighted" (one kernel specialisation for both)."""
    if per_sample_weights is None:
        return np.empty(0, dtype=np.float32)
    return per_sample_weights.detach().to(torch.float32).contiguous().numpy()


@njit(parallel=True, cache=True, fastmath=True, error_model="numpy")
def _pooled_lookup(
    weight: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    per_sample_weights: np.ndarray,
    plan: np.ndarray,
    dim: int,
    out: np.ndarray,
    chunks: int,
) -> int:
    batch = out.shape[0]
    weighted = per_sample_weights.shape[0] > 0
    chunks = max(1, min(batch, chunks))
    invalid = np.zeros(chunks, dtype=np.int64)
    for c in prange(chunks):
        acc = np.empty(dim, dtype=np.float32)
        for b in range(c * batch // chunks, (c + 1) * batch // chunks):
            for j in range(plan.shape[0]):
                bag = plan[j, FEATURE] * batch + b
                row_offset, num_rows, lowest = plan[j, ROW_OFFSET], plan[j, NUM_ROWS], -plan[j, MISSING_OK]
                acc[:] = 0.0
                count = 0
                for i in range(offsets[bag], offsets[bag + 1]):
                    v = values[i]
                    if v < 0 or v >= num_rows:
                        if v < lowest or v >= num_rows:
                            invalid[c] += 1
                        continue
                    r = v + row_offset
                    s = per_sample_weights[i] if weighted else np.float32(1.0)
                    for k in range(dim):
                        acc[k] += s * get(weight, r, k)
                    count += 1
                scale = np.float32(1.0 / count) if plan[j, MEAN] and count > 0 else np.float32(1.0)
                col = plan[j, COLUMN]
                for k in range(dim):
                    out[b, col + k] = acc[k] * scale
    return int(invalid.sum())


@njit(parallel=True, cache=True, error_model="numpy")
def _sequence_lookup(
    weight: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    plan: np.ndarray,
    dim: int,
    batch: int,
    out: np.ndarray,
    chunks: int,
) -> int:
    lines = plan.shape[0]
    invalid = np.zeros(lines * chunks, dtype=np.int64)
    for t in prange(lines * chunks):  # (line, chunk of the line's ids)
        j, c = t // chunks, t % chunks
        start, end = offsets[plan[j, FEATURE] * batch], offsets[(plan[j, FEATURE] + 1) * batch]
        row_offset, num_rows, lowest = plan[j, ROW_OFFSET], plan[j, NUM_ROWS], -plan[j, MISSING_OK]
        n = end - start
        for i in range(start + c * n // chunks, start + (c + 1) * n // chunks):
            o = plan[j, COLUMN] + i - start
            v = values[i]
            if v < 0 or v >= num_rows:
                if v < lowest or v >= num_rows:
                    invalid[t] += 1
                out[o, :] = 0.0
                continue
            r = v + row_offset
            for k in range(dim):
                out[o, k] = get(weight, r, k)
    return int(invalid.sum())


def pooled_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    plan: torch.Tensor,
    dim: int,
    out: torch.Tensor,
) -> int:
    return int(
        _pooled_lookup(
            as_numpy(weight),
            values.numpy(),
            offsets.numpy(),
            weights_numpy(per_sample_weights),
            plan.numpy(),
            dim,
            out.numpy(),
            num_chunks(8),
        )
    )


def sequence_lookup(
    weight: torch.Tensor,
    values: torch.Tensor,
    offsets: torch.Tensor,
    plan: torch.Tensor,
    dim: int,
    batch_size: int,
    out: torch.Tensor,
) -> int:
    return int(
        _sequence_lookup(
            as_numpy(weight), values.numpy(), offsets.numpy(), plan.numpy(), dim, batch_size, out.numpy(), num_chunks(8)
        )
    )
