import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD
from hugerec.embedding.table_config import TableConfig
from hugerec.sparse.features import SparseFeatures
from hugerec.training.precision import Precision, autocast, unscale_sparse_gradients


class FixedScaler:
    """Stands in for torch.amp.GradScaler (fp16 scaling needs CUDA)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def get_scale(self) -> float:
        return self.scale


def _collection() -> EmbeddingCollection:
    torch.manual_seed(0)
    return EmbeddingCollection([TableConfig("t", num_rows=10, dim=4)], SGD(lr=0.1))


def _step(emb: EmbeddingCollection, loss_scale: float) -> None:
    features = SparseFeatures.from_lists({"t": [[1, 2], [2], [7]]})
    target = torch.arange(12, dtype=torch.float32).view(3, 4)
    loss = ((emb(features).values - target) ** 2).sum() * loss_scale
    loss.backward()


def test_sparse_updates_see_unscaled_gradients() -> None:
    plain, scaled = _collection(), _collection()
    _step(plain, 1.0)
    handles = unscale_sparse_gradients(scaled, FixedScaler(1024.0))  # type: ignore[arg-type]
    _step(scaled, 1024.0)
    torch.testing.assert_close(scaled.table_weight("t"), plain.table_weight("t"))
    for h in handles:
        h.remove()
    _step(scaled, 1024.0)  # hooks removed: the scale reaches the rows again
    assert not torch.allclose(scaled.table_weight("t"), plain.table_weight("t"), atol=1.0)


def test_an_overflowed_step_leaves_the_rows_alone() -> None:
    emb = _collection()
    before = emb.table_weight("t").clone()
    unscale_sparse_gradients(emb, FixedScaler(1.0))  # type: ignore[arg-type]
    _step(emb, float("inf"))
    assert torch.equal(emb.table_weight("t"), before)


@pytest.mark.parametrize("precision", list(Precision))
def test_autocast_contexts(precision: Precision) -> None:
    x = torch.randn(4, 4)
    if precision is Precision.FP16 and not torch.cuda.is_available():
        pytest.skip("fp16 autocast is for CUDA")
    device = torch.device("cuda" if precision is Precision.FP16 else "cpu")
    with autocast(device, precision):
        y = x.to(device) @ x.to(device)
    expected = {Precision.FP32: torch.float32, Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
    assert y.dtype == expected[precision]
