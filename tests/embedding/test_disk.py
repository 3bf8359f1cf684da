"""Disk-tier tables: bit for bit the in-memory tables, checkpoints by snapshot, bad input, crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adagrad, Adam, Ftrl, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Pooling, StorageDtype, TableConfig
from hugerec.sparse.features import SparseFeatures

OPTIMIZERS = [SGD(lr=0.1), Adagrad(lr=0.1), RowWiseAdagrad(lr=0.1), Adam(lr=0.05), Ftrl(lr=0.1)]


def tables(
    tmp: Path | None, cache: int, dtype: StorageDtype = StorageDtype.FP32, dynamic: bool = False
) -> list[TableConfig]:
    """a (disk when tmp is given; features a and a2), b (memory), s (disk, sequence)."""

    def disk(name: str) -> dict[str, object]:
        return {} if tmp is None else {"storage": "disk", "cache_rows": cache, "path": str(tmp / f"{name}.rows")}

    dyn = DynamicConfig() if dynamic else None
    return [
        TableConfig("a", num_rows=40, dim=5, features=("a", "a2"), dtype=dtype, dynamic=dyn, **disk("a")),  # type: ignore[arg-type]
        TableConfig("b", num_rows=30, dim=4),
        TableConfig("s", num_rows=20, dim=3, pooling=Pooling.NONE, **disk("s")),  # type: ignore[arg-type]
    ]


def collection(ts: list[TableConfig], opt: Optimizer) -> EmbeddingCollection:
    torch.manual_seed(0)
    return EmbeddingCollection(ts, optimizer=opt)


def batches(n: int, seed: int = 1, dynamic: bool = False) -> list[SparseFeatures]:
    """Table a's ids: rows, or (dynamic) raw keys of 60 values for 40 rows: the hash map evicts."""
    rng = np.random.default_rng(seed)

    def key(x: int) -> int:
        return x * 1_000_003 + 7 if dynamic else x

    out = []
    for _ in range(n):
        ids = rng.integers(0, 60 if dynamic else 40, size=(3, 3))
        out.append(
            SparseFeatures.from_lists(
                {
                    "a": [[key(int(x)) for x in ids[b, : rng.integers(0, 3)]] for b in range(3)],
                    "a2": [[key(int(ids[b, 2]))] for b in range(3)],
                    "b": [[int(rng.integers(0, 30))] for _ in range(3)],
                    "s": [[int(x) for x in rng.integers(0, 20, 2)] for _ in range(3)],
                }
            )
        )
    return out


def step(emb: EmbeddingCollection, f: SparseFeatures) -> torch.Tensor:
    pooled = emb(f).values
    seq = emb.sequences(f)["s"].values
    loss = (pooled * torch.linspace(-1, 1, pooled.shape[1])).square().sum() + seq.sin().sum()
    loss.backward()
    return torch.cat([pooled.detach().flatten(), seq.detach().flatten()])


def rows_of(emb: EmbeddingCollection, name: str, num_rows: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return emb.read_rows(name, torch.arange(num_rows))


def assert_same_tables(x: EmbeddingCollection, y: EmbeddingCollection) -> None:
    for t in x.tables:
        (wx, sx), (wy, sy) = rows_of(x, t.name, t.num_rows), rows_of(y, t.name, t.num_rows)
        assert torch.equal(wx, wy), t.name
        assert sx.keys() == sy.keys() and all(torch.equal(sx[k], sy[k]) for k in sx), t.name


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("cache", [18, 40])
def test_bit_for_bit_with_memory(tmp_path: Path, opt: Optimizer, cache: int) -> None:
    """Every optimizer, a cache of a few rows (every batch evicts) and one as large as the table."""
    cache = min(cache, 20)  # table s has 20 rows
    mem, disk = collection(tables(None, cache), opt), collection(tables(tmp_path, cache), opt)
    assert_same_tables(mem, disk)
    for f in batches(25):
        assert torch.equal(step(mem, f), step(disk, f))
    assert_same_tables(mem, disk)
    stats = disk.disk_stats()
    assert stats["misses"] > 0 and stats["rows_read"] == stats["misses"]
    if cache == 18:
        assert stats["rows_written"] > 0  # dirty rows went back to the file on eviction
    disk.flush()
    assert_same_tables(mem, disk)


def test_unmapped_file_pages_lose_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MAPPED_BYTES = UNMAP_ABOVE = 0: every access unmaps the file's pages (MADV_DONTNEED), dirty
    written-back rows included; the kernel's page cache keeps them, and training is the in-memory run."""
    from hugerec.embedding import disk as disk_module

    monkeypatch.setattr(disk_module, "MAPPED_BYTES", 0)
    monkeypatch.setattr(disk_module, "UNMAP_ABOVE", 0)
    calls = []
    unmap = disk_module.DiskTier._unmap_pages
    monkeypatch.setattr(disk_module.DiskTier, "_unmap_pages", lambda self: calls.append(1) or unmap(self))
    mem, disk = collection(tables(None, 18), Adagrad(lr=0.1)), collection(tables(tmp_path, 18), Adagrad(lr=0.1))
    for f in batches(15):
        assert torch.equal(step(mem, f), step(disk, f))
    assert len(calls) > 15 and disk.disk_stats()["rows_written"] > 0
    assert_same_tables(mem, disk)


def test_bf16_and_dynamic_tables(tmp_path: Path) -> None:
    """bf16 storage; a dynamic table whose hash map points into the disk tier (recycled rows reset on disk)."""
    for dtype, dynamic in ((StorageDtype.BF16, False), (StorageDtype.FP32, True)):
        d = tmp_path / f"{dtype.value}{dynamic}"
        d.mkdir()
        data = batches(20, dynamic=dynamic)
        mem = collection(tables(None, 18, dtype, dynamic), Adam(lr=0.05))
        want = [step(mem, f) for f in data]  # one collection at a time: recycled rows draw from the global RNG
        disk = collection(tables(d, 18, dtype, dynamic), Adam(lr=0.05))
        assert all(torch.equal(step(disk, f), w) for f, w in zip(data, want, strict=True))
        assert_same_tables(mem, disk)
        if dynamic:
            assert disk.hash_tables["a"].stats().evictions > 0


def test_eval_reads_without_dirtying(tmp_path: Path) -> None:
    disk = collection(tables(tmp_path, 18), RowWiseAdagrad(lr=0.1))
    mem = collection(tables(None, 18), RowWiseAdagrad(lr=0.1))
    disk.eval()
    mem.eval()
    for f in batches(8):
        assert torch.equal(disk(f).values, mem(f).values)
    assert disk.disk_stats()["rows_written"] == 0


def test_read_write_reset_rows(tmp_path: Path) -> None:
    disk = collection(tables(tmp_path, 18), Adagrad(lr=0.1))
    mem = collection(tables(None, 18), Adagrad(lr=0.1))
    for f in batches(5):
        step(disk, f), step(mem, f)
    rows = torch.tensor([0, 3, 39, 3])
    for e in (disk, mem):
        e.write_rows("a", rows[:3], torch.full((3, 5), 2.0))
        e.write_rows("a", torch.tensor([7]), torch.ones(1, 5), {"sum": torch.full((1, 5), 0.5)})
        torch.manual_seed(3)
        e.reset_rows("a", torch.tensor([8, 9]))
    assert_same_tables(disk, mem)
    assert torch.equal(disk.read_rows("a", rows)[0], mem.read_rows("a", rows)[0])
    with pytest.raises(ValueError, match="lives on disk"):
        disk.table_weight("a")


def test_checkpoint_snapshot_resumes_exactly(tmp_path: Path) -> None:
    emb = collection(tables(tmp_path, 18), Adam(lr=0.05))
    data = batches(20)
    for f in data[:10]:
        step(emb, f)
    state = {k: v.clone() for k, v in emb.state_dict().items()}  # in-memory tables' entries are views
    assert "tables.a.weight" not in state and int(state["tables.a.disk_snapshot"]) == 1
    snap = tmp_path / "a.rows.snapshots" / "1"
    assert snap.is_file() and snap.stat().st_ino != (tmp_path / "a.rows").stat().st_ino
    after = [step(emb, f) for f in data[10:]]
    emb.load_state_dict(state)
    assert [torch.equal(step(emb, f), want) for f, want in zip(data[10:], after, strict=True)] == [True] * 10
    # a fresh collection on the same files resumes from the state dict too
    other = collection(tables(tmp_path, 18), Adam(lr=0.05))
    other.load_state_dict(state)
    assert torch.equal(step(other, data[10]), after[0])


def test_snapshots_kept(tmp_path: Path) -> None:
    emb = collection(tables(tmp_path, 18), SGD(lr=0.1))
    for f in batches(5):
        step(emb, f)
        assert emb.state_dict()["tables.a.disk_snapshot"] == emb.state_dict()["tables.a.disk_snapshot"]  # no change
    assert sorted(p.name for p in (tmp_path / "a.rows.snapshots").iterdir()) == ["3", "4", "5"]
    with pytest.raises(RuntimeError, match=r"snapshot .*1' does not exist"):
        emb.load_state_dict({**emb.state_dict(), "tables.a.disk_snapshot": torch.tensor(1)})


def test_a_pinned_snapshot_outlives_the_rotation_while_its_holder_exists(tmp_path: Path) -> None:
    """A snapshot pinned by a holder (a checkpoint directory, a model file) is not rotated out while the holder
    exists; once it is gone, the next snapshot's rotation deletes it."""
    emb = collection(tables(tmp_path, 18), SGD(lr=0.1))
    data = batches(8)
    step(emb, data[0])
    first = int(emb.state_dict()["tables.a.disk_snapshot"])
    rows = emb.read_rows("a", torch.arange(40))[0].clone()
    holder = tmp_path / "checkpoints" / "best"
    holder.mkdir(parents=True)
    emb.pin_disk_snapshot("a", first, holder)
    for f in data[1:6]:
        step(emb, f)
        emb.state_dict()
    snaps = tmp_path / "a.rows.snapshots"
    assert sorted(int(p.name) for p in snaps.iterdir() if p.name.isdigit()) == [first, 4, 5, 6]
    other = collection(tables(tmp_path, 18), SGD(lr=0.1))
    other.load_state_dict({**emb.state_dict(), "tables.a.disk_snapshot": torch.tensor(first)})
    assert torch.equal(other.read_rows("a", torch.arange(40))[0], rows)
    del other
    holder.rmdir()
    step(emb, data[6])
    emb.state_dict()
    assert sorted(int(p.name) for p in snaps.iterdir() if p.name.isdigit()) == [5, 6, 7]
    with pytest.raises(ValueError, match=r"cannot pin snapshot 1: .*1' does not exist"):
        emb.pin_disk_snapshot("a", 1, tmp_path)
    with pytest.raises(ValueError, match="'b' is not a disk-tier table"):
        emb.pin_disk_snapshot("b", 7, tmp_path)
    (snaps / "pins.json").write_text("[1, 2")
    step(emb, data[7])
    with pytest.raises(ValueError, match=r"pins.json' is not a pins file"):
        emb.state_dict()


def test_the_best_checkpoint_keeps_its_rows_past_three_newer_checkpoints(tmp_path: Path) -> None:
    """save_best pins the snapshot it names: after more than KEEP_SNAPSHOTS newer checkpoints the best one still
    loads, with its rows (it crashed `hugerec train`'s best.pt once the best evaluation was 3 checkpoints old)."""
    from hugerec.training.checkpoint import best_checkpoint, load_checkpoint, save_best, save_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    model = DiskModel(run)
    data = disk_batches()
    opt = torch.optim.SGD(model.out.parameters(), lr=0.1)

    def train(batches: list[object]) -> None:
        for b in batches:
            opt.zero_grad()
            model(b).square().sum().backward()
            opt.step()

    train(data[:2])
    save_best(run / "checkpoints", model)
    best_rows = model.emb.read_rows("user", torch.arange(48))[0].clone()
    for k in range(5):
        train(data[2 + 2 * k : 4 + 2 * k])
        save_checkpoint(run / "checkpoints", 4 + 2 * k, model, keep_last=2)
    fresh = DiskModel(run)
    load_checkpoint(best_checkpoint(run / "checkpoints"), fresh)  # type: ignore[arg-type]
    assert torch.equal(fresh.emb.read_rows("user", torch.arange(48))[0], best_rows)


def test_bad_config_and_files(tmp_path: Path) -> None:
    p = str(tmp_path / "t.rows")
    with pytest.raises(ValueError, match="cache_rows = 11 is larger than the table"):
        TableConfig("t", num_rows=10, dim=4, storage="disk", cache_rows=11, path=p)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cache_bytes = 100000 is larger than the table"):
        EmbeddingCollection([TableConfig("t", num_rows=10, dim=4, storage="disk", cache_bytes=100_000, path=p)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one of cache_rows and cache_bytes"):
        TableConfig("t", num_rows=10, dim=4, storage="disk", path=p)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"path = .* needs storage = 'disk'"):
        TableConfig("t", num_rows=10, dim=4, path=p)
    big = TableConfig("t", num_rows=10**13, dim=64, storage="disk", cache_rows=4, path=p)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"t.rows' needs [\d,]+ bytes on disk .* free"):
        EmbeddingCollection([big])
    assert not Path(p).exists()
    t = TableConfig("t", num_rows=10, dim=4, storage="disk", cache_rows=4, path=p)  # type: ignore[arg-type]
    EmbeddingCollection([t], optimizer=SGD())
    with pytest.raises(ValueError, match="holds another layout: dim = 4, this table has 5"):
        EmbeddingCollection([TableConfig("t", num_rows=10, dim=5, storage="disk", cache_rows=4, path=p)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="holds another layout: optimizer = 'sgd', this table has 'adam'"):
        EmbeddingCollection([t], optimizer=Adam())
    Path(p).write_bytes(b"\x00" * 5000)
    with pytest.raises(ValueError, match="is not a hugerec disk-tier file"):
        EmbeddingCollection([t])
    ok = TableConfig("t", num_rows=10, dim=4, storage="disk", cache_rows=4, path=str(tmp_path / "u.rows"))  # type: ignore[arg-type]
    emb = EmbeddingCollection([ok])
    with pytest.raises(ValueError, match=r"feature 't' \(table 't', num_rows 10\): id 10 of example 1 is outside"):
        emb(SparseFeatures.from_lists({"t": [[1], [10]]}))
    with pytest.raises(ValueError, match="cache of 4 rows is too small"):
        emb(SparseFeatures.from_lists({"t": [[0, 1, 2], [3, 4]]}))
    assert TableConfig.from_json(ok.to_json()) == ok


_CRASH = textwrap.dedent(
    """
    import os, sys, torch
    sys.path.insert(0, {tests!r})
    from embedding.test_disk import batches, collection, step, tables
    from hugerec.embedding.optimizers import Adam
    from pathlib import Path
    emb = collection(tables(Path({tmp!r}), 18), Adam(lr=0.05))
    data = batches(400)
    for f in data[:10]:
        step(emb, f)
    torch.save(emb.state_dict(), {ckpt!r})
    print("go", flush=True)
    while True:  # write-backs on every batch until killed
        for f in data[10:]:
            step(emb, f)
    """
)


def test_kill_mid_write_back_then_reload(tmp_path: Path) -> None:
    """kill -9 while rows are written back: the live file is refused (never read torn), the checkpoint restores it."""
    ckpt = tmp_path / "ckpt.pt"
    code = _CRASH.format(tests=str(Path(__file__).parents[1]), tmp=str(tmp_path), ckpt=str(ckpt))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "go"
    import time

    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    emb = collection(tables(tmp_path, 18), Adam(lr=0.05))
    data = batches(400)
    with pytest.raises(ValueError, match=r"a\.rows' was not closed cleanly"):
        step(emb, data[10])
    emb.load_state_dict(torch.load(ckpt, weights_only=True))
    ref = collection(tables(None, 18), Adam(lr=0.05))
    for f in data[:10]:
        step(ref, f)
    assert_same_tables(emb, ref)
    for f in data[10:30]:
        assert torch.equal(step(emb, f), step(ref, f))


def test_snapshot_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up during a checkpoint's snapshot: one line naming the table and the snapshot, no
    partial snapshot left, training goes on, and the next checkpoint (space freed) resumes exactly."""
    import errno

    emb = collection(tables(tmp_path, 18), Adagrad(lr=0.1))
    data = batches(6)
    for f in data[:3]:
        step(emb, f)

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "copy_file_range", full)
        with pytest.raises(OSError, match=r"table 'a': cannot write the checkpoint's snapshot .*/1' .*No space left"):
            emb.state_dict()
    assert not (tmp_path / "a.rows.snapshots" / "1").exists()
    saved = {k: v.clone() for k, v in emb.state_dict().items()}  # memory tables' entries are views
    after = [step(emb, f) for f in data[3:]]
    emb.load_state_dict(saved)
    assert all(torch.equal(step(emb, f), want) for f, want in zip(data[3:], after, strict=True))


# -- kill -9 of a training run (fit with checkpoints), resumed with fit(resume=True) --------------------
class DiskModel(torch.nn.Module):
    """A disk-tier table 'user' (cache of 10 rows for 48: every step evicts and writes back) and an
    in-memory table 'item' -> a linear layer -> logits [B]."""

    def __init__(self, run: Path) -> None:
        super().__init__()
        torch.manual_seed(0)
        user = TableConfig("user", num_rows=48, dim=4, storage="disk", cache_rows=10, path=str(run / "user.rows"))  # type: ignore[arg-type]
        self.emb = EmbeddingCollection([user, TableConfig("item", num_rows=30, dim=4)], optimizer=Adagrad(lr=0.2))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, batch: object) -> torch.Tensor:
        return self.out(self.emb(batch.sparse).values).squeeze(1)  # type: ignore[attr-defined]  # [B, 8] -> [B]


def disk_batches() -> list[object]:
    from hugerec.sparse.batch import Batch

    g = torch.Generator().manual_seed(3)
    out: list[object] = []
    for _ in range(24):
        users, items = torch.randint(0, 48, (4,), generator=g), torch.randint(0, 30, (4,), generator=g)
        labels = (torch.rand(4, generator=g) < 0.5).float()
        out.append(Batch(torch.zeros(4, 0), SparseFeatures.from_dense({"user": users, "item": items}), labels))
    return out


def fit_disk_model(run: Path, resume: bool) -> dict[str, torch.Tensor]:
    """fit() the DiskModel on disk_batches() with a checkpoint every 4 steps; its final weights, every table row."""
    from hugerec.training.trainer import TrainConfig, fit

    model = DiskModel(run)
    cfg = TrainConfig(
        lr=0.01, checkpoint_every=4, out_dir=str(run), resume=resume, progress=False, tensorboard=False, plot=False
    )
    fit(model, disk_batches(), None, cfg)
    weights, state = model.emb.read_rows("user", torch.arange(48))
    return {"out.weight": model.out.weight.detach().clone(), "user": weights, "user.sum": state["sum"],
            "item": model.emb.read_rows("item", torch.arange(30))[0]}  # fmt: skip


# The child trains until the kill point, where it kills itself with SIGKILL (no cleanup runs):
#   step: in the forward of step 10 (its rows are loaded, evictions have written rows back: the file is unclean)
#   before_checkpoint: the same in step 3, before the first checkpoint (step 4): no snapshot of the file exists
#   snapshot: half-way through cloning the table file for the checkpoint of step 8 (its 2nd snapshot)
#   write_back: in the checkpoint of step 8 (its state_dict() calls: 3 flushes per checkpoint, the 1st writes the
#   dirty rows back), after the rows are written, before the file is marked clean
_KILL = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    import hugerec.embedding.disk as disk
    from embedding.test_disk import DiskModel, fit_disk_model
    where, calls = {where!r}, [0]

    def die_at(n):
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    if where in ("step", "before_checkpoint"):
        forward = DiskModel.forward
        def killing_forward(self, batch):
            out = forward(self, batch)
            die_at(10 if where == "step" else 3)
            return out
        DiskModel.forward = killing_forward
    elif where == "snapshot":
        clone = disk._clone
        def killing_clone(source, target):
            calls[0] += 1
            if calls[0] == 2:
                with open(source, "rb") as src, open(target, "wb") as dst:
                    dst.write(src.read(os.path.getsize(source) // 2))
                os.kill(os.getpid(), signal.SIGKILL)
            clone(source, target)
        disk._clone = killing_clone
    elif where == "write_back":
        flush = disk.row_cache.flush
        def killing_flush(*args):
            written = flush(*args)
            die_at(4)
            return written
        disk.row_cache.flush = killing_flush
    fit_disk_model(Path({run!r}), resume=False)
    print("finished without being killed")
    """
)


@pytest.mark.parametrize("where", ["step", "snapshot", "write_back"])
def test_fit_killed_mid_step_snapshot_write_back_resumes_bit_for_bit(tmp_path: Path, where: str) -> None:
    """kill -9 mid-step, mid-snapshot and mid-write-back; fit(resume=True) restores the disk tier from the
    latest checkpoint's snapshot (its file is unclean, or a newer snapshot is torn) and ends bitwise equal
    to the uninterrupted run."""
    (tmp_path / "whole").mkdir()
    whole = fit_disk_model(tmp_path / "whole", resume=False)
    run = tmp_path / "killed"
    run.mkdir()
    code = _KILL.format(tests=str(Path(__file__).parents[1]), where=where, run=str(run))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    if where != "snapshot":
        header = (run / "user.rows").read_bytes()[:4096]
        assert b'"clean": false' in header  # the case the restore exists for
    resumed = fit_disk_model(run, resume=True)
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole), where


def test_fit_killed_before_its_first_checkpoint_starts_afresh(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kill -9 before any checkpoint: the unclean file has no snapshot to restore (nothing was committed), so the
    restarted run recreates it with one line saying why, drawing the rows as the first creation did, and ends
    bitwise equal to the uninterrupted run."""
    (tmp_path / "whole").mkdir()
    whole = fit_disk_model(tmp_path / "whole", resume=False)
    run = tmp_path / "killed"
    run.mkdir()
    code = _KILL.format(tests=str(Path(__file__).parents[1]), where="before_checkpoint", run=str(run))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert b'"clean": false' in (run / "user.rows").read_bytes()[:4096]
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    with caplog.at_level("WARNING", logger="hugerec.embedding.disk"):
        resumed = fit_disk_model(run, resume=True)
    lines = [r.getMessage() for r in caplog.records if r.name == "hugerec.embedding.disk"]
    assert len(lines) == 1 and "'user': " in lines[0] and "no checkpoint snapshot of it exists" in lines[0], lines
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_a_torn_first_snapshot_does_not_count(tmp_path: Path) -> None:
    """A snapshot is complete or absent: one killed half-way leaves only its temporary file, which the next
    snapshot replaces."""
    emb = collection(tables(tmp_path, 18), Adagrad(lr=0.1))
    for f in batches(3):
        step(emb, f)
    d = tmp_path / "a.rows.snapshots"
    d.mkdir()
    (d / ".1.partial").write_bytes(b"torn")
    emb.state_dict()
    assert sorted(p.name for p in d.iterdir()) == ["1"]
    assert (d / "1").stat().st_size == (tmp_path / "a.rows").stat().st_size
