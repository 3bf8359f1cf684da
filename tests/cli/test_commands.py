import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from hugerec.cli.commands import (
    evaluate_model,
    open_shards,
    predict_to_parquet,
    preprocess,
    read_model,
    synth,
    train,
)
from hugerec.cli.config_file import ConfigError
from hugerec.cli.run_config import load_run_config
from hugerec.data.schema import Schema
from hugerec.training.defaults import auto_batch_size

from .conftest import TINY


def test_synth_and_preprocess_write_trainable_shards(tiny_run: object, tmp_path: Path) -> None:
    cfg = load_run_config(None, [*TINY, "synth.rows=3000"])
    report = synth(cfg)
    assert report.num_rows == 3000 and 0.5 < report.oracle_auc["label"] < 1.0
    pre = preprocess(cfg)
    assert pre.train_rows + pre.eval_rows == 3000
    assert 0.05 < pre.eval_rows / 3000 < 0.15  # eval_fraction = 0.1
    schema = Schema.load(pre.schema)
    assert len(schema.dense) == 13 and len(schema.sparse) == 26
    assert all(c.cardinality is not None and c.cardinality <= 3000 + 2 for c in schema.sparse)
    assert (pre.workflow / "workflow.json").is_file()
    again = synth(cfg)  # a rerun replaces its own earlier output
    assert again.paths == report.paths


def test_train_evaluate_predict(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    cfg = load_run_config(None, [*TINY, "train.out_dir=runs/tep"])
    history = train(cfg)
    assert history.final_eval is not None and history.final_eval["auc"] > 0.6
    assert (prepared / "runs/tep/model.pt").is_file() and (prepared / "runs/tep/curves.png").is_file()
    metrics = evaluate_model(cfg)
    assert metrics["auc"] == pytest.approx(history.final_eval["auc"], abs=1e-6)
    out, rows = predict_to_parquet(cfg)
    table = pq.read_table(out)
    assert rows == table.num_rows == metrics["count"]
    assert table.column_names == ["label", "probability"]
    p = table["probability"].to_numpy()
    assert p.min() >= 0 and p.max() <= 1


def test_interrupted_training_resumes_exactly(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loader, DLRM and fused sparse optimizer: 3 steps + resume + 5 steps == 8 steps, bitwise."""
    monkeypatch.chdir(prepared)
    common = [*TINY, "model.dropout=0.1", "data.batch_size=256", "train.max_steps=8", "train.epochs=1"]
    train(load_run_config(None, [*common, "train.out_dir=runs/whole"]))
    train(load_run_config(None, [*common, "train.out_dir=runs/part", "train.max_steps=3"]))
    train(load_run_config(None, [*common, "train.out_dir=runs/part", "train.resume=true"]))
    whole, _ = read_model(prepared / "runs/whole/model.pt")
    part, _ = read_model(prepared / "runs/part/model.pt")
    a, b = whole.state_dict(), part.state_dict()
    assert a.keys() == b.keys()
    assert any(k.startswith("sparse_arch.tables.") for k in a)  # the embedding rows and their optimizer state
    for k in a:
        assert torch.equal(a[k], b[k]), k


DISK = ["embedding.storage=disk", "embedding.cache_rows=40", "train.checkpoint_every=2"]  # tables over 40 rows on disk

# `hugerec train` in a child that kills itself with SIGKILL in the forward of step 7 (after the checkpoint of
# step 6: the disk tables' files are unclean, rows having been written back since)
_KILLED_TRAIN = """
import os, signal, sys
from hugerec.cli import main
from hugerec.models.dlrm import DLRM
forward, calls = DLRM.forward, [0]
def killing_forward(self, *args):
    calls[0] += 1
    if calls[0] == 7 and self.training:
        os.kill(os.getpid(), signal.SIGKILL)
    return forward(self, *args)
DLRM.forward = killing_forward
sys.exit(main(["train", *sys.argv[1:]]))
"""


def _disk_model_rows(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model file, the rows and optimizer state of its disk tables read from their files."""
    model, _ = read_model(path)
    emb = model.sparse_arch
    out = {k: v for k, v in model.state_dict().items() if not k.endswith("disk_snapshot")}
    for t in emb.tables:
        weights, state = emb.read_rows(t.name, torch.arange(t.num_rows))
        out[f"{t.name}.rows"] = weights
        out |= {f"{t.name}.{k}": v for k, v in state.items()}
    return out


def test_cli_train_with_disk_tables_killed_mid_run_resumes_bit_for_bit(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[embedding] storage = "disk": `hugerec train` killed with SIGKILL mid-run, then `train.resume=true`,
    ends bitwise equal to the uninterrupted run (the rows in the files, the optimizer state, the dense part)."""
    import signal
    import subprocess
    import sys

    monkeypatch.chdir(prepared)
    common = [*TINY, *DISK, "data.batch_size=16", "train.max_steps=10", "train.epochs=1"]
    train(load_run_config(None, [*common, "train.out_dir=runs/disk_whole"]))
    tables = sorted(p.name for p in (prepared / "runs/disk_whole/tables").glob("*.rows"))
    assert 0 < len(tables) < 26  # the tables larger than their cache are on disk, the others in memory
    killed = [*common, "train.out_dir=runs/disk_killed"]
    proc = subprocess.run([sys.executable, "-c", _KILLED_TRAIN, *killed], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert any(b'"clean": false' in p.read_bytes()[:4096] for p in (prepared / "runs/disk_killed/tables").glob("*.rows"))
    train(load_run_config(None, [*killed, "train.resume=true"]))
    whole = _disk_model_rows(prepared / "runs/disk_whole/model.pt")
    resumed = _disk_model_rows(prepared / "runs/disk_killed/model.pt")
    assert whole.keys() == resumed.keys() and any(k.endswith(".rows") for k in whole)
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k
    train(load_run_config(None, [*common, "train.out_dir=runs/disk_killed", "train.max_steps=2"]))  # a fresh run
    assert all(b'"clean": true' in p.read_bytes()[:4096] for p in (prepared / "runs/disk_killed/tables").glob("*.rows"))


# `hugerec train` in a child that kills itself with SIGKILL right after the first disk table's first snapshot is
# complete, inside the checkpoint of step 2, before that checkpoint is committed: the file is clean and holds the
# rows of step 2, a snapshot of it exists, and no checkpoint does
_KILLED_AFTER_SNAPSHOT = """
import os, signal, sys
from hugerec.cli import main
from hugerec.embedding.disk import DiskTier
snapshot = DiskTier.snapshot
def killing_snapshot(self):
    n = snapshot(self)
    os.kill(os.getpid(), signal.SIGKILL)
    return n
DiskTier.snapshot = killing_snapshot
sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_cli_train_killed_before_its_first_checkpoint_commits_starts_afresh(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed after a disk table's first snapshot but before the first checkpoint is committed has nothing
    to resume from: `train.resume=true` starts afresh (the trained rows in the files, which no checkpoint
    describes, are not kept under a new dense part) and ends bitwise equal to the uninterrupted run."""
    import signal
    import subprocess
    import sys

    monkeypatch.chdir(prepared)
    common = [*TINY, *DISK, "data.batch_size=16", "train.max_steps=6", "train.epochs=1"]
    train(load_run_config(None, [*common, "train.out_dir=runs/first_whole"]))
    killed = [*common, "train.out_dir=runs/first_killed"]
    proc = subprocess.run([sys.executable, "-c", _KILLED_AFTER_SNAPSHOT, *killed], capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    tables = prepared / "runs/first_killed/tables"
    assert len([d for d in tables.glob("*.rows.snapshots") if any(d.iterdir())]) == 1  # the case: a snapshot, no checkpoint
    assert not list((prepared / "runs/first_killed/checkpoints").glob("step-*"))
    train(load_run_config(None, [*killed, "train.resume=true"]))
    whole = _disk_model_rows(prepared / "runs/first_whole/model.pt")
    resumed = _disk_model_rows(prepared / "runs/first_killed/model.pt")
    assert whole.keys() == resumed.keys() and any(k.endswith(".rows") for k in whole)
    for k in whole:
        assert torch.equal(whole[k], resumed[k]), k


def test_embedding_disk_keys_are_checked(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    with pytest.raises(ConfigError, match=r'embedding.*exactly one of cache_rows and cache_bytes, got cache_rows = None'):
        load_run_config(None, [*TINY, "embedding.storage=disk"])
    with pytest.raises(ConfigError, match=r"embedding.*cache_rows = 40 needs storage = \"disk\""):
        load_run_config(None, [*TINY, "embedding.cache_rows=40"])
    with pytest.raises(ConfigError, match=r"embedding.*cache_rows must be an integer >= 1, got 0"):
        load_run_config(None, [*TINY, "embedding.storage=disk", "embedding.cache_rows=0"])
    with pytest.raises(ConfigError, match=r"embedding.disk_tables: 'C99' is not a table of the data"):
        train(load_run_config(None, [*TINY, *DISK, "embedding.disk_tables=[\"C99\"]", "train.out_dir=runs/bad"]))


def test_dataset_mistakes_are_config_errors(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    schema = "data.schema=runs/quickstart/data/schema.json"
    with pytest.raises(ConfigError, match=r"data\.train: no such file: nowhere"):
        train(load_run_config(None, [*TINY, "data.train=nowhere", schema]))
    with pytest.raises(ConfigError, match=r"data\.schema: no schema at"):
        train(load_run_config(None, [*TINY, "data.schema=missing.json"]))
    empty = prepared / "empty"
    empty.mkdir(exist_ok=True)
    shutil.copy(next((prepared / "runs/quickstart/data/train").glob("*.parquet")), empty / "part.parquet")
    table = pq.read_table(empty / "part.parquet").slice(0, 0)
    pq.write_table(table, empty / "part.parquet")
    with pytest.raises(ConfigError, match="empty dataset"):
        train(load_run_config(None, [*TINY, f"data.train={empty}", schema]))
    with pytest.raises(ConfigError, match="no model at"):
        evaluate_model(load_run_config(None, [*TINY, "train.out_dir=runs/never"]))


@pytest.mark.shared_data("criteo/train_examples.txt.gz")
def test_the_criteo_sample_config_runs_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_data: Path) -> None:
    config = Path(__file__).resolve().parents[2] / "configs" / "criteo_sample.toml"
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config(config, ["train.max_steps=6", "train.progress=false", "train.tensorboard=false"])
    pre = preprocess(cfg)
    assert pre.train_rows + pre.eval_rows == 10_000
    history = train(cfg)
    assert history.steps == 6
    assert evaluate_model(cfg)["count"] == pre.eval_rows


def test_train_keeps_the_best_evaluation_and_evaluate_reads_it(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    common = [*TINY, "train.out_dir=runs/best", "train.epochs=3", "train.eval_every=3", "train.lr=0.05"]
    keep_all = ["train.early_stopping.patience=none", "train.early_stopping.min_delta=0"]
    history = train(load_run_config(None, [*common, *keep_all]))
    assert len(history.evals) >= 3 and not history.stopped_early
    best = history.best_eval
    assert best is not None and best["auc"] == max(r["auc"] for r in history.evals)
    out = prepared / "runs/best"
    assert (out / "best.pt").is_file() and (out / "model.pt").is_file()
    cfg = load_run_config(None, common)
    assert evaluate_model(cfg)["auc"] == pytest.approx(best["auc"], abs=1e-6)  # best.pt by default
    final = history.final_eval
    assert final is not None
    assert evaluate_model(cfg, out / "model.pt")["auc"] == pytest.approx(final["auc"], abs=1e-6)  # --model wins
    # a later run without an evaluation leaves no best.pt behind for evaluate to pick up
    train(load_run_config(None, [*common, "data.eval=none", "train.epochs=1"]))
    assert not (out / "best.pt").exists()


def test_auto_batch_size_follows_the_rows(prepared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(prepared)
    cfg = load_run_config(None, [*TINY, "data.batch_size=auto", "train.out_dir=runs/auto", "train.max_steps=2"])
    rows = sum(pq.read_metadata(f).num_rows for f in (prepared / "runs/quickstart/data/train").glob("*.parquet"))
    history = train(cfg)
    assert history.train[-1]["samples_per_s"] > 0
    schema = Schema.load(prepared / "runs/quickstart/data/schema.json")
    loader = open_shards(cfg.data.train, "data.train", schema, cfg)
    assert loader.batch_size == auto_batch_size(rows) == 128  # 2 * sqrt(~5,400 rows) = 147 -> 128
