"""EmbeddingModule: models use their collection only through it, so any conforming module serves."""

from __future__ import annotations

import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.interface import EmbeddingModule
from hugerec.embedding.optimizers import Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.embedding.table_config import TableConfig as _TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor
from hugerec.sparse.pooled import PooledEmbeddings


class Recording(nn.Module):
    """An EmbeddingModule that is not an EmbeddingCollection: it delegates and counts lookups."""

    def __init__(self, inner: EmbeddingCollection) -> None:
        super().__init__()
        self.inner = inner
        self.calls = 0

    @property
    def tables(self) -> tuple[_TableConfig, ...]:
        return self.inner.tables

    @property
    def optimizer(self) -> Optimizer:
        return self.inner.optimizer

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.inner.feature_names

    @property
    def feature_dims(self) -> tuple[int, ...]:
        return self.inner.feature_dims

    @property
    def sequence_feature_names(self) -> tuple[str, ...]:
        return self.inner.sequence_feature_names

    @property
    def output_dim(self) -> int:
        return self.inner.output_dim

    def forward(self, features: SparseFeatures) -> PooledEmbeddings:
        self.calls += 1
        out: PooledEmbeddings = self.inner(features)
        return out

    def sequences(self, features: SparseFeatures) -> dict[str, JaggedTensor]:
        return self.inner.sequences(features)


def _collection() -> EmbeddingCollection:
    tables = [TableConfig("a", num_rows=50, dim=4), TableConfig("b", num_rows=30, dim=4)]
    return EmbeddingCollection(tables, optimizer=RowWiseAdagrad(lr=0.1))


def test_both_collections_satisfy_the_interface() -> None:
    assert isinstance(_collection(), EmbeddingModule)
    assert isinstance(Recording(_collection()), EmbeddingModule)
    assert not isinstance(nn.Linear(2, 2), EmbeddingModule)


def test_a_model_runs_on_any_embedding_module() -> None:
    """DLRM built on a conforming wrapper gives the same logits as on the collection it wraps."""
    torch.manual_seed(0)
    inner = _collection()
    wrapped = Recording(inner)
    torch.manual_seed(1)
    plain = DLRM(inner, num_dense=3, bottom=[8, 4], top=[8, 1])
    torch.manual_seed(1)
    model = DLRM(wrapped, num_dense=3, bottom=[8, 4], top=[8, 1])
    dense = torch.randn(5, 3)
    sparse = SparseFeatures.from_lists({"a": [[1], [2, 3], [], [4], [5]], "b": [[0], [1], [2], [3], [4]]})
    batch = Batch(dense, sparse, torch.zeros(5))
    assert torch.equal(plain(batch), model(batch))
    assert wrapped.calls == 1
