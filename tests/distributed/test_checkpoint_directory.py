"""Save on 3 ranks, load on 2 and on 1, continue: the same as training in one process without a break."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hugerec.distributed.checkpoint_directory import (
    INDEX,
    holdings,
    is_checkpoint,
    load_checkpoint_dir,
    save_checkpoint_dir,
)
from hugerec.distributed.launch import spawn
from hugerec.distributed.shard import shard
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Pooling, TableConfig, Zeros
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

TABLES = (
    TableConfig("a", 20, 4, optimizer=RowWiseAdagrad(lr=0.2)),
    TableConfig("b", 14, 4, pooling=Pooling.MEAN, optimizer=Adam(lr=0.05)),
    TableConfig("c", 9, 4, optimizer=SGD(lr=0.3)),
    TableConfig("h", 30, 4, init=Zeros(), dynamic=DynamicConfig()),  # new keys start at zero in any layout
    TableConfig("g", 24, 4, dynamic=DynamicConfig()),
)
ROWS = {"a": 20, "b": 14, "c": 9, "h": 0, "g": 0}
GLOBAL_BATCH, STEPS, SAVED_AT = 6, 4, 2


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = EmbeddingCollection(TABLES, Adagrad(lr=0.2))
        self.top = nn.Linear(self.emb.output_dim, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.top(torch.tanh(self.emb(batch.sparse).values)).squeeze(1)


def batches() -> list[Batch]:
    g = torch.Generator().manual_seed(7)
    out = []
    for _ in range(STEPS):
        lists = {
            f: [
                (
                    torch.randint(0, rows, (2,), generator=g) if rows else torch.randint(0, 12, (2,), generator=g) * 977
                ).tolist()
                for _ in range(GLOBAL_BATCH)
            ]
            for f, rows in ROWS.items()
        }
        labels = torch.randint(0, 2, (GLOBAL_BATCH,), generator=g).float()
        out.append(Batch(torch.zeros(GLOBAL_BATCH, 0), SparseFeatures.from_lists(lists), labels))
    return out


def local(batch: Batch, rank: int, world: int) -> Batch:
    """Examples [rank * B / W, (rank + 1) * B / W) of a global batch."""
    per = batch.batch_size // world
    keep = slice(rank * per, (rank + 1) * per)
    sf = SparseFeatures.from_jagged(
        {k: type(batch.sparse[k]).from_lists(batch.sparse[k].to_lists()[keep]) for k in batch.sparse.keys}
    )
    return Batch(batch.dense[keep], sf, batch.labels[keep])


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: list[Batch]) -> None:
    for batch in steps:
        loss = nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def dense_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam([p for n, p in model.named_parameters() if "top" in n], lr=0.05)


PLAN_3 = ShardingPlan(
    TABLES,
    {
        "a": TablePlacement.row_wise([0, 1, 2]),
        "b": TablePlacement.column_wise([2, 0]),
        "c": TablePlacement.data_parallel(3),
        "h": TablePlacement.row_wise([0, 1, 2]),
        "g": TablePlacement.table_wise(1),
    },
    world_size=3,
)
PLAN_2 = ShardingPlan(
    TABLES,
    {
        "a": TablePlacement.table_wise(1),
        "b": TablePlacement.row_wise([1, 0]),
        "c": TablePlacement.column_wise([0, 1]),
        "h": TablePlacement.table_wise(0),  # 3 hash shards -> one table: keys collected from every piece
        "g": TablePlacement.table_wise(0),  # the same layout as saved: restored as it was
    },
    world_size=2,
)


def _first_part(rank: int, world: int, path: str) -> None:
    torch.manual_seed(0)
    model = shard(Small(), PLAN_3)
    opt = dense_optimizer(model)
    train(model, opt, [local(b, rank, world) for b in batches()[:SAVED_AT]])
    save_checkpoint_dir(path, model, opt, extra={"step": SAVED_AT})


def _second_part(rank: int, world: int, path: str, out: str) -> int:
    torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
    model = shard(Small(), PLAN_2)
    opt = dense_optimizer(model)
    extra = load_checkpoint_dir(path, model, opt)
    train(model, opt, [local(b, rank, world) for b in batches()[extra["step"] :]])
    save_checkpoint_dir(out, model, opt)
    return int(extra["step"])


def _key_map(model: Small, name: str, field: str) -> dict[int, torch.Tensor]:
    held = model.emb.hash_tables[name].export()
    values = model.emb.state_dict()[f"tables.{name}.{field}"]
    return {int(k): values[int(r)] for k, r in zip(held.keys, held.rows, strict=True)}


def assert_same(got: Small, want: Small) -> None:
    g, w = got.state_dict(), want.state_dict()
    for k, v in w.items():
        if ".hash_table." in k or any(f"tables.{d}." in k for d in ("h", "g")):
            continue
        torch.testing.assert_close(g[k], v, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    for name in ("h", "g"):
        for field in ("weight", "sum"):
            a, b = _key_map(got, name, field), _key_map(want, name, field)
            assert set(a) == set(b), name
            for key in b:
                torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
    assert got.emb.steps["b"] == want.emb.steps["b"] == STEPS


def test_save_on_3_load_on_2_and_1(tmp_path: Path) -> None:
    torch.manual_seed(0)
    want = Small()
    train(want, dense_optimizer(want), batches())  # never interrupted, one process
    first, second = str(tmp_path / "three"), str(tmp_path / "two")
    spawn(3, _first_part, first)
    assert spawn(2, _second_part, first, second) == [SAVED_AT, SAVED_AT]

    # 3 ranks -> one process, then the rest of the steps
    torch.manual_seed(5)
    one = Small()
    opt = dense_optimizer(one)
    assert load_checkpoint_dir(first, one, opt) == {"step": SAVED_AT}
    train(one, opt, batches()[SAVED_AT:])
    assert_same(one, want)

    # 3 ranks -> 2 ranks (trained on) -> one process
    torch.manual_seed(6)
    final = Small()
    load_checkpoint_dir(second, final)
    assert_same(final, want)


def _fit_keeping_the_best(rank: int, world: int, out: str) -> tuple[float, int, bool, bool]:
    """A sharded `fit` scored on the training batches with flipped labels (it gets worse as it learns):
    returns the best evaluation's step, the steps run, whether restore_best left exactly best/'s
    weights in the model, and whether those differ from the last checkpoint's."""
    from hugerec.training.checkpoint import load_checkpoint
    from hugerec.training.early_stopping import EarlyStopping
    from hugerec.training.trainer import TrainConfig, fit

    torch.manual_seed(0)
    model = shard(Small(), PLAN_2)
    data = [local(b, rank, world) for b in batches()]
    flipped = [Batch(b.dense, b.sparse, 1.0 - b.labels) for b in data]
    es = EarlyStopping(metric="auc", patience=None, restore_best=True)
    cfg = TrainConfig(epochs=3, lr=0.2, eval_every=2, early_stopping=es, out_dir=out, progress=False,
                      tensorboard=False, plot=False)  # fmt: skip
    history = fit(model, data, flipped, cfg)
    assert history.best_eval is not None and history.best_checkpoint is not None and history.checkpoint is not None
    best, last = shard(Small(), PLAN_2), shard(Small(), PLAN_2)
    load_checkpoint(history.best_checkpoint, best)
    load_checkpoint(history.checkpoint, last)
    got, want, other = model.state_dict(), best.state_dict(), last.state_dict()
    restored = all(torch.equal(got[k], v) for k, v in want.items())
    return (
        history.best_eval["step"],
        history.steps,
        restored,
        any(not torch.equal(other[k], v) for k, v in want.items()),
    )


def test_a_sharded_run_keeps_its_best_and_restores_it(tmp_path: Path) -> None:
    """Early stopping on 2 ranks writes checkpoints/best/ (it kept no best before) in the checkpoint format:
    restore_best loads it back on every rank, and one process reads it as a whole model."""
    out = tmp_path / "run"
    results = spawn(2, _fit_keeping_the_best, str(out))
    assert results[0] == results[1]
    best_step, steps, restored, differs = results[0]
    assert steps == 3 * STEPS and best_step < steps and restored and differs
    whole = Small()
    extra = load_checkpoint_dir(out / "checkpoints" / "best", whole)
    assert extra["step"] == best_step and "auc" in extra["eval"]


def test_unsharded_round_trip_and_errors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Small()
    opt = dense_optimizer(model)
    train(model, opt, batches()[:1])
    save_checkpoint_dir(tmp_path / "ck", model, opt, extra=[1, "x"])
    names, placed = holdings(model)
    assert names == ["emb"] and [p.table.name for p in placed] == [t.name for t in TABLES]

    fresh = Small()
    assert load_checkpoint_dir(tmp_path / "ck", fresh) == [1, "x"]
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k

    other = nn.Module()
    other.emb = EmbeddingCollection([TableConfig("a", 21, 4, optimizer=RowWiseAdagrad(lr=0.2))], Adagrad(lr=0.2))
    with pytest.raises(ValueError, match=r"table 'a' has num_rows=21 but .* saved 20"):
        load_checkpoint_dir(tmp_path / "ck", other)
    other.emb = EmbeddingCollection([TableConfig("zz", 3, 4)])
    with pytest.raises(ValueError, match="holds no table 'zz'"):
        load_checkpoint_dir(tmp_path / "ck", other)


class _RunsCode:
    """Unpickling this runs `touch <marker>`: what a crafted checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _saved(tmp_path: Path) -> tuple[Path, Small]:
    torch.manual_seed(0)
    model = Small()
    opt = dense_optimizer(model)
    train(model, opt, batches()[:1])
    return save_checkpoint_dir(tmp_path / "ck", model, opt, extra={"step": 1}), model


def test_a_crafted_checkpoint_never_runs_code(tmp_path: Path) -> None:
    """#20 defect 1: DCP's .metadata and the `extra` blob were unpickled; a crafted checkpoint ran os.system."""
    path, _ = _saved(tmp_path)
    marker = tmp_path / "pwned"
    # a leftover DCP metadata pickle is never read
    (path / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    assert load_checkpoint_dir(path, Small()) == {"step": 1}
    # a data file replaced by a pickle that runs code, its checksum updated to match: refused, nothing ran
    evil = path / "rank-00000.pt"
    torch.save({"dense/top.weight": _RunsCode(marker)}, evil)
    index = json.loads((path / INDEX).read_text())
    index["files"]["rank-00000.pt"] = hashlib.sha256(evil.read_bytes()).hexdigest()
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"cannot read .*rank-00000\.pt: UnpicklingError"):
        load_checkpoint_dir(path, Small())
    assert not marker.exists()
    # an index pointing outside the checkpoint
    index["keys"]["dense/top.weight"] = "../elsewhere.pt"
    (path / INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"names file '\.\./elsewhere\.pt', not one of its own files"):
        load_checkpoint_dir(path, Small())
    with pytest.raises(ValueError, match="extra must be JSON-able"):
        save_checkpoint_dir(tmp_path / "other", Small(), extra=_RunsCode(marker))
    assert not (tmp_path / "other").exists() and not marker.exists()


def test_damage_is_named_and_a_torn_write_is_not_a_checkpoint(tmp_path: Path) -> None:
    path, model = _saved(tmp_path)
    data = path / "rank-00000.pt"
    raw = bytearray(data.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"rank-00000\.pt is damaged \(sha256"):
        load_checkpoint_dir(path, Small())
    (path / INDEX).write_text("{")
    with pytest.raises(ValueError, match=r"index\.json is damaged"):
        load_checkpoint_dir(path, Small())
    # a save interrupted before its index: the temporary directory is no checkpoint, the next save sweeps it
    save_checkpoint_dir(tmp_path / "again", model)
    torn = tmp_path / ".again.tmp"
    shutil.copytree(tmp_path / "again", torn)
    (torn / INDEX).unlink()
    assert is_checkpoint(tmp_path / "again") and not is_checkpoint(torn)
    with pytest.raises(FileNotFoundError, match="is not a checkpoint"):
        load_checkpoint_dir(torn, Small())
    save_checkpoint_dir(tmp_path / "again", model)  # overwriting a checkpoint in place
    assert not torn.exists() and load_checkpoint_dir(tmp_path / "again", Small()) is None


def test_a_drop_in_layer_on_adam_resumes_with_its_step(tmp_path: Path) -> None:
    """hugerec.EmbeddingBag / Embedding on sparse Adam: the checkpoint's Adam step reaches the layer (its state
    dict shows the step as a fresh tensor, which the dense copy alone never wrote back), so training on after a
    load gives the uninterrupted run's rows bit for bit (the bias correction restarted at step 1 before)."""
    from hugerec.embedding.layers import Embedding, EmbeddingBag
    from hugerec.embedding.optimizers import Adam

    class Layers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.bag = EmbeddingBag(30, 4, mode="sum", optimizer=Adam(lr=0.05))
            self.one = Embedding(20, 4, optimizer=Adam(lr=0.05))

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bag(ids % 30) * self.one(ids[:, 0] % 20)

    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 600, (6, 3), generator=g) for _ in range(10)]

    def steps(model: Layers, part: list[torch.Tensor]) -> None:
        for ids in part:
            model(ids).sin().sum().backward()

    whole = Layers()
    steps(whole, data)
    cut = Layers()
    steps(cut, data[:6])
    save_checkpoint_dir(tmp_path / "ck", cut)
    resumed = Layers()
    load_checkpoint_dir(tmp_path / "ck", resumed)
    assert int(resumed.state_dict()["bag.optimizer.step"]) == int(cut.state_dict()["bag.optimizer.step"]) > 0
    steps(resumed, data[6:])
    for k, v in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k


def test_a_parameter_that_never_had_a_gradient_resumes_without_optimizer_state(tmp_path: Path) -> None:
    """A head the loss never trains (HSTU's ranking head under the next-item loss) has no dense-Adam state;
    the checkpoint loads into a fresh optimizer, which then steps as the saved one would."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model["used"](torch.ones(2, 3)).sum().backward()
    opt.step()
    save_checkpoint_dir(tmp_path / "ck", model, opt)
    fresh = nn.ModuleDict({"used": nn.Linear(3, 1), "unused": nn.Linear(3, 1)})
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    load_checkpoint_dir(tmp_path / "ck", fresh, fresh_opt)
    for m, o in ((model, opt), (fresh, fresh_opt)):
        o.zero_grad()
        m["used"](torch.ones(2, 3)).sum().backward()
        o.step()
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert not fresh_opt.state[fresh["unused"].weight]
