"""graph_dense_forward: CPU tensors are refused naming the device; on CUDA (skipped without one) the recorded
graph gives the eager dense_forward's logits and gradients for the recorded shapes, and a batch of another size
runs eagerly."""

from __future__ import annotations

import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import TableConfig
from hugerec.models.cuda_graph import graph_dense_forward
from hugerec.models.dlrm import DLRM
from hugerec.sparse.features import SparseFeatures


def _model(device: str) -> DLRM:
    torch.manual_seed(0)
    tables = [TableConfig("a", 20, 4), TableConfig("b", 30, 4)]
    return DLRM(EmbeddingCollection(tables, device=device), 3, [8, 4], [8, 1]).to(device)


def _inputs(model: DLRM, b: int, device: str, seed: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    lists = {
        "a": [[int(i)] for i in torch.randint(0, 20, (b,), generator=g)],
        "b": [[int(i)] for i in torch.randint(0, 30, (b,), generator=g)],
    }
    features = SparseFeatures.from_lists(lists).to(device)
    dense = torch.randn(b, 3, generator=g).to(device)
    return dense, tuple(e.detach().requires_grad_() for e in model.embed(features))


def test_cpu_tensors_are_refused() -> None:
    model = _model("cpu")
    dense, embedded = _inputs(model, 4, "cpu", 0)
    with pytest.raises(ValueError, match="graph_dense_forward: CUDA graphs need CUDA tensors, got cpu"):
        graph_dense_forward(model, dense, embedded)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_the_graph_gives_the_eager_logits_and_gradients() -> None:
    model = _model("cuda")
    dense, embedded = _inputs(model, 16, "cuda", 0)
    graphed = graph_dense_forward(model, dense, embedded)
    for seed in (1, 2):
        dense, embedded = _inputs(model, 16, "cuda", seed)
        model.zero_grad()
        eager = model.dense_forward(dense, embedded)
        eager.sum().backward()
        want = [e.grad.clone() for e in embedded if e.grad is not None]
        want_params = [p.grad.clone() for p in model.dense_parameters() if p.grad is not None]
        dense2, embedded2 = dense.clone(), tuple(e.detach().clone().requires_grad_() for e in embedded)
        model.zero_grad()
        got = graphed(dense2, embedded2)
        got.sum().backward()
        torch.testing.assert_close(got, eager)
        torch.testing.assert_close([e.grad for e in embedded2], want)
        torch.testing.assert_close([p.grad for p in model.dense_parameters() if p.grad is not None], want_params)
    dense, embedded = _inputs(model, 5, "cuda", 3)  # another batch size: eager
    torch.testing.assert_close(graphed(dense, embedded), model.dense_forward(dense, embedded))
