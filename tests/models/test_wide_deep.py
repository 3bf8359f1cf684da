import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad, Ftrl
from hugerec.embedding.table_config import TableConfig
from hugerec.models.wide import wide_tables
from hugerec.models.wide_deep import WideAndDeep
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def test_logit_is_wide_plus_deep(task) -> None:
    tables = task.tables(dim=4)
    deep_emb = EmbeddingCollection(tables, Adagrad(lr=0.1))
    wide_emb = EmbeddingCollection(wide_tables(tables))
    model = WideAndDeep(deep_emb, wide_emb, task.num_dense, deep=[8]).eval()
    with torch.no_grad():
        wide_emb.table_weight("wide_t1").uniform_(-1, 1)
    (batch,) = task.batches(1, batch_size=4)
    with torch.no_grad():
        wide = wide_emb(batch.sparse).values.sum(1) + model.wide_arch.dense(batch.dense).squeeze(1)
        deep = model.over_arch(model.deep_arch(torch.cat([batch.dense, deep_emb(batch.sparse).values], 1)))
    torch.testing.assert_close(model(batch), wide + model.wide_arch.bias + deep.squeeze(1))


def test_learns_with_ftrl_wide_part(task) -> None:
    tables = task.tables(dim=8)
    model = WideAndDeep(
        EmbeddingCollection(tables, Adagrad(lr=0.1)),
        EmbeddingCollection(wide_tables(tables, Ftrl(lr=0.1))),
        task.num_dense,
        deep=[16],
    )
    losses = task.train(model, task.batches(8, batch_size=64), epochs=6)
    assert losses[-1] < 0.5 * losses[0], losses


def test_wide_part_reads_its_own_features(task) -> None:
    """A hashed feature cross only the wide part knows: each collection gets the features it has."""
    deep_emb = EmbeddingCollection(task.tables(dim=4))
    wide_emb = EmbeddingCollection([TableConfig("cross", 20, 1, features=("t0_x_t1",))], Ftrl())
    model = WideAndDeep(deep_emb, wide_emb, task.num_dense, deep=[4])
    (batch,) = task.batches(1, batch_size=3)
    jagged = batch.sparse.to_dict()
    jagged["t0_x_t1"] = SparseFeatures.from_lists({"c": [[1], [2, 3], []]})["c"]
    full = Batch(batch.dense, SparseFeatures.from_jagged(jagged), batch.labels)
    before = wide_emb.table_weight("cross").clone()
    model(full).sum().backward()
    changed = (wide_emb.table_weight("cross") != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [1, 2, 3]
    with pytest.raises(ValueError, match="missing features"):
        model(batch)  # no cross feature in the batch


def test_bad_configs(task) -> None:
    tables = task.tables(dim=4)
    deep_emb = EmbeddingCollection(tables)
    with pytest.raises(ValueError, match="dim-1"):
        WideAndDeep(deep_emb, EmbeddingCollection(task.tables(dim=2)), 4)
    wide_emb = EmbeddingCollection(wide_tables(tables))
    with pytest.raises(ValueError, match="different collections"):
        WideAndDeep(wide_emb, wide_emb, 4)
    with pytest.raises(ValueError, match="WideAndDeep deep"):
        WideAndDeep(deep_emb, wide_emb, 4, deep=[])
