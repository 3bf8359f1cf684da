"""Numba CPU kernels of HSTU's jagged causal attention (spec: `hugerec.ops.reference.jagged_causal_attention`).

    out_i = sum_{j <= i} silu(q_i . k_j + bias_ij) * scale * v_j      inside each sequence, per head

Sequences are jagged: rows offsets[b]..offsets[b + 1] of q, k, v [N, H, D] are sequence b, oldest first;
bias [P] holds the causal pairs of every sequence (pair (i, j) of sequence b at pairs[b] + i (i + 1) / 2 + j),
shared by the heads. Only the n (n + 1) / 2 causal pairs of a sequence are ever touched: no padding, no
[B, H, L, L] score tensor, no mask; the backward recomputes each score instead of storing it.

Threads: the forward runs one (sequence, head) per task; the backward one sequence per task, its heads in
turn, because the bias gradient of a pair sums over the heads (no two threads write the same row).
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
        for i in range(n):
            row = out[o0 + i, h]
            row[:] = 0.0
            qi = q[o0 + i, h]
            base = p0 + i * (i + 1) // 2
            for j in range(i + 1):
                kj = k[o0 + j, h]
                s = bias[base + j]
                for d in range(dq):
                    s += qi[d] * kj[d]
                a = s / (np.float32(1.0) + np.exp(-s)) * sc  # silu(s) * scale
                vj = v[o0 + j, h]
                for d in range(dv):
                    row[d] += a * vj[d]


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
        grad_q[o0 : o0 + n] = 0.0
        grad_k[o0 : o0 + n] = 0.0
        grad_v[o0 : o0 + n] = 0.0
        grad_bias[p0 : p0 + n * (n + 1) // 2] = 0.0
        for h in range(heads):
            for i in range(n):
                qi = q[o0 + i, h]
                gi = grad[o0 + i, h]
                dqi = grad_q[o0 + i, h]
                base = p0 + i * (i + 1) // 2
                for j in range(i + 1):
                    kj = k[o0 + j, h]
                    vj = v[o0 + j, h]
                    s = bias[base + j]
                    for d in range(dq):
                        s += qi[d] * kj[d]
                    sig = one / (one + np.exp(-s))
                    a = s * sig * sc
                    da = np.float32(0.0)
                    dvj = grad_v[o0 + j, h]
                    for d in range(dv):
                        da += gi[d] * vj[d]
                        dvj[d] += a * gi[d]
                    ds = da * sc * sig * (one + s * (one - sig))
                    dkj = grad_k[o0 + j, h]
                    for d in range(dq):
                        dqi[d] += ds * kj[d]
                        dkj[d] += ds * qi[d]
                    grad_bias[base + j] += ds
