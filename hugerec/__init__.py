"""hugerec: deep-learning recommender systems with huge embedding tables, on PyTorch.

    import hugerec as hr
    emb = hr.EmbeddingCollection([hr.TableConfig("user", num_rows=10_000_000, dim=64)], optimizer=hr.RowWiseAdagrad())
    model = hr.models.DLRM(emb, num_dense=13, bottom=[512, 256, 64], top=[512, 256, 1])
    hr.training.fit(model, hr.data.load("data/train/*.parquet", schema, batch_size=8192))

The subpackages `data`, `models`, `training`, `distributed` and `serving` are imported on first use,
so `import hugerec` stays light (serving pulls in the HTTP stack).
"""

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from hugerec.embedding import (
    SGD,
    Adagrad,
    Adam,
    Embedding,
    EmbeddingBag,
    EmbeddingCollection,
    Ftrl,
    RowWiseAdagrad,
    TableConfig,
)

if TYPE_CHECKING:  # type checkers see the lazily imported subpackages (`hr.models.DLRM` is typed, not Any)
    from hugerec import data, distributed, index, models, serving, training

__version__ = "0.1.0"

_SUBPACKAGES = ("data", "distributed", "index", "models", "serving", "training")

__all__ = [
    "SGD",
    "Adagrad",
    "Adam",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingCollection",
    "Ftrl",
    "RowWiseAdagrad",
    "TableConfig",
    "__version__",
    "data",
    "distributed",
    "index",
    "models",
    "serving",
    "training",
]


def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hugerec.{name}")
    raise AttributeError(f"module 'hugerec' has no attribute {name!r}")
