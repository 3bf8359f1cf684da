"""TorchRec baselines for hugerec's benchmarks: a fused EmbeddingBagCollection built from hugerec's configs.

TorchRec is optional: this module imports it only inside its functions, so a benchmark can import
this module everywhere and ask `unavailable()` whether a TorchRec run can happen.

The collection is TorchRec's `FusedEmbeddingBagCollection`: all tables in one FBGEMM
`SplitTableBatchedEmbeddingBagsCodegen` whose optimizer runs inside the backward (the kernel
TorchRec's sharded training uses per shard, without the single-process all-to-all around it).
FBGEMM's CPU kernels implement SGD, Adagrad and row-wise Adagrad, each the same rule as hugerec's
optimizer of that name; they have no Adam (nor FTRL) on CPU and ignore weight decay, so
`fused_optimizer` refuses those.

    from torchrec_baseline import fused_collection, keyed_jagged, train_step, unavailable
    ebc = fused_collection(tables, RowWiseAdagrad(lr=0.01))     # tables: hugerec TableConfigs
    train_step(ebc, keyed_jagged(features), grad)                # grad: [B, sum of dims]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import Normal, Pooling, StorageDtype, TableConfig, Uniform, Zeros
from hugerec.sparse.features import SparseFeatures

if TYPE_CHECKING:
    from torchrec import KeyedJaggedTensor
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection


def unavailable() -> str | None:
    """None when TorchRec and its FBGEMM kernels import; otherwise why not, in one line."""
    try:
        import torchrec  # noqa: F401
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception as e:  # an fbgemm_gpu built for another torch fails with OSError or RuntimeError
        return f"not importable: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    return None


def unsupported(optimizer: Optimizer) -> str | None:
    """None when FBGEMM's CPU kernels run the same rule as hugerec's `optimizer`; otherwise why not."""
    name = type(optimizer).__name__
    if isinstance(optimizer, Adam | Ftrl):
        return f"{name}: FBGEMM has no CPU kernel for it (SGD, Adagrad, RowWiseAdagrad only)"
    if optimizer.weight_decay:
        # measured: FBGEMM 1.8's CPU kernels update the rows as without decay, whatever weight_decay(_mode) says
        return f"{name}: FBGEMM's CPU kernels ignore weight decay, got weight_decay={optimizer.weight_decay}"
    if isinstance(optimizer, Adagrad | RowWiseAdagrad) and optimizer.initial_accumulator_value:
        return f"{name}: FBGEMM starts the accumulator at 0, got {optimizer.initial_accumulator_value}"
    return None


def fused_optimizer(optimizer: Optimizer) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The (optimizer class, kwargs) FusedEmbeddingBagCollection takes for hugerec's `optimizer`.

    Raises ValueError (the reason `unsupported` gives) where FBGEMM's CPU kernels cannot run the same rule.
    """
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad as TorchRecRowWiseAdagrad

    reason = unsupported(optimizer)
    if reason is not None:
        raise ValueError(reason)
    match optimizer:
        case SGD(lr=lr):
            return torch.optim.SGD, {"lr": lr}
        case Adagrad(lr=lr, eps=eps):
            return torch.optim.Adagrad, {"lr": lr, "eps": eps}
        case RowWiseAdagrad(lr=lr, eps=eps):
            return TorchRecRowWiseAdagrad, {"lr": lr, "eps": eps}
        case Adam() | Ftrl():
            raise AssertionError("unreachable: unsupported() refused it")


def fused_collection(
    tables: Sequence[TableConfig], optimizer: Optimizer, device: torch.device | str = "cpu"
) -> FusedEmbeddingBagCollection:
    """TorchRec's fused collection for hugerec `tables`: same rows, dims, features, pooling and init bounds.

    Raises ValueError for what TorchRec's pooled collection does not have: sequence (NONE) pooling,
    dims not a multiple of 4, non-fp32 storage, dynamic tables, per-table optimizers, Normal init.
    """
    from torchrec import EmbeddingBagConfig, PoolingType
    from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

    configs = []
    for table in tables:
        where = f"table {table.name!r}"
        if table.pooling is Pooling.NONE:
            raise ValueError(f"{where}: pooling NONE (sequence output) has no fused EmbeddingBagCollection")
        if table.dim % 4:
            raise ValueError(f"{where}: FBGEMM needs dim a multiple of 4, got {table.dim}")
        if table.dtype is not StorageDtype.FP32:
            raise ValueError(f"{where}: storage dtype {table.dtype.value} is not mapped; only fp32")
        if table.dynamic is not None:
            raise ValueError(f"{where}: dynamic tables have no TorchRec counterpart here")
        if table.optimizer is not None and table.optimizer != optimizer:
            raise ValueError(f"{where}: a per-table optimizer {table.optimizer} differs from the collection's")
        match table.init:
            case Uniform():
                low, high = table.init_bounds
            case Zeros():
                low, high = 0.0, 0.0  # FBGEMM's uniform_(0, 0)
            case Normal():
                raise ValueError(f"{where}: init {table.init} is not mapped; only Uniform and Zeros")
        configs.append(
            EmbeddingBagConfig(
                name=table.name,
                embedding_dim=table.dim,
                num_embeddings=table.num_rows,
                feature_names=list(table.features),
                pooling=PoolingType.SUM if table.pooling is Pooling.SUM else PoolingType.MEAN,
                weight_init_min=low,
                weight_init_max=high,
            )
        )
    kind, kwargs = fused_optimizer(optimizer)
    return FusedEmbeddingBagCollection(
        tables=configs, optimizer_type=kind, optimizer_kwargs=kwargs, device=torch.device(device)
    )


def keyed_jagged(features: SparseFeatures) -> KeyedJaggedTensor:
    """The same ids as TorchRec's input (both are feature-major values + lengths: no copy)."""
    from torchrec import KeyedJaggedTensor

    return KeyedJaggedTensor(list(features.keys), features.values, features.weights, lengths=features.lengths)


def train_step(ebc: FusedEmbeddingBagCollection, features: KeyedJaggedTensor, grad: torch.Tensor) -> None:
    """Forward, then backward of `grad` [B, sum of dims]; the fused optimizer updates the rows in the backward."""
    ebc(features).values().backward(grad)
