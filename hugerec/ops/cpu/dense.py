"""Numba CPU kernels of the elementwise parts of a Linear + ReLU layer, one pass over memory each.

torch does the ReLU's backward as a mask (`out > 0`), a conversion of the mask to float, a product
and, for the bias gradient, a column sum: four passes over a [B, N] tensor (32 MiB per pass at
8192 x 1024). These kernels read the gradient and the output once and write the masked gradient once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}  # no "nnan"/"ninf": a NaN must stay visible


# Below this many elements bias_relu runs on the calling thread: waking Numba's threads for a parallel
# region costs more than the pass itself (a served batch of one row: 64 to 1024 elements), and on busy
# cores the wake-up waits for each thread to be scheduled.
SERIAL_ELEMENTS = 1 << 16


def bias_relu(out: np.ndarray, bias: np.ndarray, relu: bool, chunks: int) -> None:
    """out [B, N] += bias [N] (bias may be [0]: none), then max(., 0) if relu; in place: on the calling thread
    below SERIAL_ELEMENTS elements, else over `chunks` row ranges on Numba's threads."""
    if out.size < SERIAL_ELEMENTS:
        bias_relu_serial_(out, bias, relu)
    else:
        bias_relu_(out, bias, relu, chunks)


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def bias_relu_(out: np.ndarray, bias: np.ndarray, relu: bool, chunks: int) -> None:
    """out [B, N] += bias [N] (bias may be [0]: none), then max(., 0) if relu; in place, rows in parallel."""
    batch, width = out.shape
    has_bias = bias.shape[0] > 0
    for c in prange(chunks):
        for b in range(c * batch // chunks, (c + 1) * batch // chunks):
            row = out[b]
            for k in range(width):
                v = row[k] + bias[k] if has_bias else row[k]
                row[k] = max(v, np.float32(0.0)) if relu else v


@njit(cache=True, fastmath=_FASTMATH, error_model="numpy")
def bias_relu_serial_(out: np.ndarray, bias: np.ndarray, relu: bool) -> None:
    """bias_relu_ on the calling thread (no parallel region)."""
    batch, width = out.shape
    has_bias = bias.shape[0] > 0
    for b in range(batch):
        row = out[b]
        for k in range(width):
            v = row[k] + bias[k] if has_bias else row[k]
            row[k] = max(v, np.float32(0.0)) if relu else v


@njit(parallel=True, cache=True, fastmath=_FASTMATH, error_model="numpy")
def relu_backward(
    grad: np.ndarray, out: np.ndarray, relu: bool, g: np.ndarray, bias_grad: np.ndarray, partial: np.ndarray
) -> None:
    """g [B, N] = grad where out > 0 else 0 (grad itself if not relu); bias_grad [N] = column sums of g
    (skipped when bias_grad is [0]). partial [chunks, N] is scratch: one row of sums per chunk."""
    batch, width = grad.shape
    chunks = partial.shape[0]
    want_bias = bias_grad.shape[0] > 0
    for c in prange(chunks):
        acc = partial[c]
        acc[:] = 0.0
        for b in range(c * batch // chunks, (c + 1) * batch // chunks):
            src = grad[b]
            dst = g[b]
            alive = out[b]
            for k in range(width):
                v = src[k] if (not relu or alive[k] > 0.0) else np.float32(0.0)
                dst[k] = v
                acc[k] += v
    if want_bias:
        for k in range(width):
            s = np.float32(0.0)
            for c in range(chunks):
                s += partial[c, k]
            bias_grad[k] = s
