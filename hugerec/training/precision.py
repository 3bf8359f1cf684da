"""Mixed precision: autocast contexts, and loss scaling that reaches the fused sparse optimizers.

fp16 training multiplies the loss by a scale S (GradScaler) so small gradients survive fp16; the
dense optimizer step divides it out again (and is skipped when a gradient overflowed). The
embedding rows, though, are updated inside backward by the EmbeddingCollection's fused optimizer,
before any step could unscale them. So during fp16 training a forward hook on every collection
passes its pooled output through `_Unscale`, whose backward divides the gradient by S on its way
into the collection, and zeroes it when it overflowed (the sparse rows then see no gradient in the
step the GradScaler skips).
"""

from __future__ import annotations

import enum
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.sparse.pooled import PooledEmbeddings


class Precision(enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"  # autocast to bfloat16, CPU and GPU; no loss scaling needed
    FP16 = "fp16"  # autocast to float16 with a GradScaler; GPU only


def autocast(device: torch.device, precision: Precision) -> AbstractContextManager[Any]:
    match precision:
        case Precision.FP32:
            return nullcontext()
        case Precision.BF16:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        case Precision.FP16:
            return torch.autocast(device.type, dtype=torch.float16)


class _Unscale(torch.autograd.Function):
    """Identity forward; backward: gradient / S, or zeros if it is not finite."""

    @staticmethod
    def forward(ctx: Any, values: torch.Tensor, inv_scale: float) -> torch.Tensor:
        ctx.inv_scale = inv_scale
        return values.view_as(values)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        g = grad * ctx.inv_scale
        return torch.where(torch.isfinite(g).all(), g, torch.zeros_like(g)), None  # no host sync


def unscale_sparse_gradients(model: nn.Module, scaler: torch.amp.GradScaler) -> list[RemovableHandle]:
    """Hooks every EmbeddingCollection in `model` so its sparse optimizer sees unscaled gradients.

    Returns the hook handles; `handle.remove()` each when training ends.
    """

    def hook(module: nn.Module, inputs: Any, output: PooledEmbeddings) -> PooledEmbeddings:
        inv_scale = 1.0 / scaler.get_scale()
        return PooledEmbeddings(output.keys, output.dims, _Unscale.apply(output.values, inv_scale))

    return [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, EmbeddingCollection)]
