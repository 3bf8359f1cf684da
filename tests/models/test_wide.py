import torch

from hugerec.embedding.optimizers import SGD, Ftrl
from hugerec.embedding.table_config import DynamicConfig, Pooling, TableConfig, Zeros
from hugerec.models.wide import WideArch, wide_tables


def test_wide_tables_are_dim1_zero_init_ftrl_twins() -> None:
    tables = [
        TableConfig("item", 100, 16, features=("item", "last_item"), pooling=Pooling.MEAN),
        TableConfig("user", 7, 8, dynamic=DynamicConfig()),
        TableConfig("hist", 100, 16, pooling=Pooling.NONE),
    ]
    twins = wide_tables(tables)
    assert [t.name for t in twins] == ["wide_item", "wide_user"]
    assert [t.features for t in twins] == [("item", "last_item"), ("user",)]
    assert all(t.dim == 1 and t.pooling is Pooling.SUM and t.init == Zeros() for t in twins)
    assert all(t.optimizer == Ftrl() for t in twins)
    assert twins[1].num_rows == 7 and twins[1].dynamic == DynamicConfig()
    assert wide_tables(tables, SGD(lr=0.5))[0].optimizer == SGD(lr=0.5)


def test_wide_arch_sums_weights_dense_term_and_bias() -> None:
    arch = WideArch(num_dense=2)
    assert arch.dense is not None
    with torch.no_grad():
        arch.dense.weight.copy_(torch.tensor([[1.0, -2.0]]))
        arch.bias.fill_(0.5)
    dense = torch.tensor([[1.0, 1.0], [0.0, 3.0]])
    weights = torch.tensor([[0.1, 0.2, 0.3], [1.0, 0.0, -1.0]])
    torch.testing.assert_close(arch(dense, weights), torch.tensor([0.6 - 1.0 + 0.5, -6.0 + 0.5]))
    no_dense = WideArch(num_dense=0)
    torch.testing.assert_close(no_dense(torch.zeros(2, 0), weights), weights.sum(1))
