"""RecModel's contract, on a minimal model of its own: forward = dense_forward(dense, embed(sparse)), the dense
width checked, dense_parameters leaves the embedding collections out, compile_dense keeps the values; common_dim
and lookup (which leaves out the batch's features a collection does not know)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.table_config import TableConfig
from hugerec.models.model import RecModel, common_dim, lookup
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


class Tiny(RecModel):
    def __init__(self) -> None:
        super().__init__(num_dense=2)
        self.emb = EmbeddingCollection([TableConfig("u", 5, 3), TableConfig("i", 4, 3)])
        self.top = nn.Linear(2 + 6, 1)

    def embed(self, sparse: SparseFeatures) -> tuple[torch.Tensor, ...]:
        return (lookup(self.emb, sparse),)

    def dense_forward(self, dense: torch.Tensor, embedded: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.top(torch.cat([dense, *embedded], dim=1)).squeeze(1)


def _batch(dense: int = 2) -> Batch:
    sparse = SparseFeatures.from_lists({"u": [[1], [2, 3]], "i": [[0], []], "other": [[7], [8]]})
    return Batch(torch.ones(2, dense), sparse, torch.zeros(2))


def test_forward_is_dense_forward_of_the_lookups() -> None:
    torch.manual_seed(0)
    model = Tiny()
    batch = _batch()
    logits = model(batch)
    pooled = model.emb(batch.sparse.select(["u", "i"])).values  # "other" left out by lookup
    torch.testing.assert_close(logits, model.top(torch.cat([batch.dense, pooled], 1)).squeeze(1))
    assert logits.shape == (2,)
    with pytest.raises(ValueError, match="Tiny: built for 2 dense features, batch has 3"):
        model(_batch(dense=3))


def test_dense_parameters_and_collections() -> None:
    model = Tiny()
    assert model.embedding_collections() == [model.emb]
    assert {id(p) for p in model.dense_parameters()} == {id(p) for p in model.top.parameters()}


def test_compile_dense_keeps_the_values() -> None:
    pytest.importorskip("torch._dynamo")
    torch.manual_seed(0)
    model = Tiny()
    eager = model(_batch())
    model.compile_dense(backend="eager")  # the graph capture, without a compiler toolchain
    torch.testing.assert_close(model(_batch()), eager)


@pytest.mark.parametrize("bad", [-1, True, 2.0])
def test_bad_dense_width_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match=f"RecModel: num_dense must be an int >= 0, got {bad!r}"):
        RecModel(bad)  # type: ignore[arg-type]


def test_common_dim() -> None:
    assert common_dim(EmbeddingCollection([TableConfig("a", 3, 4), TableConfig("b", 3, 4)]), "DeepFM") == 4
    with pytest.raises(ValueError, match=r"DeepFM: every feature needs the same embedding dim, got \{'a': 4, 'b': 2\}"):
        common_dim(EmbeddingCollection([TableConfig("a", 3, 4), TableConfig("b", 3, 2)]), "DeepFM")
