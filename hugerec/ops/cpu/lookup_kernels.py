"""Numba CPU kernels of the fused lookups (specs: `hugerec.ops.reference.pooled_lookup` / `sequence_lookup`).

One call serves every feature of a table group and writes straight into the output: pooled bags
at their feature's columns of out [B, C], sequence rows at their feature's rows of out [N_g, D].
Work is split by (feature, chunk of examples), so each piece reads a contiguous run of ids, and the
row of the id AHEAD positions later is prefetched: the loop body between two random row loads is
long enough that the out-of-order window alone keeps few rows in flight. Per-bag bookkeeping is what this costs
over a bare torch.index_select of the same rows (figures in benchmarks/README.md).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from hugerec.ops.cpu.rows import get, prefetch
from hugerec.ops.lookup_plan import COLUMN, FEATURE, MEAN, MISSING_OK, NUM_ROWS, ROW_OFFSET

AHEAD = 8  # ids between a prefetch and the use of its row


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


@njit(cache=True, error_model="numpy")
def _bag_offsets(lengths: np.ndarray, out: np.ndarray) -> None:
    total = 0
    out[0] = 0
    for i in range(lengths.shape[0]):
        total += lengths[i]
        out[i + 1] = total


@njit(inline="always", cache=True)
def one_id_per_bag(offsets: np.ndarray, first: int, last: int) -> bool:
    """Whether bags first..last - 1 hold exactly one id each (one sequential pass over their offsets)."""
    if offsets[last] - offsets[first] != last - first:
        return False
    for bag in range(first, last):  # noqa: SIM110 (a loop: all() over a generator does not compile in Numba)
        if offsets[bag + 1] - offsets[bag] != 1:
            return False
    return True


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
    batch, lines = out.shape[0], plan.shape[0]
    weighted = per_sample_weights.shape[0] > 0
    chunks = max(1, min(batch, chunks))
    invalid = np.zeros(lines * chunks, dtype=np.int64)
    for t in prange(lines * chunks):  # (plan line, chunk of its bags): its ids are contiguous in values
        j, c = t // chunks, t % chunks
        feature, row_offset, num_rows = plan[j, FEATURE], plan[j, ROW_OFFSET], plan[j, NUM_ROWS]
        lowest, col, mean = -plan[j, MISSING_OK], plan[j, COLUMN], plan[j, MEAN]
        first, last = c * batch // chunks, (c + 1) * batch // chunks
        start, stop = offsets[feature * batch + first], offsets[feature * batch + last]
        if one_id_per_bag(offsets, feature * batch + first, feature * batch + last):
            for b in range(first, last):  # the common one-hot case, without the per-bag bookkeeping
                i = start + b - first
                if i + AHEAD < stop and 0 <= values[i + AHEAD] < num_rows:
                    prefetch(weight, (values[i + AHEAD] + row_offset) * weight.shape[1], dim)
                o = out[b, col : col + dim]
                v = values[i]
                if v < 0 or v >= num_rows:
                    if v < lowest or v >= num_rows:
                        invalid[t] += 1
                    o[:] = 0.0
                    continue
                s = per_sample_weights[i] if weighted else np.float32(1.0)
                row = weight[v + row_offset]
                for k in range(dim):
                    o[k] = s * get(row, k)
            continue
        for b in range(first, last):
            bag = feature * batch + b
            o = out[b, col : col + dim]
            count = 0
            for i in range(offsets[bag], offsets[bag + 1]):
                if i + AHEAD < stop and 0 <= values[i + AHEAD] < num_rows:
                    prefetch(weight, (values[i + AHEAD] + row_offset) * weight.shape[1], dim)
                v = values[i]
                if v < 0 or v >= num_rows:
                    if v < lowest or v >= num_rows:
                        invalid[t] += 1
                    continue
                s = per_sample_weights[i] if weighted else np.float32(1.0)
                row = weight[v + row_offset]
                if count == 0:  # the first row initialises the output: no zeroing pass
                    for k in range(dim):
                        o[k] = s * get(row, k)
                else:
                    for k in range(dim):
                        o[k] += s * get(row, k)
                count += 1
            if count == 0:
                o[:] = 0.0
            elif mean and count > 1:
                scale = np.float32(1.0 / count)
                for k in range(dim):
                    o[k] *= scale
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
        first, last = start + c * n // chunks, start + (c + 1) * n // chunks
        for i in range(first, last):
            if i + AHEAD < last and 0 <= values[i + AHEAD] < num_rows:
                prefetch(weight, (values[i + AHEAD] + row_offset) * weight.shape[1], dim)
            o = out[plan[j, COLUMN] + i - start]
            v = values[i]
            if v < 0 or v >= num_rows:
                if v < lowest or v >= num_rows:
                    invalid[t] += 1
                o[:] = 0.0
                continue
            row = weight[v + row_offset]
            for k in range(dim):
                o[k] = get(row, k)
    return int(invalid.sum())


def bag_offsets(lengths: torch.Tensor, out: torch.Tensor) -> None:
    _bag_offsets(lengths.contiguous().numpy(), out.numpy())


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
