import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad, Ftrl
from hugerec.embedding.table_config import TableConfig
from hugerec.models.deepfm import DeepFM
from hugerec.models.wide import wide_tables


def test_logit_is_first_order_plus_fm_plus_deep(task) -> None:
    tables = task.tables(dim=4)
    emb = EmbeddingCollection(tables, Adagrad(lr=0.1))
    wide = EmbeddingCollection(wide_tables(tables), Adagrad(lr=0.1))
    model = DeepFM(emb, task.num_dense, deep=[8], wide=wide).eval()
    with torch.no_grad():
        wide.table_weight("wide_t0").uniform_(-1, 1)  # zero-initialised: make the first-order term visible
    (batch,) = task.batches(1, batch_size=5)
    out = model(batch)
    with torch.no_grad():
        pooled = emb(batch.sparse)
        fields = [batch.dense[:, j : j + 1] * model.dense_embedding[j] for j in range(task.num_dense)]
        fields += [pooled[k] for k in pooled.keys]
        fm = sum((fields[i] * fields[j]).sum(1) for i in range(len(fields)) for j in range(i + 1, len(fields)))
        first = wide(batch.sparse).values.sum(1) + model.wide_arch.dense(batch.dense).squeeze(1) + model.wide_arch.bias
        deep = model.over_arch(model.deep_arch(torch.cat([batch.dense, pooled.values], 1))).squeeze(1)
    torch.testing.assert_close(out, first + fm + deep)
    assert wide(batch.sparse).values.abs().sum() > 0


def test_learns_a_tiny_task_with_ftrl_first_order(task) -> None:
    tables = task.tables(dim=8)
    model = DeepFM(
        EmbeddingCollection(tables, Adagrad(lr=0.1)),
        task.num_dense,
        deep=[16],
        wide=EmbeddingCollection(wide_tables(tables, Ftrl(lr=0.1))),
    )
    batches = task.batches(8, batch_size=64)
    losses = task.train(model, batches, epochs=6)
    assert losses[-1] < 0.5 * losses[0], losses
    assert model.wide_embedding is not None
    assert model.wide_embedding.table_weight("wide_t2").abs().sum() > 0  # FTRL moved the first-order weights


def test_without_first_order_collection(task) -> None:
    model = DeepFM(EmbeddingCollection(task.tables(dim=4)), task.num_dense, deep=[8])
    (batch,) = task.batches(1, batch_size=3)
    model(batch).sum().backward()
    assert all(p.grad is not None for p in model.dense_parameters())


def test_bad_configs(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=4))
    with pytest.raises(ValueError, match="wide features need dim-1 tables"):
        DeepFM(emb, 4, wide=EmbeddingCollection(task.tables(dim=2, prefix="w")))
    mixed = EmbeddingCollection([TableConfig("a", 10, 8), TableConfig("b", 10, 4)])
    with pytest.raises(ValueError, match="same embedding dim"):
        DeepFM(mixed, 4)
    with pytest.raises(ValueError, match="at least one"):
        DeepFM(emb, 4, deep=[])
    with pytest.raises(ValueError, match=r"DeepFM deep: layer widths must be positive ints, got \[0\]"):
        DeepFM(emb, 4, deep=[0])
