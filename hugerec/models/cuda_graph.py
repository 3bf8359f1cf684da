"""The dense part of a model as one CUDA graph: shapes are static (every full batch has the same size), so
the launches of the MLPs, the interaction and their backward are recorded once and replayed.

    graphed = graph_dense_forward(model, batch.dense, model.embed(batch.sparse))
    logits = graphed(batch.dense, model.embed(batch.sparse))   # for every batch of that size

The embedding lookups stay outside the graph (their ids, bags and the hash tables' work vary per batch);
their output is the graph's input, and its gradient flows back into the fused sparse backward as before.
A batch of another size (the last one of an epoch) runs the eager `dense_forward`. The graph's inputs
are copied into static buffers at each call (torch.cuda.make_graphed_callables); the parameters are the
model's own, so the dense optimizer is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from hugerec.models.model import RecModel


class _DenseForward(nn.Module):
    """model.dense_forward as a module of tensors (what make_graphed_callables takes); its parameters are the
    model's (the embedding rows are buffers, not parameters, so they stay out)."""

    def __init__(self, model: RecModel, parts: int) -> None:
        super().__init__()
        self.model = model
        self.parts = parts

    def forward(self, dense: torch.Tensor, *embedded: torch.Tensor) -> torch.Tensor:
        return self.model.dense_forward(dense, tuple(embedded))


def graph_dense_forward(
    model: RecModel, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...], warmup: int = 3
) -> Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor]:
    """A replacement for model.dense_forward(dense, embedded) recorded as a CUDA graph for these shapes."""
    if dense.device.type != "cuda":
        raise ValueError(f"graph_dense_forward: CUDA graphs need CUDA tensors, got {dense.device}")
    module = _DenseForward(model, len(embedded))
    sample = (dense.detach().clone(), *(e.detach().clone().requires_grad_(e.requires_grad) for e in embedded))
    graphed = torch.cuda.make_graphed_callables(module, sample, num_warmup_iters=warmup)
    shapes = [tuple(t.shape) for t in sample]

    def forward(dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if [tuple(dense.shape), *(tuple(e.shape) for e in embedded)] != shapes:
            return model.dense_forward(dense, embedded)
        return cast(torch.Tensor, graphed(dense, *embedded))

    return forward
