"""Numba CPU kernel of the fused backward (spec: `hugerec.ops.reference.sparse_backward`).

No dense gradient, no [N, D] gradient either:

1. dedupe, in parallel over tables (their rows are disjoint): a row -> slot map (kept at -1 between
   calls) gives each touched row a slot; then, in one of two modes:
   - accumulate (when an [N, D] fp32 buffer is small, at most ACCUMULATE_MAX_BYTES): each id's output
     gradient is added to its slot's row of the buffer right away, reading the output gradient in order;
   - occurrences (large N x D): each id becomes an occurrence (output-gradient offset, scale), and a
     counting sort groups the occurrences by slot;
2. in parallel over the unique rows: the row's summed gradient (the buffer's row, or its occurrences
   summed into a D-wide local buffer), then the update rule applied to the row and its state in place.

Both modes sum a row's gradients in id order, so they give the same result. Accumulating saves a
random read of the output gradient per id in phase 2 (hot rows have many ids).

Plain SGD (no weight decay) skips both: it is linear, so each id updates its row directly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from hugerec.ops.cpu.lookup import as_numpy, num_chunks, one_id_per_bag, weights_numpy
from hugerec.ops.cpu.rows import get, prefetch, put
from hugerec.ops.plan import COLUMN, FEATURE, MEAN, NUM_ROWS, ROW_OFFSET, TABLE
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": a NaN must stay visible
# Prefetch distances of phase 2 (software prefetching pays there: each unique row is a chain of dependent
# random loads that the out-of-order window cannot overlap on its own)
SLOTS_AHEAD, OCCURRENCES_AHEAD, ROWS_AHEAD = 4, 8, 16
ACCUMULATE_MAX_BYTES = 64 << 20  # largest [N, D] fp32 buffer of the accumulate mode (else: occurrences)
_SGD, _ADAGRAD, _ROWWISE, _ADAM, _FTRL = (int(k) for k in RuleKind)


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _update_row(kind: int, w: np.ndarray, st: np.ndarray, g: np.ndarray, dim: int, lr: float, hp: np.ndarray) -> None:
    """One row's update in place: w = weight[r] (storage dtype), st = state[r], g [D] its summed gradient."""
    eps, beta1, beta2, decay = np.float32(hp[0]), np.float32(hp[1]), np.float32(hp[2]), np.float32(hp[3])
    lr32 = np.float32(lr)
    if decay != 0.0:
        for k in range(dim):
            g[k] += decay * get(w, k)
    if kind == _SGD:
        for k in range(dim):
            put(w, k, get(w, k) - lr32 * g[k])
    elif kind == _ADAGRAD:
        for k in range(dim):
            s = st[k] + g[k] * g[k]
            st[k] = s
            put(w, k, get(w, k) - lr32 * g[k] / (np.sqrt(s) + eps))
    elif kind == _ROWWISE:
        sq = np.float32(0.0)
        for k in range(dim):
            sq += g[k] * g[k]
        s = st[0] + sq / np.float32(dim)
        st[0] = s
        step = lr32 / (np.sqrt(s) + eps)
        for k in range(dim):
            put(w, k, get(w, k) - step * g[k])
    elif kind == _ADAM:
        one = np.float32(1.0)
        for k in range(dim):
            m = st[k] + (g[k] - st[k]) * (one - beta1)
            v = st[dim + k] + (g[k] * g[k] - st[dim + k]) * (one - beta2)
            st[k] = m
            st[dim + k] = v
            put(w, k, get(w, k) - lr32 * (m / (np.sqrt(v) + eps)))
    else:  # FTRL
        l1, l2, beta, power = np.float32(hp[4]), np.float32(hp[5]), np.float32(hp[6]), -np.float32(hp[7])
        for k in range(dim):
            x = get(w, k)
            n = st[dim + k]
            n_new = n + g[k] * g[k]
            n_pow = np.sqrt(n_new) if power == 0.5 else n_new**power
            n_old_pow = np.sqrt(n) if power == 0.5 else n**power
            z = st[k] + g[k] - (n_pow - n_old_pow) / lr32 * x
            st[k] = z
            st[dim + k] = n_new
            if abs(z) <= l1:
                put(w, k, np.float32(0.0))
            else:
                put(w, k, (math.copysign(l1, z) - z) / ((beta + n_pow) / lr32 + np.float32(2.0) * l2))


@njit(inline="always", cache=True)
def _enter_bag(
    offsets: np.ndarray, first_bag: int, b: int, i: int, values: np.ndarray, num_rows: int, mean: bool
) -> tuple[int, np.int64, np.float32]:
    """Walking a feature's ids in order, id i has just left bag b (bags from offsets[first_bag]): the bag
    holding i (empty bags skipped), its end, and its gradient scale (1 / its valid ids for MEAN, else 1)."""
    while offsets[first_bag + b + 1] <= i:
        b += 1
    end = offsets[first_bag + b + 1]
    scale = np.float32(1.0)
    if mean:
        count = 0
        for q in range(i, end):
            count += 1 if 0 <= values[q] < num_rows else 0
        scale = np.float32(1.0 / max(count, 1))
    return b, end, scale


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def _sparse_backward(
    weight: np.ndarray,
    state: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    per_sample_weights: np.ndarray,
    plan: np.ndarray,
    dim: int,
    batch: int,
    sequence: bool,
    grad: np.ndarray,
    kind: int,
    hp: np.ndarray,
    lrs: np.ndarray,
    row_map: np.ndarray,
    scratch: np.ndarray,
    occ_scale: np.ndarray,
    tmp_scale: np.ndarray,
    acc: np.ndarray,
    chunks: int,
) -> None:
    # acc [N, D] fp32 (or [0, D]: the occurrence mode): per slot, its summed gradient
    # int64 scratch [7, N]: per slot u: row, count -> begin, end; per occurrence: slot, offset, and the
    # slot-sorted (CSR) offset; the compacted list of slots
    slot_row, begin, end, occ_slot, tmp_offset, occ_offset, slots = (
        scratch[0],
        scratch[1],
        scratch[2],
        scratch[3],
        scratch[4],
        scratch[5],
        scratch[6],
    )
    weighted = per_sample_weights.shape[0] > 0 and not sequence
    columns = grad.shape[1]
    flat = grad.reshape(-1)
    tables = lrs.shape[0]
    # table t's slots and occurrences live in [base[t], base[t] + its number of ids)
    base = np.zeros(tables + 1, dtype=np.int64)
    for j in range(plan.shape[0]):
        f = plan[j, FEATURE]
        base[plan[j, TABLE] + 1] += offsets[(f + 1) * batch] - offsets[f * batch]
    for t in range(tables):
        base[t + 1] += base[t]
    unique = np.zeros(tables, dtype=np.int64)
    accumulate = acc.shape[0] > 0

    for t in prange(tables):  # 1. dedupe: tables own disjoint rows, so their slots never collide
        n_slots, k = 0, base[t]
        for j in range(plan.shape[0]):
            if plan[j, TABLE] != t:
                continue
            f, row_offset, num_rows, col = plan[j, FEATURE], plan[j, ROW_OFFSET], plan[j, NUM_ROWS], plan[j, COLUMN]
            feature_start, feature_stop = offsets[f * batch], offsets[(f + 1) * batch]
            mean = plan[j, MEAN] != 0 and not sequence
            # ids in order; the bag of id i only matters for pooled outputs: i's own when every bag holds
            # one id (no per-bag bookkeeping), else tracked as i crosses bag ends
            flat_ids = sequence or one_id_per_bag(offsets, f * batch, (f + 1) * batch)
            b, bag_end, bag_scale = 0, np.int64(-1), np.float32(1.0)
            for i in range(feature_start, feature_stop):
                if flat_ids:
                    b = i - feature_start
                elif i >= bag_end:
                    b, bag_end, bag_scale = _enter_bag(offsets, f * batch, b, i, values, num_rows, mean)
                # row_map spans every row of the group: a cache miss per id unless fetched early
                if i + ROWS_AHEAD < feature_stop:
                    ahead = values[i + ROWS_AHEAD]
                    if 0 <= ahead < num_rows:
                        prefetch(row_map, ahead + row_offset, 1)
                    if accumulate and flat_ids and not sequence:  # pooled gradients: one line per row of grad
                        prefetch(flat, (b + ROWS_AHEAD) * columns + col, dim)
                v = values[i]
                if v < 0 or v >= num_rows:
                    continue
                r = v + row_offset
                u = row_map[r]
                fresh = u < 0
                if fresh:
                    u = base[t] + n_slots
                    n_slots += 1
                    row_map[r] = u
                    slot_row[u] = r
                    end[u] = 0
                o = (col + i - feature_start) * dim if sequence else b * columns + col
                s = bag_scale * per_sample_weights[i] if weighted else bag_scale
                if accumulate:  # in id order, as the occurrence mode sums them
                    a = acc[u]
                    if fresh:
                        for d in range(dim):
                            a[d] = s * flat[o + d]
                    else:
                        for d in range(dim):
                            a[d] += s * flat[o + d]
                    continue
                end[u] += 1  # the count, for now
                occ_slot[k] = u
                tmp_offset[k] = o
                tmp_scale[k] = s
                k += 1
        unique[t] = n_slots
        if accumulate:
            for u in range(base[t], base[t] + n_slots):
                row_map[slot_row[u]] = -1
            continue
        position = base[t]  # counting sort of the occurrences by slot
        for u in range(base[t], base[t] + n_slots):
            row_map[slot_row[u]] = -1
            begin[u] = position
            position += end[u]
            end[u] = begin[u]
        for q in range(base[t], k):
            u = occ_slot[q]
            occ_offset[end[u]] = tmp_offset[q]
            occ_scale[end[u]] = tmp_scale[q]
            end[u] += 1

    n = 0
    for t in range(tables):
        for u in range(base[t], base[t] + unique[t]):
            slots[n] = u
            occ_slot[u] = t  # reused: the table of slot u
            n += 1

    chunks = max(1, min(n, chunks))
    for c in prange(chunks):  # 2. sum each unique row's gradient, then update the row and its state
        g = np.empty(dim, dtype=np.float32)
        last = (c + 1) * n // chunks
        for q in range(c * n // chunks, last):
            u = slots[q]
            if q + SLOTS_AHEAD < last:  # the row, state and first gradients of a slot a few steps ahead
                later = slots[q + SLOTS_AHEAD]
                prefetch(weight, slot_row[later] * weight.shape[1], dim)
                prefetch(state, slot_row[later] * state.shape[1], state.shape[1])
                if not accumulate:
                    for p in range(begin[later], min(end[later], begin[later] + 2)):
                        prefetch(flat, occ_offset[p], dim)
            r = slot_row[u]
            if accumulate:  # acc[u] is this slot's alone: the update may use it as its scratch
                _update_row(kind, weight[r], state[r], acc[u], dim, lrs[occ_slot[u]], hp)
                continue
            g[:] = 0.0
            for p in range(begin[u], end[u]):
                if p + OCCURRENCES_AHEAD < end[u]:
                    prefetch(flat, occ_offset[p + OCCURRENCES_AHEAD], dim)
                s = occ_scale[p]
                rows = flat[occ_offset[p] : occ_offset[p] + dim]
                for d in range(dim):
                    g[d] += s * rows[d]
            _update_row(kind, weight[r], state[r], g, dim, lrs[occ_slot[u]], hp)


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def _sgd_backward(
    weight: np.ndarray,
    values: np.ndarray,
    offsets: np.ndarray,
    per_sample_weights: np.ndarray,
    plan: np.ndarray,
    dim: int,
    batch: int,
    sequence: bool,
    grad: np.ndarray,
    lrs: np.ndarray,
) -> None:
    """Plain SGD is linear in the gradient: each id updates its row directly, no deduplication. In
    parallel over tables, whose rows are disjoint, so no two threads write one row."""
    weighted = per_sample_weights.shape[0] > 0 and not sequence
    columns = grad.shape[1]
    flat = grad.reshape(-1)
    for t in prange(lrs.shape[0]):
        lr = np.float32(lrs[t])
        for j in range(plan.shape[0]):
            if plan[j, TABLE] != t:
                continue
            f, row_offset, num_rows, col = plan[j, FEATURE], plan[j, ROW_OFFSET], plan[j, NUM_ROWS], plan[j, COLUMN]
            feature_start, stop = offsets[f * batch], offsets[(f + 1) * batch]
            mean = plan[j, MEAN] != 0 and not sequence
            flat_ids = sequence or one_id_per_bag(offsets, f * batch, (f + 1) * batch)
            b, bag_end, bag_scale = 0, np.int64(-1), np.float32(1.0)
            for i in range(feature_start, stop):
                if flat_ids:
                    b = i - feature_start
                elif i >= bag_end:
                    b, bag_end, bag_scale = _enter_bag(offsets, f * batch, b, i, values, num_rows, mean)
                if i + OCCURRENCES_AHEAD < stop and 0 <= values[i + OCCURRENCES_AHEAD] < num_rows:
                    prefetch(weight, (values[i + OCCURRENCES_AHEAD] + row_offset) * weight.shape[1], dim)
                v = values[i]
                if v < 0 or v >= num_rows:
                    continue
                s = lr * bag_scale * per_sample_weights[i] if weighted else lr * bag_scale
                o = (col + i - feature_start) * dim if sequence else b * columns + col
                g = flat[o : o + dim]
                row = weight[v + row_offset]
                for k in range(dim):
                    put(row, k, get(row, k) - s * g[k])


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
    flat_grad = grad.detach().to(torch.float32).contiguous().numpy()
    if rule.kind is RuleKind.SGD and rule.weight_decay == 0.0:
        _sgd_backward(
            as_numpy(weight),
            values.numpy(),
            offsets.numpy(),
            weights_numpy(per_sample_weights),
            plan.numpy(),
            dim,
            batch_size,
            sequence,
            flat_grad,
            lrs.numpy(),
        )
        return
    n = values.shape[0]
    acc_rows = n if n * dim * 4 <= ACCUMULATE_MAX_BYTES else 0
    _sparse_backward(
        as_numpy(weight),
        state.numpy(),
        values.numpy(),
        offsets.numpy(),
        weights_numpy(per_sample_weights),
        plan.numpy(),
        dim,
        batch_size,
        sequence,
        flat_grad,
        int(rule.kind),
        rule.hparams(),
        lrs.numpy(),
        workspace.row_map(weight.shape[0]),
        workspace.array("scratch", 7 * n, np.int64).reshape(7, n),
        workspace.array("occ_scale", n, np.float32),
        workspace.array("tmp_scale", n, np.float32),
        workspace.array("acc", acc_rows * dim, np.float32).reshape(acc_rows, dim),
        num_chunks(16),
    )
