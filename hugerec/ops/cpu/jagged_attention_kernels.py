"""Numba CPU kernels of HSTU's jagged causal attention (spec: `hugerec.ops.reference.jagged_causal_attention`).

    out_i = sum_{j <= i} silu(q_i . k_j + bias_ij) * scale * v_j      inside each sequence, per head

Sequences are jagged: rows offsets[b]..offsets[b + 1] of q, k, v [N, H, D] are sequence b, oldest first;
bias [P] holds the causal pairs of every sequence (pair (i, j) of sequence b at pairs[b] + i (i + 1) / 2 + j),
shared by the heads. Only the n (n + 1) / 2 causal pairs of a sequence are ever touched: no padding, no
[B, H, L, L] score tensor, no mask. For training the forward keeps two floats per pair and head (the
scaled SiLU and its derivative), which the backward reads instead of recomputing q_i . k_j and the
sigmoid: 8 bytes per pair and head, against the backward's Dq multiply-adds and sigmoid per pair.

Threads: the forward runs one (sequence, head) per task; the backward one sequence per task, its heads in
turn, because the bias gradient of a pair sums over the heads (no two threads write the same row).

Layout: a task first copies its sequence's keys and values transposed, [D, n], so that every inner loop
runs over the keys j of one query row i, contiguous in memory: the scores s_j = q_i . k_j + bias_ij as
Dq vector updates of the [i + 1] score row, the output as Dv dot products of that row with rows of v^T,
and in the backward the gradients of k and v as vector updates of transposed accumulators written back
at the end. A loop over d with a dot product per key j (the direct form) reduces across SIMD lanes once
per pair and ran about 3x slower on the ML-1M shape.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": a NaN must stay visible


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def pair_positions(offsets: np.ndarray, pairs: np.ndarray, query: np.ndarray, key: np.ndarray) -> None:
    """query [P], key [P] = the absolute rows (into N) of every causal pair, in the bias layout."""
    for b in prange(len(offsets) - 1):
        o0 = offsets[b]
        n = offsets[b + 1] - o0
        p = pairs[b]
        for i in range(n):
            for j in range(i + 1):
                query[p] = o0 + i
                key[p] = o0 + j
                p += 1


@njit(parallel=True, cache=True, error_model="numpy")
def log_time_buckets(times: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, width: float, cap: int, out: np.ndarray) -> None:
    """out [P] (written) = min(floor(ln(max(|t_i - t_j|, 1)) / width), cap) for every causal pair (i, j), in the
    bias layout, from the rows' times [N] alone: no [P] row indices or differences are formed. No fastmath:
    the log and the division are those of the plain-torch spec, so the floor falls on the same bucket."""
    for b in prange(len(offsets) - 1):
        o0 = offsets[b]
        n = offsets[b + 1] - o0
        p = pairs[b]
        for i in range(n):
            ti = times[o0 + i]
            for j in range(i + 1):
                d = abs(ti - times[o0 + j])
                k = int(math.log(float(max(d, 1))) / width)
                out[p + j] = min(k, cap)
            p += i + 1


@njit(parallel=True, cache=True, error_model="numpy")
def relative_bias_forward(table: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, out: np.ndarray) -> None:
    """out [P] (written) = table[min(i - j, T - 1)] for every causal pair (i, j), in the bias layout: row i of
    a sequence is table[i], table[i - 1], ..., table[0] (capped), so no pair index array is ever formed."""
    last = len(table) - 1
    for b in prange(len(offsets) - 1):
        n = offsets[b + 1] - offsets[b]
        p = pairs[b]
        for i in range(n):
            for j in range(i + 1):
                out[p + j] = table[min(i - j, last)]
            p += i + 1


@njit(parallel=True, cache=True, error_model="numpy")
def relative_bias_backward(grad: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, partial: np.ndarray) -> None:
    """partial [C, T] float64 (written): row c sums grad [P] by capped distance over sequences c, c + C, ...;
    the table's gradient is partial.sum(0). One row per task, so no two threads add into the same row."""
    chunks, size = partial.shape
    last = size - 1
    num_seq = len(offsets) - 1
    for c in prange(chunks):
        row = partial[c]
        row[:] = 0.0
        for b in range(c, num_seq, chunks):
            n = offsets[b + 1] - offsets[b]
            p = pairs[b]
            for i in range(n):
                for j in range(i + 1):
                    row[min(i - j, last)] += grad[p + j]
                p += i + 1


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693145751953125)  # ln 2 in two parts (Cody-Waite): n * _LN2_HI is exact
_LN2_LO = np.float32(1.4286068203094173e-06)


@njit(inline="always", fastmath=_FASTMATH, error_model="numpy")
def sigmoid_row(s: np.ndarray, sig: np.ndarray, bits: np.ndarray, m: int) -> None:
    """sig[:m] = 1 / (1 + exp(-s[:m])), in loops LLVM vectorises: without a vector math library a call to
    exp stays scalar (one call per pair and head was most of the kernels' time). exp(x) = 2^n exp(r) with
    n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by its degree-6 Taylor polynomial (relative error below
    2e-7) and 2^n built in the exponent bits of `bits` (an int32 scratch row; x clamped to [-87, 88], where
    2^n stays a normal float). A NaN in s stays NaN in every product the callers form with s."""
    two_n = bits.view(np.float32)
    for j in range(m):
        x = -s[j]
        x = min(max(x, np.float32(-87.0)), np.float32(88.0))
        n = np.floor(x * _LOG2E + np.float32(0.5))
        r = x - n * _LN2_HI - n * _LN2_LO
        p = np.float32(1.0) + r * (np.float32(1.0) + r * (np.float32(0.5) + r * (np.float32(1.0 / 6.0) + r * (
            np.float32(1.0 / 24.0) + r * (np.float32(1.0 / 120.0) + r * np.float32(1.0 / 720.0))))))
        sig[j] = p
        bits[j] = (np.int32(n) + np.int32(127)) << np.int32(23)
    for j in range(m):
        sig[j] = np.float32(1.0) / (np.float32(1.0) + sig[j] * two_n[j])


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def attention_forward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, scale: float, out: np.ndarray,
    saved_a: np.ndarray, saved_ds: np.ndarray,
) -> None:
    """out [N, H, Dv] (written) from q, k [N, H, Dq], v [N, H, Dv], bias [P].

    For the backward (`attention_backward`), when saved_a and saved_ds are [H, P] (both written; [0, 0]: not
    kept): a = silu(s) * scale and ds/da' = scale * silu'(s) = scale * sigmoid(s) + a (1 - sigmoid(s)) of
    every pair and head, so the backward neither recomputes q_i . k_j nor the sigmoid.
    """
    save = saved_a.shape[1] > 0
    num_seq = len(offsets) - 1
    heads, dq, dv = q.shape[1], q.shape[2], v.shape[2]
    sc = np.float32(scale)
    for task in prange(num_seq * heads):
        b = task // heads
        h = task - b * heads
        o0 = offsets[b]
        n = offsets[b + 1] - o0
        p0 = pairs[b]
        kt = np.empty((dq, n), dtype=np.float32)  # k^T, v^T of this sequence and head
        vt = np.empty((dv, n), dtype=np.float32)
        for j in range(n):
            for d in range(dq):
                kt[d, j] = k[o0 + j, h, d]
            for d in range(dv):
                vt[d, j] = v[o0 + j, h, d]
        s = np.empty(n, dtype=np.float32)  # the attention row of query i: [i + 1]
        sig = np.empty(n, dtype=np.float32)
        bits = np.empty(n, dtype=np.int32)
        for i in range(n):
            m = i + 1
            base = p0 + i * (i + 1) // 2
            for j in range(m):
                s[j] = bias[base + j]
            for d in range(dq):
                qd = q[o0 + i, h, d]
                kd = kt[d]
                for j in range(m):
                    s[j] += qd * kd[j]
            sigmoid_row(s, sig, bits, m)
            for j in range(m):
                s[j] = s[j] * sig[j] * sc  # silu(s) * scale
            if save:
                sa = saved_a[h, base : base + m]
                sd = saved_ds[h, base : base + m]
                for j in range(m):
                    sa[j] = s[j]
                    sd[j] = sc * sig[j] + s[j] * (np.float32(1.0) - sig[j])
            for d in range(dv):
                vd = vt[d]
                acc = np.float32(0.0)
                for j in range(m):
                    acc += s[j] * vd[j]
                out[o0 + i, h, d] = acc


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def attention_backward(
    grad: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, saved_a: np.ndarray, saved_ds: np.ndarray, offsets: np.ndarray,
    pairs: np.ndarray, grad_q: np.ndarray, grad_k: np.ndarray, grad_v: np.ndarray, grad_bias: np.ndarray,
) -> None:
    """grad [N, H, Dv] of the output -> grad_q, grad_k [N, H, Dq], grad_v [N, H, Dv], grad_bias [P] (all written),
    from the forward's saved_a, saved_ds [H, P] (`attention_forward`).

    With s = q_i . k_j + bias_ij, a = silu(s) * scale (saved), g = grad_i:
        dv_j += a g;  ds = (g . v_j) * scale * silu'(s) (the factor saved);  dq_i += ds k_j;  dk_j += ds q_i;  dbias_ij += ds
    """
    num_seq = len(offsets) - 1
    heads, dq, dv = q.shape[1], q.shape[2], v.shape[2]
    for b in prange(num_seq):
        o0 = offsets[b]
        n = offsets[b + 1] - o0
        p0 = pairs[b]
        grad_bias[p0 : p0 + n * (n + 1) // 2] = 0.0
        kt = np.empty((dq, n), dtype=np.float32)
        vt = np.empty((dv, n), dtype=np.float32)
        dkt = np.empty((dq, n), dtype=np.float32)  # the gradients of k^T, v^T, accumulated over the queries
        dvt = np.empty((dv, n), dtype=np.float32)
        da = np.empty(n, dtype=np.float32)
        for h in range(heads):
            for j in range(n):
                for d in range(dq):
                    kt[d, j] = k[o0 + j, h, d]
                for d in range(dv):
                    vt[d, j] = v[o0 + j, h, d]
            dkt[:, :] = 0.0
            dvt[:, :] = 0.0
            for i in range(n):
                m = i + 1
                base = p0 + i * (i + 1) // 2
                a = saved_a[h, base : base + m]
                dsf = saved_ds[h, base : base + m]
                da[:m] = 0.0
                for d in range(dv):  # da_j = g . v_j and dv_j += a_j g, both along the keys
                    gd = grad[o0 + i, h, d]
                    vd = vt[d]
                    dvd = dvt[d]
                    for j in range(m):
                        da[j] += gd * vd[j]
                        dvd[j] += gd * a[j]
                gb = grad_bias[base : base + m]
                for j in range(m):  # ds, in place of da
                    da[j] *= dsf[j]
                    gb[j] += da[j]
                for d in range(dq):
                    qd = q[o0 + i, h, d]
                    kd = kt[d]
                    dkd = dkt[d]
                    acc = np.float32(0.0)
                    for j in range(m):
                        acc += da[j] * kd[j]
                        dkd[j] += da[j] * qd
                    grad_q[o0 + i, h, d] = acc
            for j in range(n):
                for d in range(dq):
                    grad_k[o0 + j, h, d] = dkt[d, j]
                for d in range(dv):
                    grad_v[o0 + j, h, d] = dvt[d, j]
