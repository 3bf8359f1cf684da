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
from typing import NamedTuple

import numpy as np
import torch
from numba import njit, prange

from hugerec.ops.cpu.lookup_kernels import as_numpy, num_chunks, one_id_per_bag, weights_numpy
from hugerec.ops.cpu.rows import get, prefetch, put
from hugerec.ops.lookup_plan import COLUMN, FEATURE, MEAN, NUM_ROWS, ROW_OFFSET, TABLE
from hugerec.ops.update_rule import RuleKind, UpdateRule
from hugerec.ops.workspace import Workspace

# No "nnan"/"ninf": a NaN must stay visible. No "reassoc": with it LLVM may reorder sums (row-wise
# Adagrad's sum of squares, a row's summed gradient) differently when a parallel kernel is compiled in
# the process than when it is loaded from Numba's cache, so a run resumed in a process that loads the
# cached kernel would not continue bit for bit the run that compiled it.
_FASTMATH = {"nsz", "arcp", "contract", "afn"}
# Prefetch distances of phase 2 (software prefetching pays there: each unique row is a chain of dependent
# random loads that the out-of-order window cannot overlap on its own)
SLOTS_AHEAD, OCCURRENCES_AHEAD, ROWS_AHEAD = 4, 8, 16
ACCUMULATE_MAX_BYTES = 64 << 20  # largest [N, D] fp32 buffer of the accumulate mode (else: occurrences)
_SGD, _ADAGRAD, _ROWWISE, _ADAM, _FTRL = (int(k) for k in RuleKind)


class Ids(NamedTuple):
    """A table group's ids of one batch as the kernels take them (see `hugerec.ops.reference.sparse_backward`)."""

    values: np.ndarray  # [N] int64, each id relative to its feature's table
    offsets: np.ndarray  # [F * B + 1] int64 bag offsets (feature-major)
    per_sample_weights: np.ndarray  # [N] fp32, or [0]: unweighted
    plan: np.ndarray  # [P, plan columns] int64 (`hugerec.ops.lookup_plan`)
    batch: int
    sequence: bool  # sequence features: one output row per id (no pooling)


class Scratch(NamedTuple):
    """The backward's working arrays (from the Workspace, reused across calls), N = number of ids."""

    row_map: np.ndarray  # [rows of the group] int64, -1 between calls: row -> its slot during a call
    slot_row: np.ndarray  # [N] int64: per slot, its row
    begin: np.ndarray  # [N] int64: per slot, its first occurrence (occurrence mode)
    end: np.ndarray  # [N] int64: per slot, its occurrence count, then one past its last occurrence
    occ_slot: np.ndarray  # [N] int64: per occurrence, its slot; later per slot, its table
    tmp_offset: np.ndarray  # [N] int64: per occurrence in id order, its output-gradient offset
    occ_offset: np.ndarray  # [N] int64: the offsets sorted by slot (CSR by begin/end)
    slots: np.ndarray  # [N] int64: every table's slots, compacted
    tmp_scale: np.ndarray  # [N] fp32: per occurrence in id order, its gradient scale
    occ_scale: np.ndarray  # [N] fp32: the scales sorted by slot
    acc: np.ndarray  # [N, D] fp32 per slot, its summed gradient (accumulate mode), or [0, D]


class Rule(NamedTuple):
    """The update rule: kind (RuleKind), its hyper-parameters (`UpdateRule.hparams`), lr per table [T]."""

    kind: int
    hparams: np.ndarray
    lrs: np.ndarray


# -- the update rules, one row at a time: w = weight[r] (storage dtype), st = state[r], g [D] the row's
# summed gradient (decay already added; g may be used as scratch)


@njit(inline="always", cache=True, fastmath=_FASTMATH, error_model="numpy")
def _sgd(w: np.ndarray, g: np.ndarray, dim: int, lr: np.float32) -> None:
    for k in range(dim):
        put(w, k, get(w, k) - lr * g[k])


@njit(inline="always", cache=True, fastmath=_FASTMATH, error_model="numpy")
def _adagrad(w: np.ndarray, st: np.ndarray, g: np.ndarray, dim: int, lr: np.float32, eps: np.float32) -> None:
    for k in range(dim):
        s = st[k] + g[k] * g[k]
        st[k] = s
        put(w, k, get(w, k) - lr * g[k] / (np.sqrt(s) + eps))


@njit(inline="always", cache=True, fastmath=_FASTMATH, error_model="numpy")
def _rowwise_adagrad(w: np.ndarray, st: np.ndarray, g: np.ndarray, dim: int, lr: np.float32, eps: np.float32) -> None:
    sq = np.float32(0.0)
    for k in range(dim):
        sq += g[k] * g[k]
    s = st[0] + sq / np.float32(dim)
    st[0] = s
    step = lr / (np.sqrt(s) + eps)
    for k in range(dim):
        put(w, k, get(w, k) - step * g[k])


@njit(inline="always", cache=True, fastmath=_FASTMATH, error_model="numpy")
def _adam(
    w: np.ndarray,
    st: np.ndarray,
    g: np.ndarray,
    dim: int,
    lr: np.float32,
    eps: np.float32,
    beta1: np.float32,
    beta2: np.float32,
) -> None:
    """st = [m (D), v (D)]; no bias correction here (the collection folds it into lr)."""
    one = np.float32(1.0)
    for k in range(dim):
        m = st[k] + (g[k] - st[k]) * (one - beta1)
        v = st[dim + k] + (g[k] * g[k] - st[dim + k]) * (one - beta2)
        st[k] = m
        st[dim + k] = v
        put(w, k, get(w, k) - lr * (m / (np.sqrt(v) + eps)))


@njit(inline="always", cache=True, fastmath=_FASTMATH, error_model="numpy")
def _ftrl(w: np.ndarray, st: np.ndarray, g: np.ndarray, dim: int, lr: np.float32, hp: np.ndarray) -> None:
    """FTRL-proximal, st = [z (D), n (D)]; hp[4:8] = l1, l2, beta, lr_power."""
    l1, l2, beta, power = np.float32(hp[4]), np.float32(hp[5]), np.float32(hp[6]), -np.float32(hp[7])
    for k in range(dim):
        x = get(w, k)
        n = st[dim + k]
        n_new = n + g[k] * g[k]
        n_pow = np.sqrt(n_new) if power == 0.5 else n_new**power
        n_old_pow = np.sqrt(n) if power == 0.5 else n**power
        z = st[k] + g[k] - (n_pow - n_old_pow) / lr * x
        st[k] = z
        st[dim + k] = n_new
        if abs(z) <= l1:
            put(w, k, np.float32(0.0))
        else:
            put(w, k, (math.copysign(l1, z) - z) / ((beta + n_pow) / lr + np.float32(2.0) * l2))


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _update_row(kind: int, w: np.ndarray, st: np.ndarray, g: np.ndarray, dim: int, lr: float, hp: np.ndarray) -> None:
    """One row's update in place: weight decay into g, then the rule of `kind`."""
    eps, beta1, beta2, decay = np.float32(hp[0]), np.float32(hp[1]), np.float32(hp[2]), np.float32(hp[3])
    lr32 = np.float32(lr)
    if decay != 0.0:
        for k in range(dim):
            g[k] += decay * get(w, k)
    if kind == _SGD:
        _sgd(w, g, dim, lr32)
    elif kind == _ADAGRAD:
        _adagrad(w, st, g, dim, lr32, eps)
    elif kind == _ROWWISE:
        _rowwise_adagrad(w, st, g, dim, lr32, eps)
    elif kind == _ADAM:
        _adam(w, st, g, dim, lr32, eps, beta1, beta2)
    else:
        _ftrl(w, st, g, dim, lr32, hp)


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


@njit(cache=True)
def _table_bases(ids: Ids, tables: int) -> np.ndarray:
    """[T + 1]: table t's slots and occurrences live in [base[t], base[t + 1]) (its number of ids)."""
    plan, offsets, batch = ids.plan, ids.offsets, ids.batch
    base = np.zeros(tables + 1, dtype=np.int64)
    for j in range(plan.shape[0]):
        f = plan[j, FEATURE]
        base[plan[j, TABLE] + 1] += offsets[(f + 1) * batch] - offsets[f * batch]
    for t in range(tables):
        base[t + 1] += base[t]
    return base


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def _dedupe_table(t: int, ids: Ids, grad: np.ndarray, dim: int, sc: Scratch, start: int) -> tuple[int, int]:
    """Phase 1 for table t: give each touched row a slot from `start` on and either add each id's
    scaled output gradient to its slot's row of sc.acc (accumulate mode) or record the id as an
    occurrence (offset, scale) at sc.occ_slot/tmp_offset/tmp_scale[start:]. Returns (slots, occurrences).

    Ids are walked in order; the bag of id i only matters for pooled outputs: i's own when every bag
    holds one id (no per-bag bookkeeping), else tracked as i crosses bag ends."""
    values, offsets, psw, plan, batch, sequence = ids
    row_map, slot_row, end, occ_slot, tmp_offset, tmp_scale, acc = (
        sc.row_map,
        sc.slot_row,
        sc.end,
        sc.occ_slot,
        sc.tmp_offset,
        sc.tmp_scale,
        sc.acc,
    )
    weighted = psw.shape[0] > 0 and not sequence
    columns = grad.shape[1]
    flat = grad.reshape(-1)
    accumulate = acc.shape[0] > 0
    n_slots, k = 0, start
    for j in range(plan.shape[0]):
        if plan[j, TABLE] != t:
            continue
        f, row_offset, num_rows, col = plan[j, FEATURE], plan[j, ROW_OFFSET], plan[j, NUM_ROWS], plan[j, COLUMN]
        feature_start, feature_stop = offsets[f * batch], offsets[(f + 1) * batch]
        mean = plan[j, MEAN] != 0 and not sequence
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
                u = start + n_slots
                n_slots += 1
                row_map[r] = u
                slot_row[u] = r
                end[u] = 0
            o = (col + i - feature_start) * dim if sequence else b * columns + col
            s = bag_scale * psw[i] if weighted else bag_scale
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
    return n_slots, k


@njit(cache=True)
def _group_by_slot(sc: Scratch, start: int, n_slots: int, stop: int) -> None:
    """Counting sort of table's occurrences [start, stop) by slot: slot u's occurrences end up at
    occ_offset/occ_scale[begin[u]:end[u]]. Also clears the table's rows from row_map."""
    row_map, slot_row, begin, end = sc.row_map, sc.slot_row, sc.begin, sc.end
    occ_slot, tmp_offset, tmp_scale, occ_offset, occ_scale = (
        sc.occ_slot,
        sc.tmp_offset,
        sc.tmp_scale,
        sc.occ_offset,
        sc.occ_scale,
    )
    position = start
    for u in range(start, start + n_slots):
        row_map[slot_row[u]] = -1
        begin[u] = position
        position += end[u]
        end[u] = begin[u]
    for q in range(start, stop):
        u = occ_slot[q]
        occ_offset[end[u]] = tmp_offset[q]
        occ_scale[end[u]] = tmp_scale[q]
        end[u] += 1


@njit(cache=True)
def _list_slots(sc: Scratch, base: np.ndarray, unique: np.ndarray) -> int:
    """Every table's slots into sc.slots (compacted); sc.occ_slot[u] becomes the table of slot u."""
    n = 0
    for t in range(unique.shape[0]):
        for u in range(base[t], base[t] + unique[t]):
            sc.slots[n] = u
            sc.occ_slot[u] = t
            n += 1
    return n


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def _update_rows(
    weight: np.ndarray, state: np.ndarray, grad: np.ndarray, dim: int, rule: Rule, sc: Scratch, n: int, chunks: int
) -> None:
    """Phase 2, in parallel over chunks of the n unique rows: each row's summed gradient (its row of
    sc.acc, or its occurrences summed into a D-wide local buffer), then the rule applied in place."""
    kind, hp, lrs = rule
    slots, slot_row, begin, end, occ_table, occ_offset, occ_scale, acc = (
        sc.slots,
        sc.slot_row,
        sc.begin,
        sc.end,
        sc.occ_slot,
        sc.occ_offset,
        sc.occ_scale,
        sc.acc,
    )
    flat = grad.reshape(-1)
    accumulate = acc.shape[0] > 0
    chunks = max(1, min(n, chunks))
    for c in prange(chunks):
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
                _update_row(kind, weight[r], state[r], acc[u], dim, lrs[occ_table[u]], hp)
                continue
            g[:] = 0.0
            for p in range(begin[u], end[u]):
                if p + OCCURRENCES_AHEAD < end[u]:
                    prefetch(flat, occ_offset[p + OCCURRENCES_AHEAD], dim)
                s = occ_scale[p]
                rows = flat[occ_offset[p] : occ_offset[p] + dim]
                for d in range(dim):
                    g[d] += s * rows[d]
            _update_row(kind, weight[r], state[r], g, dim, lrs[occ_table[u]], hp)


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def _dedupe(ids: Ids, grad: np.ndarray, dim: int, sc: Scratch, base: np.ndarray, unique: np.ndarray) -> None:
    """Phase 1 in parallel over tables (their rows are disjoint, so their slots never collide).

    A parallel loop cannot take a tuple: the tuples are opened before it and rebuilt inside."""
    values, offsets, psw, plan, batch, sequence = ids
    row_map, slot_row, begin, end, occ_slot, tmp_offset, occ_offset, slots, tmp_scale, occ_scale, acc = sc
    accumulate = acc.shape[0] > 0
    for t in prange(unique.shape[0]):
        table_ids = Ids(values, offsets, psw, plan, batch, sequence)
        table_sc = Scratch(
            row_map, slot_row, begin, end, occ_slot, tmp_offset, occ_offset, slots, tmp_scale, occ_scale, acc
        )
        n_slots, stop = _dedupe_table(t, table_ids, grad, dim, table_sc, base[t])
        unique[t] = n_slots
        if accumulate:
            for u in range(base[t], base[t] + n_slots):
                row_map[slot_row[u]] = -1
        else:
            _group_by_slot(table_sc, base[t], n_slots, stop)


def _sparse_backward(
    weight: np.ndarray, state: np.ndarray, ids: Ids, grad: np.ndarray, dim: int, rule: Rule, sc: Scratch, chunks: int
) -> None:
    """The fused backward of one table group (module docstring): dedupe per table, then update rows."""
    tables = rule.lrs.shape[0]
    base = _table_bases(ids, tables)
    unique = np.zeros(tables, dtype=np.int64)
    _dedupe(ids, grad, dim, sc, base, unique)
    n = _list_slots(sc, base, unique)
    _update_rows(weight, state, grad, dim, rule, sc, n, chunks)


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
    scratch = workspace.array("scratch", 7 * n, np.int64).reshape(7, n)
    _sparse_backward(
        as_numpy(weight),
        state.numpy(),
        Ids(values.numpy(), offsets.numpy(), weights_numpy(per_sample_weights), plan.numpy(), batch_size, sequence),
        flat_grad,
        dim,
        Rule(int(rule.kind), rule.hparams(), lrs.numpy()),
        Scratch(
            workspace.row_map(weight.shape[0]),
            slot_row=scratch[0],
            begin=scratch[1],
            end=scratch[2],
            occ_slot=scratch[3],
            tmp_offset=scratch[4],
            occ_offset=scratch[5],
            slots=scratch[6],
            tmp_scale=workspace.array("tmp_scale", n, np.float32),
            occ_scale=workspace.array("occ_scale", n, np.float32),
            acc=workspace.array("acc", acc_rows * dim, np.float32).reshape(acc_rows, dim),
        ),
        num_chunks(16),
    )
