"""Numba CPU kernels of HSTU's jagged causal attention (spec: `hugerec.ops.reference.jagged_causal_attention`).

    out_i = sum_{j <= i} silu(q_i . k_j + bias_ij) * scale * v_j      inside each sequence, per head

Sequences are jagged: rows offsets[b]..offsets[b + 1] of q, k, v [N, H, D] are sequence b, oldest first;
bias [P] holds the causal pairs of every sequence (pair (i, j) of sequence b at pairs[b] + i (i + 1) / 2 + j),
shared by the heads. Only the n (n + 1) / 2 causal pairs of a sequence are ever touched: no padding, no
[B, H, L, L] score tensor, no mask; the backward recomputes each score instead of storing it.

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
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, offsets: np.ndarray, pairs: np.ndarray, scale: float, out: np.ndarray
) -> None:
    """out [N, H, Dv] (written) from q, k [N, H, Dq], v [N, H, Dv], bias [P]."""
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
            for d in range(dv):
                vd = vt[d]
                acc = np.float32(0.0)
                for j in range(m):
                    acc += s[j] * vd[j]
                out[o0 + i, h, d] = acc


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def attention_backward(
    grad: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray, offsets: np.ndarray, pairs: np.ndarray,
    scale: float, grad_q: np.ndarray, grad_k: np.ndarray, grad_v: np.ndarray, grad_bias: np.ndarray,
) -> None:
    """grad [N, H, Dv] of the output -> grad_q, grad_k [N, H, Dq], grad_v [N, H, Dv], grad_bias [P] (all written).

    With s = q_i . k_j + bias_ij, a = silu(s) * scale, g = grad_i:
        dv_j += a g;  ds = (g . v_j) * scale * silu'(s);  dq_i += ds k_j;  dk_j += ds q_i;  dbias_ij += ds
    where silu'(s) = sigmoid(s) (1 + s (1 - sigmoid(s))).
    """
    num_seq = len(offsets) - 1
    heads, dq, dv = q.shape[1], q.shape[2], v.shape[2]
    sc = np.float32(scale)
    one = np.float32(1.0)
    for b in prange(num_seq):
        o0 = offsets[b]
        n = offsets[b + 1] - o0
        p0 = pairs[b]
        grad_bias[p0 : p0 + n * (n + 1) // 2] = 0.0
        kt = np.empty((dq, n), dtype=np.float32)
        vt = np.empty((dv, n), dtype=np.float32)
        dkt = np.empty((dq, n), dtype=np.float32)  # the gradients of k^T, v^T, accumulated over the queries
        dvt = np.empty((dv, n), dtype=np.float32)
        s = np.empty(n, dtype=np.float32)
        sig = np.empty(n, dtype=np.float32)
        da = np.empty(n, dtype=np.float32)
        a = np.empty(n, dtype=np.float32)
        bits = np.empty(n, dtype=np.int32)
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
                for j in range(m):
                    s[j] = bias[base + j]
                    da[j] = 0.0
                for d in range(dq):
                    qd = q[o0 + i, h, d]
                    kd = kt[d]
                    for j in range(m):
                        s[j] += qd * kd[j]
                sigmoid_row(s, sig, bits, m)
                for j in range(m):
                    a[j] = s[j] * sig[j] * sc  # silu(s) * scale
                for d in range(dv):  # da_j = g . v_j and dv_j += a_j g, both along the keys
                    gd = grad[o0 + i, h, d]
                    vd = vt[d]
                    dvd = dvt[d]
                    for j in range(m):
                        da[j] += gd * vd[j]
                        dvd[j] += gd * a[j]
                for j in range(m):  # ds, in place of da
                    x = s[j]
                    da[j] = da[j] * sc * sig[j] * (one + x * (one - sig[j]))
                    grad_bias[base + j] += da[j]
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
