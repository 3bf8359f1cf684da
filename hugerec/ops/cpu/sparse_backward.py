"""Numba CPU kernel of the fused backward (spec: `hugerec.ops.reference.sparse_backward`).

No dense gradient, no [N, D] gradient either:

1. dedupe, in parallel over tables (their rows are disjoint): a row -> slot map (kept at -1 between
   calls) gives each touched row a slot; each id becomes an occurrence (grad offset, scale) pushed
   on its slot's linked list;
2. in parallel over the unique rows: sum the row's occurrences of the output gradient into a
   D-wide local buffer, then apply the update rule to the row and its state in place.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange

from hugerec.ops.cpu.lookup import as_numpy, num_chunks, weights_numpy
from hugerec.ops.cpu.rows import get, put
from hugerec.ops.plan import COLUMN, FEATURE, MEAN, NUM_ROWS, ROW_OFFSET, TABLE
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": a NaN must stay visible
_SGD, _ADAGRAD, _ROWWISE, _ADAM, _FTRL = (int(k) for k in RuleKind)


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _update_row(
    kind: int, weight: np.ndarray, state: np.ndarray, r: int, g: np.ndarray, dim: int, lr: float, hp: np.ndarray
) -> None:
    """One row's update; `g` [D] is the accumulated gradient (weight decay is added here)."""
    eps, beta1, beta2, decay = np.float32(hp[0]), np.float32(hp[1]), np.float32(hp[2]), np.float32(hp[3])
    lr32 = np.float32(lr)
    if decay != 0.0:
        for k in range(dim):
            g[k] += decay * get(weight, r, k)
    if kind == _SGD:
        for k in range(dim):
            put(weight, r, k, get(weight, r, k) - lr32 * g[k])
    elif kind == _ADAGRAD:
        for k in range(dim):
            s = state[r, k] + g[k] * g[k]
            state[r, k] = s
            put(weight, r, k, get(weight, r, k) - lr32 * g[k] / (np.sqrt(s) + eps))
    elif kind == _ROWWISE:
        sq = np.float32(0.0)
        for k in range(dim):
            sq += g[k] * g[k]
        s = state[r, 0] + sq / np.float32(dim)
        state[r, 0] = s
        step = lr32 / (np.sqrt(s) + eps)
        for k in range(dim):
            put(weight, r, k, get(weight, r, k) - step * g[k])
    elif kind == _ADAM:
        for k in range(dim):
            m = state[r, k]
            v = state[r, dim + k]
            m += (g[k] - m) * (np.float32(1.0) - beta1)
            v += (g[k] * g[k] - v) * (np.float32(1.0) - beta2)
            state[r, k] = m
            state[r, dim + k] = v
            put(weight, r, k, get(weight, r, k) - lr32 * (m / (np.sqrt(v) + eps)))
    else:  # FTRL
        l1, l2, beta, power = np.float32(hp[4]), np.float32(hp[5]), np.float32(hp[6]), -np.float32(hp[7])
        for k in range(dim):
            w = get(weight, r, k)
            z = state[r, k]
            n = state[r, dim + k]
            n_new = n + g[k] * g[k]
            n_pow = np.sqrt(n_new) if power == 0.5 else n_new**power
            n_old_pow = np.sqrt(n) if power == 0.5 else n**power
            z += g[k] - (n_pow - n_old_pow) / lr32 * w
            state[r, k] = z
            state[r, dim + k] = n_new
            if abs(z) <= l1:
                put(weight, r, k, np.float32(0.0))
            else:
                put(weight, r, k, (math.copysign(l1, z) - z) / ((beta + n_pow) / lr32 + np.float32(2.0) * l2))


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
    slot_row: np.ndarray,
    head: np.ndarray,
    nxt: np.ndarray,
    occ_offset: np.ndarray,
    occ_scale: np.ndarray,
    slots: np.ndarray,
    table_of: np.ndarray,
    chunks: int,
) -> None:
    weighted = per_sample_weights.shape[0] > 0 and not sequence
    columns = grad.shape[1]
    flat = grad.reshape(-1)
    tables = lrs.shape[0]
    # each table's slots and occurrences live in [base[t], base[t] + its number of ids)
    base = np.zeros(tables + 1, dtype=np.int64)
    for j in range(plan.shape[0]):
        f = plan[j, FEATURE]
        base[plan[j, TABLE] + 1] += offsets[(f + 1) * batch] - offsets[f * batch]
    for t in range(tables):
        base[t + 1] += base[t]
    unique = np.zeros(tables, dtype=np.int64)

    for t in prange(tables):  # 1. dedupe: tables own disjoint rows, so their slots never collide
        n_slots, k = 0, base[t]
        for j in range(plan.shape[0]):
            if plan[j, TABLE] != t:
                continue
            f, row_offset, num_rows, col = plan[j, FEATURE], plan[j, ROW_OFFSET], plan[j, NUM_ROWS], plan[j, COLUMN]
            feature_start = offsets[f * batch]
            for b in range(batch):
                start, end = offsets[f * batch + b], offsets[f * batch + b + 1]
                bag_scale = np.float32(1.0)
                if plan[j, MEAN] and not sequence:
                    count = 0
                    for i in range(start, end):
                        count += 1 if 0 <= values[i] < num_rows else 0
                    bag_scale = np.float32(1.0 / max(count, 1))
                for i in range(start, end):
                    v = values[i]
                    if v < 0 or v >= num_rows:
                        continue
                    r = v + row_offset
                    u = row_map[r]
                    if u < 0:
                        u = base[t] + n_slots
                        n_slots += 1
                        row_map[r] = u
                        slot_row[u] = r
                        head[u] = -1
                    nxt[k] = head[u]
                    head[u] = k
                    occ_offset[k] = (col + i - feature_start) * dim if sequence else b * columns + col
                    occ_scale[k] = bag_scale * per_sample_weights[i] if weighted else bag_scale
                    k += 1
        unique[t] = n_slots
        for u in range(base[t], base[t] + n_slots):
            row_map[slot_row[u]] = -1

    n = 0
    for t in range(tables):
        for u in range(base[t], base[t] + unique[t]):
            slots[n] = u
            table_of[n] = t
            n += 1

    chunks = max(1, min(n, chunks))
    for c in prange(chunks):  # 2. accumulate each unique row's gradient and update it
        g = np.empty(dim, dtype=np.float32)
        for q in range(c * n // chunks, (c + 1) * n // chunks):
            u = slots[q]
            g[:] = 0.0
            k = head[u]
            while k >= 0:
                o, s = occ_offset[k], occ_scale[k]
                for d in range(dim):
                    g[d] += s * flat[o + d]
                k = nxt[k]
            _update_row(kind, weight, state, slot_row[u], g, dim, lrs[table_of[q]], hp)


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
    n = values.shape[0]
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
        grad.detach().to(torch.float32).contiguous().numpy(),
        int(rule.kind),
        rule.hparams(),
        lrs.numpy(),
        workspace.row_map(weight.shape[0]),
        workspace.array("slot_row", n, np.int64),
        workspace.array("head", n, np.int64),
        workspace.array("next", n, np.int64),
        workspace.array("occ_offset", n, np.int64),
        workspace.array("occ_scale", n, np.float32),
        workspace.array("slots", n, np.int64),
        workspace.array("table_of", n, np.int64),
        num_chunks(16),
    )
