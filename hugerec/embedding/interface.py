"""EmbeddingModule: what a model may use of its embedding collection, plain or sharded.

`EmbeddingCollection` (one process) and `hugerec.distributed.sharded.ShardedEmbeddingCollection` (tables
placed on ranks) both satisfy it. Models annotate their collections with it, so that `shard()` can
replace a model's collection by the sharded one and every use a model makes of it stays typed and
valid: the description of the tables and features, the pooled lookup (calling the module) and the
sequence lookup.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from hugerec.embedding.optimizers import Optimizer
from hugerec.embedding.table_config import TableConfig
from hugerec.sparse.features import SparseFeatures
from hugerec.sparse.jagged import JaggedTensor
from hugerec.sparse.pooled import PooledEmbeddings


@runtime_checkable
class EmbeddingModule(Protocol):
    """The embedding collection's interface as models see it (an `nn.Module` in both implementations)."""

    @property
    def tables(self) -> tuple[TableConfig, ...]: ...

    @property
    def optimizer(self) -> Optimizer: ...

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Pooled features, in the order of the output's column blocks."""
        ...

    @property
    def feature_dims(self) -> tuple[int, ...]: ...

    @property
    def sequence_feature_names(self) -> tuple[str, ...]: ...

    @property
    def output_dim(self) -> int:
        """Width of the pooled output: the sum of feature_dims."""
        ...

    def __call__(self, features: SparseFeatures) -> PooledEmbeddings:
        """Pooled lookup of every pooled feature: [B, output_dim]."""
        ...

    def sequences(self, features: SparseFeatures) -> dict[str, JaggedTensor]:
        """Per Pooling.NONE feature: its looked-up rows as a JaggedTensor."""
        ...
