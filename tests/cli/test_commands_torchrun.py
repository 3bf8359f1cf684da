"""`torchrun --nproc-per-node 2 -m hugerec train ...`: the single-process config trained on 2 gloo ranks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hugerec.cli.commands import evaluate_model, read_model
from hugerec.cli.run_config import load_run_config
from hugerec.training.checkpoint import list_checkpoints

from .conftest import TINY


def _split_row_groups(src: Path, dst: Path) -> None:
    """The prepared shards rewritten with small row groups: the loader hands each rank whole row groups."""
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.parquet")):
        pq.write_table(pq.read_table(f), dst / f.name, row_group_size=256)


@pytest.mark.parametrize("average", [[], ["train.epochs=2", "train.average_epochs=2", "train.schedule.decay_epochs=0"]], ids=["raw", "averaged"])
def test_torchrun_two_ranks_train_and_write_model(prepared: Path, tmp_path: Path, average: list[str]) -> None:
    """Averaged: model.pt holds the mean of the two epoch ends that the final evaluation scored (each rank
    averaged its shard), not the raw last weights the step checkpoints keep."""
    data = prepared / "runs" / "quickstart" / "data"
    for split in ("train", "eval"):
        _split_row_groups(data / split, tmp_path / split)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue", "HUGEREC_DEBUG": "1"}
    overrides = [
        *TINY,
        f"data.train={tmp_path / 'train'}",
        f"data.eval={tmp_path / 'eval'}",
        f"data.schema={data / 'schema.json'}",
        f"train.out_dir={out}",
        *average,
    ]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "hugerec", "train", *overrides]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    aucs = re.findall(r"; eval AUC (\d\.\d{4})", proc.stdout)
    assert len(aucs) == 1, proc.stdout  # rank 0 reports the global AUC, once
    assert f"best eval AUC {aucs[0]}" in proc.stdout and (out / "best.pt").is_file()  # a sharded run keeps its best too
    assert "table_wise" in proc.stdout or "row_wise" in proc.stdout or "data_parallel" in proc.stdout  # the plan
    model, schema = read_model(out / "model.pt")
    assert len(schema.sparse) > 0 and sum(p.numel() for p in model.parameters()) > 0
    # model.pt holds the whole trained model: one process scoring every eval row finds the AUC the ranks agreed on
    assert f"{evaluate_model(load_run_config(None, overrides))['auc']:.4f}" == aucs[0]
    assert (out / "metrics.jsonl").is_file()
    assert list_checkpoints(out / "checkpoints")  # the final checkpoint, written by both ranks
    assert (out / "checkpoints" / "average").is_dir() == bool(average)
    if average:  # the final evaluation scored the mean of the two epoch ends: model.pt is that model
        assert f"{evaluate_model(load_run_config(None, overrides), out / 'model.pt')['auc']:.4f}" == aucs[0]
