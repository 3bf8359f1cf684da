"""hugerec.serving's public names as a user holds them: export -> load, and publishing updates with export_delta."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import hugerec as hr


def _model() -> torch.nn.Module:
    """A DLRM whose user table is dynamic (raw keys, rows made on first sight) and whose item table is static."""
    torch.manual_seed(0)
    tables = [
        hr.TableConfig("user", 1000, 8, dynamic=hr.embedding.DynamicConfig()),
        hr.TableConfig("item", 50, 8),
    ]
    return hr.models.build_model(hr.models.DLRMConfig(bottom=(8, 8), top=(8, 1)), tables, 2, hr.SGD(lr=0.5))


def _step(model: torch.nn.Module, users: list[int], seed: int) -> None:
    """One training step on `users` (the fused sparse update runs in backward)."""
    gen = torch.Generator().manual_seed(seed)
    sparse = hr.sparse.SparseFeatures.from_lists({"user": [[u] for u in users], "item": [[u % 50] for u in users]})
    batch = hr.sparse.Batch(torch.randn(len(users), 2, generator=gen), sparse, torch.ones(len(users)))
    model.train()
    model(batch).sum().backward()
    model.eval()


def test_published_deltas_reach_a_loaded_bundle(tmp_path: Path) -> None:
    """export -> load with an updates folder; export_delta writes the rows changed since the last delta into it
    (the `since` it returns makes the next delta hold only what changed after), and the served rows follow."""
    model = _model()
    _step(model, [10**12 + 1, 7, 8], seed=0)
    since = hr.serving.export_delta(model.sparse_arch, tmp_path / "first.parquet")  # everything so far
    bundle = hr.serving.export(model, tmp_path / "bundle")
    updates = tmp_path / "updates"
    updates.mkdir()
    options = hr.serving.ServeOptions(state_dir=str(tmp_path / "state"), updates_dir=str(updates), update_interval=0.05)
    served = hr.serving.load(bundle, options)
    try:
        assert served.kind == "model"
        _step(model, [7, 99, 10**15], seed=1)  # 7 again, two new users
        since = hr.serving.export_delta(model.sparse_arch, updates / "step-1.parquet", since)
        assert since["user"] > 0
        watcher = served.info["watchers"][0]
        deadline = time.monotonic() + 30
        while watcher.applied < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watcher.applied == 1 and not watcher.errors
        keys = np.array([7, 99, 10**15, 10**12 + 1], np.int64)
        collection = model.sparse_arch
        rows = collection.table_weight("user")[collection.hash_tables["user"].find(keys)].detach()
        np.testing.assert_allclose(served.model.ps.lookup("user", keys).numpy(), rows.numpy(), rtol=1e-6, atol=1e-6)
        # a delta after the last one holds nothing: every change was published once
        hr.serving.export_delta(model.sparse_arch, tmp_path / "empty.parquet", since)
        import pyarrow.parquet as pq

        assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0
    finally:
        served.close()


def test_the_dlrm_example_exports_and_loads(tmp_path: Path) -> None:
    """examples/train_dlrm.py, small, from another directory: fit -> evaluate -> save_model / load_model ->
    serving.export -> serving.load, the loaded bundle scoring raw rows as the model in memory does."""
    example = Path(__file__).resolve().parents[2] / "examples" / "train_dlrm.py"
    done = subprocess.run(
        [sys.executable, str(example), "--rows-per-file", "4096"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reloaded from model.pt" in done.stdout
    assert "served model bundle 'dlrm': the first 8 eval rows score as in memory" in done.stdout
