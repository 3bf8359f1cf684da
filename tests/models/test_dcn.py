import pytest
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dcn import CrossStructure, DCNv2


@pytest.mark.parametrize("structure", list(CrossStructure))
def test_structures_wire_x0_through_cross_and_deep(task, structure: CrossStructure) -> None:
    emb = EmbeddingCollection(task.tables(dim=4), Adagrad(lr=0.1))
    model = DCNv2(emb, task.num_dense, num_cross_layers=2, structure=structure, deep=[8, 6]).eval()
    (batch,) = task.batches(1, batch_size=5)
    out = model(batch)
    assert out.shape == (5,)
    with torch.no_grad():
        x0 = torch.cat([batch.dense, emb(batch.sparse).values], dim=1)  # [B, 4 + 3*4]
        cross = model.cross_arch(x0)
        match structure:
            case CrossStructure.STACKED:
                ref = model.over_arch(model.deep_arch(cross))
            case CrossStructure.PARALLEL:
                ref = model.over_arch(torch.cat([cross, model.deep_arch(x0)], dim=1))
    torch.testing.assert_close(out, ref.squeeze(1))
    assert model.cross_arch.in_dim == 16


def test_cross_only_and_mixed_dims(task) -> None:
    tables = [TableConfig("t0", 50, 4), TableConfig("t1", 50, 8), TableConfig("t2", 50, 2)]
    model = DCNv2(EmbeddingCollection(tables), task.num_dense, 1, low_rank=3, num_experts=2, deep=[])
    (batch,) = task.batches(1, batch_size=3)
    assert model(batch).shape == (3,)
    assert model.deep_arch is None and model.over_arch.in_features == 4 + 14


@pytest.mark.parametrize(("low_rank", "structure"), [(None, CrossStructure.STACKED), (4, CrossStructure.PARALLEL)])
def test_learns_a_tiny_task(task, low_rank: int | None, structure: CrossStructure) -> None:
    emb = EmbeddingCollection(task.tables(dim=8), Adagrad(lr=0.1))
    model = DCNv2(emb, task.num_dense, 2, low_rank=low_rank, structure=structure, deep=[16])
    losses = task.train(model, task.batches(8, batch_size=64), epochs=6)
    assert losses[-1] < 0.5 * losses[0], losses


def test_gradients_and_embedding_updates(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=4), Adagrad(lr=0.1))
    model = DCNv2(emb, task.num_dense, 2, low_rank=2, num_experts=3, deep=[8])
    (batch,) = task.batches(1, batch_size=6)
    before = emb.table_weight("t1").clone()
    nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels).backward()
    assert all(p.grad is not None for p in model.dense_parameters())
    assert not torch.equal(emb.table_weight("t1"), before)


def test_bad_configs(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=4))
    with pytest.raises(ValueError, match="structure"):
        DCNv2(emb, 4, 2, structure="stacked")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_layers"):
        DCNv2(emb, 4, 0)
    with pytest.raises(ValueError, match="needs low_rank"):
        DCNv2(emb, 4, 2, num_experts=2)
    with pytest.raises(ValueError, match=r"DCNv2 deep"):
        DCNv2(emb, 4, 2, deep=[8, -1])
