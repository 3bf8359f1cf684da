"""Numba CPU kernels of DLRM's dot interaction (spec: `hugerec.ops.reference.dot_interaction`).

The N = F (+ 1) vectors of an example are `first[b]` (optional, the dense arch's output) followed by
`rest[b, 0..F-1]` (the embeddings), so the caller never concatenates them into one [B, N, D] tensor.
Output column p is the dot of the p-th pair (i, j), i < j (i <= j with self-interaction), in
row-major order of the upper triangle: (0, 1), (0, 2), ..., (1, 2), ...

torch computes this as a batched [N, D] x [D, N] product and gathers the triangle: the products are
too small for the GEMM kernels (about 30 GFLOP/s here) and half of them are thrown away. These
kernels compute only the pairs, one example per iteration, with its N vectors in L1.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": a NaN must stay visible


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def dot_forward(first: np.ndarray, rest: np.ndarray, self_interaction: bool, out: np.ndarray) -> None:
    """out [B, P] = the pairs' dots; first [B, D] or [0, D] (absent), rest [B, F, D]."""
    batch, num_rest, dim = rest.shape
    lead = 1 if first.shape[0] > 0 else 0
    n = num_rest + lead
    for b in prange(batch):
        p = 0
        for i in range(n):
            vi = first[b] if i < lead else rest[b, i - lead]
            for j in range(i if self_interaction else i + 1, n):
                vj = first[b] if j < lead else rest[b, j - lead]
                s = np.float32(0.0)
                for k in range(dim):
                    s += vi[k] * vj[k]
                out[b, p] = s
                p += 1


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def dot_backward(
    grad: np.ndarray,
    first: np.ndarray,
    rest: np.ndarray,
    self_interaction: bool,
    grad_first: np.ndarray,
    grad_rest: np.ndarray,
) -> None:
    """grad [B, P] of the output -> grad_first [B, D] (or [0, D]) and grad_rest [B, F, D] (written)."""
    batch, num_rest, dim = rest.shape
    lead = 1 if first.shape[0] > 0 else 0
    n = num_rest + lead
    for b in prange(batch):
        if lead:
            grad_first[b, :] = 0.0
        grad_rest[b, :, :] = 0.0
        p = 0
        for i in range(n):
            vi = first[b] if i < lead else rest[b, i - lead]
            gi = grad_first[b] if i < lead else grad_rest[b, i - lead]
            if self_interaction:  # d(x.x)/dx = 2x
                c = np.float32(2.0) * grad[b, p]
                for k in range(dim):
                    gi[k] += c * vi[k]
                p += 1
            for j in range(i + 1, n):
                vj = first[b] if j < lead else rest[b, j - lead]
                gj = grad_first[b] if j < lead else grad_rest[b, j - lead]
                c = grad[b, p]
                for k in range(dim):
                    gi[k] += c * vj[k]
                    gj[k] += c * vi[k]
                p += 1
