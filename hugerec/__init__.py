"""hugerec: deep-learning recommender systems with huge embedding tables, on PyTorch.

    import hugerec as hr
    emb = hr.EmbeddingCollection([hr.TableConfig("user", num_rows=10_000_000, dim=64)], optimizer=hr.RowWiseAdagrad())
    model = hr.models.DLRM(emb, num_dense=13, bottom=[512, 256, 64], top=[512, 256, 1])
    hr.training.fit(model, hr.data.load("data/train/*.parquet", schema, batch_size=8192))

Every public name and subpackage is imported on first use (hugerec.lazy_exports): `import hugerec`
imports neither torch nor Numba, so that `hugerec --help` and `hugerec schema` start at once.
"""

from typing import TYPE_CHECKING

from hugerec.lazy_exports import lazy_exports

if TYPE_CHECKING:  # the public names and subpackages, imported on first use (hugerec.lazy_exports)
    from hugerec import data, distributed, index, models, serving, training
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

__version__ = "0.1.0"

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


lazy_exports(__name__)
