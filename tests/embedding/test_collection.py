"""EmbeddingCollection: API, errors, state dicts, and training trajectories against plain PyTorch."""

from __future__ import annotations

import math
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hugerec import ops
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import Pooling, StorageDtype, TableConfig
from hugerec.sparse.features import SparseFeatures

TABLES = [
    TableConfig("a", 40, 8),
    TableConfig("b", 30, 8, features=("b1", "b2"), pooling=Pooling.MEAN),
    TableConfig("c", 20, 4),
]


def random_features(
    gen: torch.Generator, tables: list[TableConfig], batch: int = 6, weighted: bool = False, max_len: int = 3
) -> SparseFeatures:
    lists, weights = {}, {}
    for t in tables:
        for f in t.features:
            lengths = torch.randint(0, max_len + 1, (batch,), generator=gen).tolist()
            lists[f] = [torch.randint(0, t.num_rows, (n,), generator=gen).tolist() for n in lengths]
            weights[f] = [torch.rand(n, generator=gen).tolist() for n in lengths]
    return SparseFeatures.from_lists(lists, weights if weighted else None)


class TorchTables(nn.Module):
    """The plain-PyTorch twin: one nn.EmbeddingBag(sparse=True) per table, weights copied from a collection."""

    def __init__(self, emb: EmbeddingCollection) -> None:
        super().__init__()
        self.tables = {t.name: t for t in emb.tables}
        self.bags = nn.ModuleDict(
            {
                t.name: nn.EmbeddingBag(
                    t.num_rows,
                    t.dim,
                    mode=t.pooling.value,
                    sparse=True,
                    _weight=emb.table_weight(t.name).float().clone(),
                )
                for t in emb.tables
            }
        )

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        outs = []
        for t in self.tables.values():
            for f in t.features:
                j = features[f]
                w = None if j.weights is None else j.weights
                outs.append(self.bags[t.name](j.values, j.offsets()[:-1], per_sample_weights=w))
        return torch.cat(outs, dim=1)


def _train(
    emb: EmbeddingCollection, torch_tables: TorchTables, make_torch_opt: object, steps: int, weighted: bool
) -> None:
    """Same model (embeddings -> Linear -> squared error) trained both ways, dense part with torch Adam."""
    gen = torch.Generator().manual_seed(0)
    dense_a = nn.Linear(emb.output_dim, 1)
    dense_b = nn.Linear(emb.output_dim, 1)
    dense_b.load_state_dict(dense_a.state_dict())
    opt_a = torch.optim.Adam(dense_a.parameters(), lr=0.01)
    opt_b = torch.optim.Adam(dense_b.parameters(), lr=0.01)
    sparse_opt = make_torch_opt(list(torch_tables.parameters()))  # type: ignore[operator]
    for _ in range(steps):
        features = random_features(gen, list(emb.tables), weighted=weighted)
        y = torch.randn(features.batch_size, 1, generator=gen)
        opt_a.zero_grad()
        F.mse_loss(dense_a(emb(features).values), y).backward()
        opt_a.step()
        opt_b.zero_grad()
        sparse_opt.zero_grad()
        F.mse_loss(dense_b(torch_tables(features)), y).backward()
        opt_b.step()
        sparse_opt.step()
    for t in emb.tables:
        torch.testing.assert_close(
            emb.table_weight(t.name), torch_tables.bags[t.name].weight.detach(), rtol=1e-5, atol=1e-6
        )
    torch.testing.assert_close(dense_a.weight, dense_b.weight, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("optimizer", "make_torch_opt"),
    [
        (SGD(lr=0.5), lambda p: torch.optim.SGD(p, lr=0.5)),
        (Adam(lr=0.05), lambda p: torch.optim.SparseAdam(p, lr=0.05)),
        (Adagrad(lr=0.3), lambda p: torch.optim.Adagrad(p, lr=0.3)),
        (
            Adagrad(lr=0.3, initial_accumulator_value=0.2),
            lambda p: torch.optim.Adagrad(p, lr=0.3, initial_accumulator_value=0.2),
        ),
    ],
    ids=["sgd", "adam", "adagrad", "adagrad-init"],
)
@pytest.mark.parametrize("weighted", [False, True])
def test_trajectory_matches_torch(optimizer: Optimizer, make_torch_opt: object, weighted: bool) -> None:
    tables = [t for t in TABLES if not weighted or t.pooling is Pooling.SUM]  # torch weighs SUM bags only
    emb = EmbeddingCollection(tables, optimizer)
    _train(emb, TorchTables(emb), make_torch_opt, steps=6, weighted=weighted)


class RowWiseAdagradTorch(torch.optim.Optimizer):
    """The few lines of torch people write: coalesce, per-row accumulator, index_add_."""

    def __init__(self, params: list[nn.Parameter], lr: float, eps: float) -> None:
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()
                rows, g = grad.indices()[0], grad.values()
                acc = self.state[p].setdefault("sum", torch.zeros(p.shape[0]))
                acc.index_add_(0, rows, (g * g).mean(dim=1))
                p.index_add_(0, rows, -group["lr"] * g / (acc[rows].sqrt() + group["eps"])[:, None])


class FtrlTorch(torch.optim.Optimizer):
    """FTRL-Proximal per coordinate on the coalesced rows, written from McMahan et al. (2013)."""

    def __init__(self, params: list[nn.Parameter], opt: Ftrl) -> None:
        super().__init__(params, {"opt": opt})

    @torch.no_grad()
    def step(self) -> None:  # type: ignore[override]
        for group in self.param_groups:
            o: Ftrl = group["opt"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.coalesce()
                rows, g = grad.indices()[0], grad.values()
                st = self.state[p]
                z = st.setdefault("z", torch.zeros_like(p))
                n = st.setdefault("n", torch.full_like(p, o.initial_accumulator_value))
                w = p[rows]
                n_new = n[rows] + g * g
                sigma = (n_new.pow(-o.lr_power) - n[rows].pow(-o.lr_power)) / o.lr
                z[rows] += g - sigma * w
                n[rows] = n_new
                zr = z[rows]
                new = (torch.sign(zr) * o.l1 - zr) / ((o.beta + n_new.pow(-o.lr_power)) / o.lr + 2 * o.l2)
                p[rows] = torch.where(zr.abs() <= o.l1, torch.zeros_like(new), new)


def test_trajectory_rowwise_adagrad_matches_hand_written_torch() -> None:
    emb = EmbeddingCollection(TABLES, RowWiseAdagrad(lr=0.2, eps=1e-8))
    _train(emb, TorchTables(emb), lambda p: RowWiseAdagradTorch(p, lr=0.2, eps=1e-8), steps=6, weighted=False)


def test_trajectory_ftrl_matches_hand_written_torch() -> None:
    opt = Ftrl(lr=0.3, l1=0.001, l2=0.01, beta=0.5)
    emb = EmbeddingCollection(TABLES, opt)
    _train(emb, TorchTables(emb), lambda p: FtrlTorch(p, opt), steps=6, weighted=False)


def test_adam_step_counts_per_table() -> None:
    emb = EmbeddingCollection(TABLES, Adam())
    gen = torch.Generator().manual_seed(1)
    emb(random_features(gen, TABLES)).values.sum().backward()
    pooled_c = emb(random_features(gen, TABLES))
    pooled_c["c"].sum().backward()  # only c's columns in the loss, but every table was looked up
    assert emb.steps == {"a": 2, "b": 2, "c": 2}
    assert int(emb.state_dict()["tables.a.step"]) == 2


def test_forward_layout_and_properties() -> None:
    emb = EmbeddingCollection([*TABLES, TableConfig("h", 10, 3, pooling=Pooling.NONE)])
    assert emb.feature_names == ("a", "b1", "b2", "c")
    assert emb.feature_dims == (8, 8, 8, 4)
    assert emb.output_dim == 28
    assert emb.sequence_feature_names == ("h",)
    features = SparseFeatures.from_lists({"c": [[1, 2]], "b2": [[3]], "a": [[0]], "b1": [[]], "h": [[9, 9, 0]]})
    pooled = emb(features)
    assert pooled.keys == emb.feature_names and pooled.values.shape == (1, 28)
    torch.testing.assert_close(pooled["c"][0], emb.table_weight("c")[[1, 2]].sum(0))
    torch.testing.assert_close(pooled["b1"][0], torch.zeros(8))  # an empty MEAN bag is zero
    torch.testing.assert_close(pooled["b2"][0], emb.table_weight("b")[3])
    seq = emb.sequences(features)
    assert list(seq) == ["h"] and seq["h"].lengths.tolist() == [3]
    torch.testing.assert_close(seq["h"].values, emb.table_weight("h")[[9, 9, 0]])


def test_sequence_backward_updates_rows_and_unused_outputs_do_not_step() -> None:
    tables = [TableConfig("h", 10, 4, pooling=Pooling.NONE), TableConfig("g", 10, 2, pooling=Pooling.NONE)]
    emb = EmbeddingCollection(tables, Adam(lr=0.1))
    before_h, before_g = emb.table_weight("h").clone(), emb.table_weight("g").clone()
    seq = emb.sequences(SparseFeatures.from_lists({"h": [[1, 1], [2]], "g": [[3], []]}))
    seq["h"].values.sum().backward()
    changed = (emb.table_weight("h") != before_h).any(dim=1).nonzero().flatten().tolist()
    assert changed == [1, 2]
    assert torch.equal(emb.table_weight("g"), before_g)
    assert emb.steps == {"h": 1, "g": 0}


def test_no_update_in_eval_or_no_grad() -> None:
    emb = EmbeddingCollection(TABLES, SGD(lr=1.0))
    features = random_features(torch.Generator().manual_seed(0), TABLES)
    before = emb.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    with torch.no_grad():
        assert not emb(features).values.requires_grad
    emb.eval()
    out = emb(features).values
    assert not out.requires_grad
    dense = nn.Linear(emb.output_dim, 1)
    dense(out).sum().backward()
    for k, v in emb.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert emb.steps == {"a": 0, "b": 0, "c": 0}


def test_not_parameters() -> None:
    emb = EmbeddingCollection(TABLES)
    assert list(emb.parameters()) == [] and list(emb.buffers()) == []


def test_rows_seam_missing_rows_are_zero_and_not_updated() -> None:
    tables = [TableConfig("d", 10, 4, pooling=Pooling.MEAN), TableConfig("s", 10, 4)]
    emb = EmbeddingCollection(tables, SGD(lr=1.0))
    features = SparseFeatures.from_lists({"d": [[123456789, 55], [7]], "s": [[1], [2]]})  # raw keys for d
    rows = torch.tensor([3, -1, -1, 1, 2])  # what a hash table would map them to
    before = emb.table_weight("d").clone()
    out = emb.pooled_from_rows(features, rows, missing_ok={"d"})
    torch.testing.assert_close(out["d"], torch.stack([before[3], torch.zeros(4)]))  # MEAN over rows that exist
    out.values.sum().backward()
    changed = (emb.table_weight("d") != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [3]
    with pytest.raises(ValueError, match=r"feature 'd' \(table 'd', num_rows 10\): id -1 of example 0"):
        emb.pooled_from_rows(features, rows)  # -1 is only "no row" for tables in missing_ok
    with pytest.raises(ValueError, match="missing_ok names unknown tables"):
        emb.pooled_from_rows(features, rows, missing_ok={"nope"})


def test_bad_input_errors() -> None:
    emb = EmbeddingCollection(TABLES)
    ok = {"a": [[1]], "b1": [[2]], "b2": [[3]], "c": [[4]]}
    with pytest.raises(ValueError, match=r"feature 'c' \(table 'c', num_rows 20\): id 20 of example 1"):
        emb(SparseFeatures.from_lists({**ok, "c": [[4], [20]], "a": [[1], []], "b1": [[], []], "b2": [[], []]}))
    with pytest.raises(ValueError, match=r"feature 'b2' \(table 'b', num_rows 30\): id -3 of example 0"):
        emb(SparseFeatures.from_lists({**ok, "b2": [[1, -3]]}))
    with pytest.raises(ValueError, match=r"unknown features \['zz'\]"):
        emb(SparseFeatures.from_lists({**ok, "zz": [[1]]}))
    with pytest.raises(ValueError, match=r"missing features \['b2'\]"):
        emb(SparseFeatures.from_lists({k: v for k, v in ok.items() if k != "b2"}))
    feats = SparseFeatures.from_lists(ok)
    with pytest.raises(ValueError, match="weights must be floating point"):
        emb(SparseFeatures(feats.keys, feats.values, feats.lengths, torch.ones(4, dtype=torch.int64)))
    with pytest.raises(ValueError, match="rows must be int64"):
        emb.pooled_from_rows(feats, feats.values.to(torch.int32))
    with pytest.raises(ValueError, match="duplicate table name 'a'"):
        EmbeddingCollection([TABLES[0], TABLES[0]])
    with pytest.raises(ValueError, match="feature 'a' is looked up in two tables"):
        EmbeddingCollection([TABLES[0], TableConfig("x", 3, 8, features=("a",))])
    with pytest.raises(ValueError, match="unknown sparse optimizer"):
        EmbeddingCollection(TABLES, optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        emb.table_weight("nope")
    with pytest.raises(ValueError, match="needs at least one table"):
        EmbeddingCollection([])


def _roundtrip_tables(dtype_a: StorageDtype, lr_c: float) -> list[TableConfig]:
    return [
        TableConfig("c", 20, 4, optimizer=RowWiseAdagrad(lr=lr_c)),
        TableConfig("b", 30, 8, features=("b1", "b2"), pooling=Pooling.MEAN),
        TableConfig("a", 40, 8, dtype=dtype_a),
    ]


def test_state_dict_round_trip_across_groupings() -> None:
    src = EmbeddingCollection(TABLES, RowWiseAdagrad(lr=0.1))
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        src(random_features(gen, TABLES)).values.pow(2).sum().backward()
    saved = {k: v.clone() for k, v in src.state_dict().items()}
    assert set(saved) == {f"tables.{t}.{k}" for t in "abc" for k in ("weight", "sum")}
    assert saved["tables.b.weight"].shape == (30, 8) and saved["tables.b.sum"].shape == (30,)
    # c gets its own group (lr override), a and b are grouped in another order: same per-table result
    dst = EmbeddingCollection(_roundtrip_tables(StorageDtype.FP32, 0.5), RowWiseAdagrad(lr=0.1))
    assert len(dst._fused.groups) == 2  # the point of the test
    dst.load_state_dict(saved)
    for k, v in dst.state_dict().items():
        assert torch.equal(v, saved[k]), k
    features = random_features(gen, TABLES)
    for f in src.feature_names:
        torch.testing.assert_close(dst(features)[f], src(features)[f], rtol=0, atol=0)
    half = EmbeddingCollection(_roundtrip_tables(StorageDtype.BF16, 0.1), RowWiseAdagrad(lr=0.1))
    half.load_state_dict(saved)  # fp32 -> bf16 storage
    torch.testing.assert_close(half.table_weight("a").float(), saved["tables.a.weight"], rtol=1e-2, atol=1e-2)


def test_load_state_dict_reports_missing_unexpected_and_mismatched_keys() -> None:
    emb = EmbeddingCollection(TABLES, Adam())
    sd = emb.state_dict()
    result = emb.load_state_dict(
        {k: v for k, v in sd.items() if k != "tables.a.exp_avg"} | {"x": torch.zeros(1)}, strict=False
    )
    assert result.missing_keys == ["tables.a.exp_avg"] and result.unexpected_keys == ["x"]
    with pytest.raises(RuntimeError, match=r"size mismatch for tables\.c\.weight"):
        emb.load_state_dict({**sd, "tables.c.weight": torch.zeros(3, 4)})


def test_nested_state_dict_keys_and_read_write_reset_rows() -> None:
    model = nn.Sequential()
    model.add_module("emb", EmbeddingCollection(TABLES, Adagrad()))
    model.add_module("head", nn.Linear(28, 1))
    keys = set(model.state_dict())
    assert {"emb.tables.a.weight", "emb.tables.a.sum", "head.weight"} <= keys
    emb = model.emb
    rows = torch.tensor([3, 0])
    w, state = emb.read_rows("a", rows)
    assert w.shape == (2, 8) and state["sum"].shape == (2, 8)
    emb.write_rows("a", rows, torch.ones(2, 8), {"sum": torch.full((2, 8), 5.0)})
    torch.testing.assert_close(emb.table_weight("a")[[0, 3]], torch.ones(2, 8))
    assert float(emb.table_state("a")["sum"][3, 0]) == 5.0
    emb.reset_rows("a", torch.tensor([3]))
    assert float(emb.table_state("a")["sum"][3, 0]) == 0.0
    bound = math.sqrt(1 / 40)
    assert float(emb.table_weight("a")[3].abs().max()) <= bound and float(emb.table_weight("a")[0, 0]) == 1.0


@pytest.mark.parametrize("optimizer", [Adagrad(lr=0.1, initial_accumulator_value=0.1), Adam(lr=0.05), Ftrl(lr=0.3)])
def test_reset_optimizer_state_keeps_the_weights_and_then_trains_like_a_fresh_optimizer(optimizer: Optimizer) -> None:
    gen = torch.Generator().manual_seed(0)
    trained = EmbeddingCollection(TABLES, optimizer)
    for _ in range(3):
        trained(random_features(gen, TABLES)).values.pow(2).sum().backward()
    fresh = EmbeddingCollection(TABLES, optimizer)  # the trained weights under a new optimizer
    fresh.load_state_dict({k: v for k, v in trained.state_dict().items() if k.endswith(".weight")}, strict=False)
    assert any(not torch.equal(v, fresh.state_dict()[k]) for k, v in trained.state_dict().items())
    trained.reset_optimizer_state()
    for k, v in fresh.state_dict().items():
        assert torch.equal(trained.state_dict()[k], v), k
    features = random_features(gen, TABLES)
    for emb in (trained, fresh):
        emb(features).values.pow(2).sum().backward()
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(trained.state_dict()[k], v, rtol=0, atol=0, msg=k)
    with pytest.raises(ValueError, match="no table 'zz'; tables are"):
        trained.reset_optimizer_state(["zz"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    cpu = EmbeddingCollection(TABLES, Adam(lr=0.1))
    gpu = EmbeddingCollection(TABLES, Adam(lr=0.1)).to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    features = random_features(torch.Generator().manual_seed(0), TABLES)
    cpu(features).values.pow(2).sum().backward()
    gpu(features.to("cuda")).values.pow(2).sum().backward()
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(gpu.state_dict()[k].cpu(), v, rtol=1e-5, atol=1e-6)


@pytest.fixture
def reference_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Route every op to the torch reference, as on CUDA tensors."""
    monkeypatch.setattr(ops, "_numba", lambda weight: False)


@pytest.mark.parametrize("optimizer", [Adam(lr=0.05), RowWiseAdagrad(lr=0.2), Ftrl(lr=0.3, l1=0.001)])
def test_reference_path_trains_like_the_kernels(optimizer: Optimizer, request: pytest.FixtureRequest) -> None:
    """The collection on the reference ops (the CUDA path) == on the Numba kernels, bf16 storage included."""
    tables = [*TABLES, TableConfig("h", 10, 4, dtype=StorageDtype.BF16), TableConfig("s", 10, 4, pooling=Pooling.NONE)]
    fast = EmbeddingCollection(tables, optimizer)
    slow = EmbeddingCollection(tables, optimizer)
    slow.load_state_dict(fast.state_dict())
    gen = torch.Generator().manual_seed(0)
    batches = [random_features(gen, tables, weighted=True) for _ in range(3)]
    for emb, reference in ((fast, False), (slow, True)):
        if reference:
            request.getfixturevalue("reference_ops")
        for features in batches:
            loss = emb(features).values.pow(2).sum() + emb.sequences(features)["s"].values.pow(3).sum()
            loss.backward()
    for k, v in fast.state_dict().items():
        torch.testing.assert_close(v.float(), slow.state_dict()[k].float(), rtol=1e-2, atol=1e-4, msg=k)


def test_concurrent_forward_from_many_threads_matches_serial() -> None:
    """Inference from several threads (a server's workers): pooled outputs never share storage."""
    emb = EmbeddingCollection([TableConfig("u", 5000, 16), TableConfig("i", 3000, 16, features=("i", "j"))]).eval()
    gen = torch.Generator().manual_seed(0)

    def features(b: int) -> SparseFeatures:
        lists = {
            f: [torch.randint(0, 3000, (int(n),), generator=gen).tolist() for n in torch.randint(0, 6, (b,))]
            for f in ("u", "i", "j")
        }
        return SparseFeatures.from_lists(lists)

    batches = [features(64 + k) for k in range(24)]
    with torch.no_grad():
        expected = [emb(b).values.clone() for b in batches]

    def run(k: int) -> bool:
        with torch.no_grad():
            return all(torch.equal(emb(batches[(k + r) % 24]).values, expected[(k + r) % 24]) for r in range(24))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes: races show up reliably
    try:
        with ThreadPoolExecutor(8) as pool:
            assert all(pool.map(run, range(16)))
    finally:
        sys.setswitchinterval(interval)
