import pytest
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures


def naive_dlrm(model: DLRM, batch: Batch) -> torch.Tensor:
    """The MLPerf recipe spelled out: bottom MLP, pairwise dots over [bottom, e_1..e_F], top MLP."""
    with torch.no_grad():
        pooled = model.sparse_arch(batch.sparse)
        vectors = [model.dense_arch(batch.dense)] + [pooled[k] for k in pooled.keys]
        dots = [(vectors[i] * vectors[j]).sum(1) for i in range(len(vectors)) for j in range(i + 1, len(vectors))]
        z = torch.cat([vectors[0], torch.stack(dots, dim=1)], dim=1)
        return model.over_arch(z).squeeze(1)


def test_matches_naive_reference_and_shapes(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=8), Adagrad(lr=0.1))
    model = DLRM(emb, task.num_dense, bottom=[16, 8], top=[32, 16, 1]).eval()
    (batch,) = task.batches(1, batch_size=7)
    out = model(batch)
    assert out.shape == (7,) and out.dtype == torch.float32
    assert model.over_arch.in_dim == 8 + 4 * 3 // 2  # D + (F+1)F/2 with F = 3 tables
    torch.testing.assert_close(out, naive_dlrm(model, batch))


def test_backward_reaches_dense_params_and_updates_touched_rows_only(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=4), Adagrad(lr=0.1))
    model = DLRM(emb, task.num_dense, bottom=[8, 4], top=[8, 1])
    (batch,) = task.batches(1, batch_size=5)
    before = {t.name: emb.table_weight(t.name).clone() for t in emb.tables}
    nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels).backward()
    params = model.dense_parameters()
    assert len(params) == len(list(model.parameters())) == 8  # 2 + 2 Linear layers, weight and bias
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
    for name, old in before.items():
        changed = (emb.table_weight(name) != old).any(dim=1)
        touched = torch.zeros(task.num_rows, dtype=torch.bool)
        touched[batch.sparse[name].values] = True
        assert torch.equal(changed, touched), name


def test_learns_a_tiny_task(task) -> None:
    model = DLRM(EmbeddingCollection(task.tables(dim=8), Adagrad(lr=0.1)), task.num_dense, [16, 8], [16, 1])
    losses = task.train(model, task.batches(8, batch_size=64), epochs=6)
    assert losses[-1] < 0.5 * losses[0], losses


def test_without_dense_features(task) -> None:
    model = DLRM(EmbeddingCollection(task.tables(dim=4), Adagrad(lr=0.1)), 0, bottom=[], top=[8, 1])
    (batch,) = task.batches(1, batch_size=3)
    out = model(Batch(torch.zeros(3, 0), batch.sparse, batch.labels))
    assert out.shape == (3,)
    assert model.dense_arch is None and model.interaction_arch.out_dim == 3


def test_self_interaction_widens_the_over_arch(task) -> None:
    model = DLRM(EmbeddingCollection(task.tables(dim=4)), task.num_dense, [4], [1], self_interaction=True)
    assert model.over_arch.in_dim == 4 + 4 * 5 // 2


def test_bf16_autocast_runs_and_stays_close(task) -> None:
    model = DLRM(EmbeddingCollection(task.tables(dim=8), Adagrad(lr=0.1)), task.num_dense, [16, 8], [16, 1])
    (batch,) = task.batches(1, batch_size=16)
    model.eval()
    ref = model(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=0.05, rtol=0.05)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
    loss.backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.dense_parameters())


def test_compiled_dense_part_matches_eager_and_still_trains(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=4), Adagrad(lr=0.1))
    model = DLRM(emb, task.num_dense, [8, 4], [8, 1])
    batches = task.batches(2, batch_size=8)
    model.eval()
    eager = model(batches[0])
    model.compile_dense(dynamic=False)
    torch.testing.assert_close(model(batches[0]), eager)
    model.train()
    before = emb.table_weight("t0").clone()
    nn.functional.binary_cross_entropy_with_logits(model(batches[1]), batches[1].labels).backward()
    assert not torch.equal(emb.table_weight("t0"), before)
    assert all(p.grad is not None for p in model.dense_parameters())


def test_bad_configs(task) -> None:
    emb = EmbeddingCollection(task.tables(dim=8))
    with pytest.raises(ValueError, match=r"bottom must end at the embedding dim 8, got bottom=\[16, 4\]"):
        DLRM(emb, 4, [16, 4], [8, 1])
    with pytest.raises(ValueError, match=r"top must end at 1"):
        DLRM(emb, 4, [8], [8, 2])
    with pytest.raises(ValueError, match="num_dense=0"):
        DLRM(emb, 0, [8], [8, 1])
    with pytest.raises(ValueError, match="num_dense"):
        DLRM(emb, -1, [8], [8, 1])
    mixed = EmbeddingCollection([TableConfig("a", 10, 8), TableConfig("b", 10, 4)])
    with pytest.raises(ValueError, match="same embedding dim"):
        DLRM(mixed, 4, [8], [8, 1])


def test_wrong_dense_width_in_batch(task) -> None:
    model = DLRM(EmbeddingCollection(task.tables(dim=4)), task.num_dense, [4], [1])
    sparse = SparseFeatures.from_dense({f"t{i}": torch.zeros(2, 1, dtype=torch.int64) for i in range(3)})
    with pytest.raises(ValueError, match="built for 4 dense features, batch has 3"):
        model(Batch(torch.zeros(2, 3), sparse, torch.zeros(2)))
