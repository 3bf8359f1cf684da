"""Runs of `fit` in fresh processes for the retrieval and sequential families: one process or W gloo ranks,
killed with SIGKILL at a chosen point (mid-epoch, mid-checkpoint, mid-evaluation) and resumed.

The worker script (FAMILY_SCRIPT) trains a small two-tower, SASRec (with BCE: "sasrec_bce"), a masked
transformer ("masked"), or HSTU with its ranking head's loss ("hstu_ranked") on deterministic synthetic data;
`kill_at` makes the process write a marker file and sleep at that point so that the test can kill it there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

FAMILY_SCRIPT = r'''
import os, sys, time
from pathlib import Path
import numpy as np
import torch
import hugerec.distributed.checkpoint_directory as directory
from hugerec.data.interactions import epoch_examples, full_ranking, held_out_csr, histories, iter_examples, last_items, leave_last_out
from hugerec.data.sessions import Sequences, last_n
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.distributed.launch import init_from_env
from hugerec.distributed.planner import Constraint, plan
from hugerec.distributed.shard import shard
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam
from hugerec.models.hstu import HSTU
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SequenceConfig
from hugerec.models.two_tower import TwoTower, TwoTowerConfig
from hugerec.training.early_stopping import EarlyStopping
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.retrieval import RetrievalFamily, RetrievalValidation
from hugerec.training.sequential import BCE, NextItemValidation, SequentialFamily, window_batches
from hugerec.training.trainer import TrainConfig, fit

out, kind, world, resume, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]
dropout, dense, average = float(sys.argv[6]), sys.argv[7], int(sys.argv[8])
rank = int(os.environ.get("RANK", "0"))
marker = Path(out + f".marker{rank}")
if world > 1:
    init_from_env("gloo")


def stop_here() -> None:
    marker.write_text("here")
    time.sleep(600)


def build():
    torch.manual_seed(0)
    if kind == "two_tower":
        return TwoTower(TwoTowerConfig(dim=8, embedding_dim=8, user_layers=(8,), max_history=6, recent=(1,)), NUM_USERS, NUM_ITEMS, Adam(lr=0.05))
    if kind == "masked":
        return MaskedTransformer(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8, num_layers=1, dropout=dropout), Adam(lr=0.05))
    if kind.startswith("hstu"):
        return HSTU(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8, num_layers=1, dropout=dropout), Adam(lr=0.05))
    return SASRec(SequenceConfig(num_items=NUM_ITEMS, max_len=6, dim=8, num_layers=1, dropout=dropout), Adam(lr=0.05))


if kind == "two_tower":
    synth = generate_interactions(InteractionConfig(num_users=48, num_items=30, rank=2, min_events=6, max_events=10, seed=0))
    NUM_USERS, NUM_ITEMS = synth.data.num_users, synth.data.num_items
    train, test = leave_last_out(synth.data)
    valid = RetrievalValidation(*full_ranking(train, test, 6))
    data = EpochBatches(*epoch_examples(train, 64, 6, rank=rank, world=world))
    family_args = (train.item_counts(), SampledSoftmax(num_negatives=8, mask_history=True))
    row_wise = ("user_id", "item_id")
else:
    NUM_USERS, NUM_ITEMS = 0, 30
    rng = np.random.default_rng(0)
    starts = rng.integers(1, NUM_ITEMS + 1, 90)
    items = ((starts[:, None] - 1 + np.arange(7)[None, :] + (rng.random((90, 7)) < 0.2)) % NUM_ITEMS + 1).reshape(-1)
    seqs = Sequences(np.arange(90), np.arange(0, 90 * 7 + 1, 7), items, np.zeros(90 * 7, np.int64))
    data = window_batches(last_n(seqs, 6 if kind == "masked" else 7), 16, seed=0, rank=rank, world=world)  # masked: max_len wide
    hist = last_n(seqs, 6)
    valid = NextItemValidation(hist[:30], items.reshape(90, 7)[:30, -1])
    counts = np.bincount(items, minlength=NUM_ITEMS + 1)
    loss = BCE() if kind == "sasrec_bce" else SampledSoftmax(Negatives.MIXED, num_negatives=8, alpha=0.5)
    family_args = (loss, counts)
    row_wise = ("item",)


class Hooked(SequentialFamily if kind != "two_tower" else RetrievalFamily):
    """The family with a stop in its evaluate, on the given call."""

    def evaluate(self, model, data, device, precision):
        Hooked.calls = getattr(Hooked, "calls", 0) + 1
        if kill_at == "eval" and Hooked.calls == 2:
            stop_here()
        return super().evaluate(model, data, device, precision)


if kill_at == "epoch":  # the 8th batch this process takes: between checkpoints, mid-epoch
    inner = data.make
    taken = [0]

    def slow(epoch):
        for batch in inner(epoch):
            taken[0] += 1
            if taken[0] == 8:
                stop_here()
            yield batch

    data.make = slow
if kill_at == "checkpoint":  # the rank file of step 9's checkpoint is written, its index is not
    checksum = directory._sha256

    def hooked(path):
        if path.parent.name.startswith(".step-0000000009"):
            stop_here()
        return checksum(path)

    directory._sha256 = hooked

model = build()
if world > 1:
    tables = [t for m in model.modules() if isinstance(m, EmbeddingCollection) for t in m.tables]
    pins = {t.name: Constraint("row_wise") for t in tables if t.name in row_wise}
    sharding = plan(tables, world, constraints=pins)
    model = shard(model, sharding)
cfg = TrainConfig(epochs=3, lr=0.01 if dense == "adam" else 0.1, optimizer=dense, eval_every=4, checkpoint_every=3, log_every=1, keep_checkpoints=0, out_dir=out,
                  resume=resume, seed=0, progress=False, tensorboard=False, plot=False,
                  early_stopping=EarlyStopping(patience=None), average_epochs=average)  # every run takes all 18 steps
extra = {"ranking_weight": 0.5, "ranking_negatives": 4} if kind == "hstu_ranked" else {}  # the ranking head's loss too
history = fit(model, data, valid, cfg, family=Hooked(*family_args, **extra))
if rank == 0:
    Path(out + ".done").write_text(str(history.steps))
'''


class FamilyRuns:
    """Launches FAMILY_SCRIPT runs under `root` and reads back what they wrote."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.script = root / "family_script.py"
        self.script.write_text(FAMILY_SCRIPT)

    def launch(
        self, out: str, kind: str, world: int = 1, resume: bool = False, kill_at: str = "none", dropout: float = 0.1, dense: str = "adam",
        average: int = 1,
    ) -> list[Any]:
        from hugerec.distributed.launch import free_port

        env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue"}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
        args = [sys.executable, str(self.script), str(self.root / out), kind, str(world), "1" if resume else "0", kill_at, str(dropout), dense, str(average)]
        ranks = [{"RANK": str(r), "LOCAL_RANK": str(r)} for r in range(world)] if world > 1 else [{}]
        return [subprocess.Popen(args, env=env | extra) for extra in ranks]

    def run(
        self, out: str, kind: str, world: int = 1, resume: bool = False, dropout: float = 0.1, dense: str = "adam", average: int = 1
    ) -> None:
        """dense: the dense optimizer, "adam" or "sgd" (Adam turns float noise in a zero gradient, as attention's
        key bias has, into full steps: comparing runs that differ in rounding needs sgd there); average: the
        run's average_epochs."""
        for p in self.launch(out, kind, world, resume, "none", dropout, dense, average):
            assert p.wait(timeout=300) == 0

    def kill(self, out: str, kind: str, kill_at: str, world: int = 1, average: int = 1) -> None:
        """Start a run that stops at `kill_at`, wait until every rank is there, SIGKILL them all."""
        procs = self.launch(out, kind, world, False, kill_at, average=average)
        markers = [self.root / f"{out}.marker{r}" for r in range(world)]
        deadline = time.monotonic() + 300
        while not any(m.is_file() for m in markers):
            assert time.monotonic() < deadline, f"{out}: never reached {kill_at}"
            assert all(p.poll() is None for p in procs), f"{out}: a rank exited before {kill_at}"
            time.sleep(0.05)
        time.sleep(0.3)  # the other ranks reach the point or block on the one that stopped
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()

    def final_weights(self, out: str, kind: str) -> dict[str, torch.Tensor]:
        """The run's last checkpoint read into one unsharded process."""
        from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint

        namespace: dict[str, Any] = {}
        head = FAMILY_SCRIPT.split("class Hooked")[0].replace("if world > 1:\n    init_from_env(\"gloo\")\n", "")
        sys_argv = sys.argv
        try:
            sys.argv = ["x", str(self.root / "unused"), kind, "1", "0", "none", "0.0", "adam", "1"]
            exec(compile(head, "family_script_head", "exec"), namespace)  # the test's own script
        finally:
            sys.argv = sys_argv
        model = namespace["build"]()
        path = latest_checkpoint(self.root / out / "checkpoints")
        assert path is not None
        load_checkpoint(path, model)
        return {k: v.clone() for k, v in model.state_dict().items()}

    def train_steps(self, out: str) -> list[int]:
        records = [json.loads(line) for line in (self.root / out / "metrics.jsonl").read_text().splitlines()]
        return [r["step"] for r in records if r["split"] == "train"]


@pytest.fixture
def family_runs(tmp_path: Path) -> FamilyRuns:
    return FamilyRuns(tmp_path)
