"""MLP: the dense arch / over arch / deep tower of every model.

MLP(13, [512, 256, 64])                     tower:       13 -> 512 -> 256 -> 64
MLP(64, [256] * 3)                          equal width: 64 -> 256 -> 256 -> 256
MLP(415, [1024, 512, 1], final_activation=False)   last layer is a logit

On the CPU in fp32 (no autocast, not being compiled or traced) each Linear and the ReLU after it
run as one autograd node whose activations and gradients live in storages the MLP recycles across
steps (`hugerec.ops.workspace.OutputPool`), the bias and ReLU applied in place. Plain nn.Linear +
nn.ReLU allocate fresh [B, width] tensors for the output, the ReLU, and both of their gradients at
every step; at B = 8192 and width 1024 each is 32 MiB, above glibc's mmap threshold, so each one
is mapped and page-faulted anew. The numbers are the same: the backward computes
the same products. Parameters and state_dict are those of the plain layers.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec.ops.cpu import dense as _dense
from hugerec.ops.workspace import OutputPool

_NO_BIAS = np.empty(0, dtype=np.float32)
_CHUNKS = 16  # row chunks of the elementwise kernels (their parallel loop)


class Activation(enum.Enum):
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    TANH = "tanh"
    SIGMOID = "sigmoid"

    def module(self) -> nn.Module:
        match self:
            case Activation.RELU:
                return nn.ReLU()
            case Activation.GELU:
                return nn.GELU()
            case Activation.SILU:
                return nn.SiLU()
            case Activation.TANH:
                return nn.Tanh()
            case Activation.SIGMOID:
                return nn.Sigmoid()


def check_dims(where: str, dims: Sequence[int], allow_empty: bool = False) -> tuple[int, ...]:
    """Layer widths as a tuple of positive ints; ValueError naming `where` otherwise."""
    out = tuple(dims)
    if not out and not allow_empty:
        raise ValueError(f"{where}: needs at least one layer width, got {list(out)}")
    for d in out:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise ValueError(f"{where}: layer widths must be positive ints, got {list(out)}")
    return out


class MLP(nn.Module):
    """Linear -> activation (-> dropout) per layer.  [B, in_dim] -> [B, dims[-1]].

    in_dim            input width
    dims              output width of each layer (a tower or equal widths)
    activation        Activation after every layer (and after the last only if `final_activation`)
    dropout           drop probability after each hidden activation (never after the last layer)
    final_activation  False when the last layer produces logits or feeds a residual
    """

    def __init__(
        self,
        in_dim: int,
        dims: Sequence[int],
        activation: Activation = Activation.RELU,
        dropout: float = 0.0,
        final_activation: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(in_dim, bool) or not isinstance(in_dim, int) or in_dim <= 0:
            raise ValueError(f"MLP: in_dim must be a positive int, got {in_dim!r}")
        widths = check_dims("MLP", dims)
        if not isinstance(activation, Activation):
            raise ValueError(f"MLP: activation must be an Activation, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP: dropout must be in [0, 1), got {dropout}")
        self.in_dim = in_dim
        self.out_dim = widths[-1]
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(zip((in_dim, *widths[:-1]), widths, strict=True)):
            layers.append(nn.Linear(d_in, d_out))
            last = i == len(widths) - 1
            if not last or final_activation:
                layers.append(activation.module())
            if not last and dropout > 0:
                layers.append(nn.Dropout(dropout))
        self.layers = nn.Sequential(*layers)
        self._buffers_pool = OutputPool(capacity=4 * len(widths) + 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _fusable(x):
            return self.layers(x)
        mods = list(self.layers)
        i = 0
        while i < len(mods):
            m = mods[i]
            if isinstance(m, nn.Linear):
                relu = i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU)
                x = _LinearReLU.apply(x, m.weight, m.bias, relu, self._buffers_pool)
                i += 2 if relu else 1
            else:
                x = m(x)
                i += 1
        return x


def _fusable(x: torch.Tensor) -> bool:
    """Whether the recycled-buffer path applies: fp32 on the CPU, eager (not compiled, exported or traced)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and x.dim() == 2
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
    )


def _padded(k: int) -> int:
    """Inner GEMM width to use for k input features: MKL's sgemm ran 25-45% slower on this project's
    AVX2 machine when it was not a multiple of 32 (415 and 432 against 416 and 448, batch 8192)."""
    return k if k < 64 or k % 32 == 0 else -(-k // 32) * 32


class _LinearReLU(torch.autograd.Function):
    """y = x @ W^T + b, then ReLU in place if `relu`; outputs and gradients in recycled storages.

    An input width that MKL handles slowly is zero-padded (x and W get zero columns, which change no
    product) and the gradients are cut back to the real width.
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        relu: bool,
        pool: OutputPool,
    ) -> torch.Tensor:
        k = x.shape[1]
        kp = _padded(k)
        if kp != k:
            xp = pool.empty((x.shape[0], kp), x.dtype, x.device)
            xp[:, :k].copy_(x)
            xp[:, k:].zero_()
            wp = torch.zeros(weight.shape[0], kp, dtype=weight.dtype)
            wp[:, :k].copy_(weight)
            x, weight = xp, wp
        out = pool.empty((x.shape[0], weight.shape[0]), x.dtype, x.device)
        torch.mm(x, weight.t(), out=out)
        if bias is not None or relu:  # one pass: bias and ReLU in place
            b = bias.detach().contiguous().numpy() if bias is not None else _NO_BIAS
            _dense.bias_relu(out.numpy(), b, relu, _CHUNKS)
        ctx.save_for_backward(x, weight, out if relu else None)
        ctx.k = k
        ctx.relu = relu
        ctx.pool = pool
        ctx.has_bias = bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, out = ctx.saved_tensors
        pool: OutputPool = ctx.pool
        k = ctx.k
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        want_b = ctx.has_bias and ctx.needs_input_grad[2]
        if ctx.relu or want_b:
            # one pass: the ReLU's gradient (out > 0 exactly where its input was) and the bias gradient
            g = pool.empty(tuple(grad.shape), grad.dtype, grad.device) if ctx.relu else grad
            grad_b = torch.empty(grad.shape[1], dtype=grad.dtype) if want_b else None
            partial = np.empty((_CHUNKS, grad.shape[1]), dtype=np.float32)
            _dense.relu_backward(
                grad.numpy(),
                out.numpy() if ctx.relu else grad.numpy(),
                ctx.relu,
                g.numpy(),
                grad_b.numpy() if grad_b is not None else _NO_BIAS,
                partial,
            )
        else:
            g = grad
        if ctx.needs_input_grad[0]:
            grad_x = pool.empty(tuple(x.shape), x.dtype, x.device)
            torch.mm(g, weight, out=grad_x)
            grad_x = grad_x[:, :k]
        if ctx.needs_input_grad[1]:
            grad_w = g.t().mm(x)
            grad_w = grad_w[:, :k].contiguous() if grad_w.shape[1] != k else grad_w
        return grad_x, grad_w, grad_b, None, None
