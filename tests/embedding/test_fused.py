"""FusedTables: grouping, padding, per-table views and row access."""

from __future__ import annotations

import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.fused import FusedTables, padded_dim, sparse_tables, state_fields
from hugerec.embedding.layers import EmbeddingBag
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, RowWiseAdagrad
from hugerec.embedding.table_config import Normal, StorageDtype, TableConfig, Zeros


def test_padded_dim() -> None:
    assert [padded_dim(d, 4) for d in (1, 4, 5, 16, 17)] == [4, 4, 8, 16, 20]
    assert [padded_dim(d, 2) for d in (1, 8, 9)] == [8, 8, 16]


def test_grouping_by_dim_dtype_and_optimizer() -> None:
    tables = [
        TableConfig("a", 5, 3),
        TableConfig("b", 7, 3),
        TableConfig("c", 2, 3, dtype=StorageDtype.BF16),
        TableConfig("d", 4, 8),
        TableConfig("e", 3, 3, optimizer=Adam()),
    ]
    fused = FusedTables(tables, RowWiseAdagrad())
    assert [g.tables for g in fused.groups] == [["a", "b"], ["c"], ["d"], ["e"]]
    g = fused.groups[0]
    assert g.weight.shape == (12, 4) and g.state.shape == (12, 1)
    assert fused.slots["b"].row_offset == 5 and fused.slots["b"].index == 1
    assert fused.groups[1].weight.shape == (2, 8) and fused.groups[1].weight.dtype == torch.bfloat16
    assert fused.groups[3].state.shape == (3, 6)
    assert not g.weight[:, 3].any()  # the padding column stays zero
    assert fused.table_weight("b").shape == (7, 3)


def test_initializers_and_initial_state() -> None:
    tables = [
        TableConfig("z", 4, 2, init=Zeros()),
        TableConfig("n", 2000, 2, init=Normal(3.0, 0.1)),
        TableConfig("f", 3, 2, optimizer=Ftrl(initial_accumulator_value=0.7)),
        TableConfig("g", 3, 2, optimizer=Adagrad(initial_accumulator_value=0.2)),
    ]
    fused = FusedTables(tables, SGD())
    assert not fused.table_weight("z").any()
    assert abs(float(fused.table_weight("n").mean()) - 3.0) < 0.02
    assert float(fused.table_weight("f").abs().max()) <= 3**-0.5  # default Uniform(+-sqrt(1/num_rows))
    ftrl = fused.table_state("f")
    assert not ftrl["z"].any() and bool((ftrl["n"] == 0.7).all())
    assert bool((fused.table_state("g")["sum"] == 0.2).all())
    assert fused.table_state("z") == {}


def test_state_field_names() -> None:
    names = {
        type(o).__name__: [f.name for f in state_fields(o, 4)]
        for o in (SGD(), Adagrad(), RowWiseAdagrad(), Adam(), Ftrl())
    }
    assert names == {
        "SGD": [],
        "Adagrad": ["sum"],
        "RowWiseAdagrad": ["sum"],
        "Adam": ["exp_avg", "exp_avg_sq"],
        "Ftrl": ["z", "n"],
    }


def test_rows_access_and_errors() -> None:
    fused = FusedTables([TableConfig("a", 5, 2), TableConfig("b", 4, 2)], Adam())
    fused.write_rows(
        "b",
        torch.tensor([3]),
        torch.tensor([[1.0, 2.0]]),
        {"exp_avg": torch.ones(1, 2), "exp_avg_sq": torch.ones(1, 2)},
    )
    w, s = fused.read_rows("b", torch.tensor([3]))
    assert w.tolist() == [[1.0, 2.0]] and s["exp_avg"].tolist() == [[1.0, 1.0]]
    assert fused.groups[0].weight[5 + 3, :2].tolist() == [1.0, 2.0]
    fused.write_rows("b", torch.tensor([3]), torch.zeros(1, 2))  # state kept
    assert fused.read_rows("b", torch.tensor([3]))[1]["exp_avg"].tolist() == [[1.0, 1.0]]
    fused.reset_rows("b", torch.tensor([3]))
    assert not fused.read_rows("b", torch.tensor([3]))[1]["exp_avg"].any()
    with pytest.raises(ValueError, match=r"read_rows\('a'\): row 5 outside \[0, 5\)"):
        fused.read_rows("a", torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"weights shape \(1, 3\) != \(1, 2\)"):
        fused.write_rows("a", torch.tensor([0]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="state keys"):
        fused.write_rows("a", torch.tensor([0]), torch.zeros(1, 2), {"sum": torch.zeros(1)})


def test_advance_counts_steps_and_gives_adams_bias_corrected_lr() -> None:
    fused = FusedTables([TableConfig("a", 5, 2), TableConfig("b", 4, 2)], Adam(lr=0.1, beta1=0.5, beta2=0.75))
    lrs = fused.advance(0, [1])
    assert fused.steps == {"a": 0, "b": 1}
    assert lrs.tolist() == [0.0, pytest.approx(0.1 * 0.5 / 0.5)]


def test_lr_scale_multiplies_every_tables_step_lr() -> None:
    fused = FusedTables([TableConfig("a", 5, 2), TableConfig("b", 4, 2)], Adam(lr=0.1, beta1=0.5, beta2=0.75))
    fused.set_lr_scale(0.25)
    lrs = fused.advance(0, [0, 1])
    assert lrs.tolist() == [pytest.approx(0.1 * 0.25), pytest.approx(0.1 * 0.25)]
    fused.set_lr_scale(1)
    assert fused.advance(0, [0]).tolist()[0] == 0.1 * (1.0 - 0.75**2) ** 0.5 / (1.0 - 0.5**2)  # 1.0: exactly the rule's


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), True, "1"])
def test_lr_scale_refuses_what_is_not_a_finite_number_at_least_0(bad: object) -> None:
    fused = FusedTables([TableConfig("a", 5, 2)], SGD(lr=0.1))
    with pytest.raises(ValueError, match="lr scale must be a finite number >= 0"):
        fused.set_lr_scale(bad)  # type: ignore[arg-type]
    assert fused.lr_scale == 1.0


def test_sparse_tables_finds_collections_and_layers_once_each() -> None:
    coll = EmbeddingCollection([TableConfig("a", 5, 2, ("f",))], SGD(lr=0.1))
    bag = EmbeddingBag(4, 2, mode="sum", optimizer=SGD(lr=0.1))
    model = torch.nn.ModuleDict({"coll": coll, "bag": bag, "again": coll, "dense": torch.nn.Linear(2, 2)})
    found = sparse_tables(model)
    assert [id(t) for t in found] == [id(coll._fused), id(bag._fused)]
    assert sparse_tables(torch.nn.Linear(2, 2)) == []


@pytest.mark.parametrize("dtype", list(StorageDtype))
def test_write_and_reset_rows_touch_only_those_rows_in_every_storage_dtype(dtype: StorageDtype) -> None:
    fused = FusedTables(
        [TableConfig("a", 3, 5, dtype=dtype), TableConfig("b", 6, 5, dtype=dtype)],
        Adagrad(initial_accumulator_value=0.5),
    )
    torch.manual_seed(0)
    rows = torch.tensor([4, 0, 2])
    before_a = fused.table_weight("a").clone()
    new = torch.randn(3, 5).to(fused.table_weight("b").dtype)
    fused.write_rows("b", rows, new, {"sum": torch.full((3, 5), 2.0)})
    expected = fused.table_weight("b").clone()
    expected[rows] = new
    assert torch.equal(fused.table_weight("b"), expected) and torch.equal(fused.table_weight("a"), before_a)
    assert fused.table_state("b")["sum"][rows].eq(2.0).all() and fused.table_state("b")["sum"][[1, 3, 5]].eq(0.5).all()
    fused.reset_rows("b", torch.tensor([0]))
    assert not torch.equal(fused.table_weight("b")[0], new[1]) and torch.equal(fused.table_weight("b")[4], new[0])
    assert fused.table_state("b")["sum"][0].eq(0.5).all() and fused.table_state("b")["sum"][[2, 4]].eq(2.0).all()
