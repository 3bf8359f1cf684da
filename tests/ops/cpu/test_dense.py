"""Numba bias + ReLU kernels == torch, including exact zeros, no bias, B = 1 and odd widths; the serial kernel
(small batches) and the parallel one (large) both."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import torch
from hypothesis import given, settings

from hugerec.ops.cpu import dense


@settings(max_examples=50, deadline=None)
@given(
    batch=st.integers(1, 40),
    width=st.integers(1, 37),
    relu=st.booleans(),
    with_bias=st.booleans(),
    chunks=st.sampled_from([1, 3, 16]),
)
def test_kernels_match_torch(batch: int, width: int, relu: bool, with_bias: bool, chunks: int) -> None:
    gen = torch.Generator().manual_seed(batch * 100 + width)
    pre = torch.randn(batch, width, generator=gen)
    pre[0, 0] = 0.0  # an exact zero: the ReLU's gradient there is 0, as torch's
    bias = torch.randn(width, generator=gen) if with_bias else None
    out = pre.clone()
    dense.bias_relu_(out.numpy(), bias.numpy() if bias is not None else np.empty(0, np.float32), relu, chunks)
    want = pre + bias if bias is not None else pre.clone()
    if relu:
        want = torch.relu(want)
    torch.testing.assert_close(out, want)

    grad = torch.randn(batch, width, generator=gen)
    g = torch.empty_like(grad)
    bias_grad = torch.empty(width)
    partial = np.empty((chunks, width), dtype=np.float32)
    dense.relu_backward(grad.numpy(), out.numpy(), relu, g.numpy(), bias_grad.numpy(), partial)
    want_g = grad * (want > 0) if relu else grad
    torch.testing.assert_close(g, want_g)
    torch.testing.assert_close(bias_grad, want_g.sum(0), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(relu=st.booleans(), with_bias=st.booleans(), width=st.sampled_from([1, 64, 1024]))
def test_serial_and_parallel_bias_relu_match_torch_at_b1_and_large(relu: bool, with_bias: bool, width: int) -> None:
    """bias_relu picks the serial kernel below SERIAL_ELEMENTS (B = 1, a served request) and the parallel one
    above; both equal torch, and each kernel alone equals it on both sizes."""
    for batch in (1, dense.SERIAL_ELEMENTS // width + 1):
        gen = torch.Generator().manual_seed(batch + width)
        pre = torch.randn(batch, width, generator=gen)
        pre[0, 0] = 0.0
        bias = torch.randn(width, generator=gen) if with_bias else None
        b = bias.numpy() if bias is not None else np.empty(0, np.float32)
        want = pre + bias if bias is not None else pre.clone()
        if relu:
            want = torch.relu(want)
        for kernel in ("bias_relu", "bias_relu_serial_", "bias_relu_"):
            out = pre.clone()
            if kernel == "bias_relu_serial_":
                dense.bias_relu_serial_(out.numpy(), b, relu)
            else:
                getattr(dense, kernel)(out.numpy(), b, relu, 16)
            torch.testing.assert_close(out, want, rtol=0, atol=0)
