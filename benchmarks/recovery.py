"""Crash recovery: a disk-tier run killed with SIGKILL and resumed, and the loop's embedded server restarted.

    python benchmarks/recovery.py [--quick] [--json PATH]

`resume disk_tier`: a ranking model with a disk-tier table (a 10-row cache over 4,096 rows, so every step
evicts and writes rows back; an in-memory table beside it) trained by `fit` with a checkpoint every 8 steps,
once without interruption, then three times killed with SIGKILL in a child process and resumed with
fit(resume=True): in the forward of a step (`mid-step`), half-way through cloning the table file for a
checkpoint (`mid-snapshot`), and after a checkpoint's write-back but before the file is marked clean
(`mid-write-back`). Each record is the fraction of the tensors (dense weights, every table row and its
optimizer state) equal to the uninterrupted run's bit for bit: 1.0 = identical; `uninterrupted` is the
reference side (1.0 by definition).

`embedded server restart`: `hugerec loop` (configs/loop_synthetic.toml, shrunk) runs two windows, which
leaves a stable version and a canary; then the seconds a new embedded server takes to serve the stable and
the canary at its share again (`hugerec restore`, replaying the published bundle and version delta), beside
the seconds an empty server takes to start (`empty start`, what a restart gave before), and whether the
restored roles equal the decision log's (1.0 = stable, canary and share equal).

--quick: 40 steps instead of 120 (the loop part is the same size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POINTS = ("mid-step", "mid-snapshot", "mid-write-back")
ROWS = 4096


def record(config: str, method: str, value: float, unit: str, higher: bool = True) -> dict[str, Any]:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


# -- resume disk_tier -------------------------------------------------------------------------------------
def train(run: Path, steps: int, resume: bool) -> dict[str, Any]:
    """fit() a disk-tier model for `steps` steps (checkpoint every 8) in `run`; its final tensors."""
    import torch

    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.optimizers import Adagrad
    from hugerec.embedding.table_config import TableConfig
    from hugerec.sparse.batch import Batch
    from hugerec.sparse.features import SparseFeatures
    from hugerec.training.trainer import TrainConfig, fit

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            user = TableConfig("user", num_rows=ROWS, dim=8, storage="disk", cache_rows=10, path=str(run / "user.rows"))  # type: ignore[arg-type]
            item = TableConfig("item", num_rows=100, dim=8)
            self.emb = EmbeddingCollection([user, item], optimizer=Adagrad(lr=0.2))
            self.out = torch.nn.Linear(16, 1)

        def forward(self, batch: Batch) -> torch.Tensor:
            return self.out(self.emb(batch.sparse).values).squeeze(1)  # [B, 16] -> [B]

    g = torch.Generator().manual_seed(3)
    data = []
    for _ in range(steps):
        users, items = torch.randint(0, ROWS, (4,), generator=g), torch.randint(0, 100, (4,), generator=g)
        sparse = SparseFeatures.from_dense({"user": users, "item": items})
        data.append(Batch(torch.zeros(4, 0), sparse, (torch.rand(4, generator=g) < 0.5).float()))
    model = Model()
    cfg = TrainConfig(
        lr=0.01, checkpoint_every=8, out_dir=str(run), resume=resume, progress=False, tensorboard=False, plot=False
    )
    fit(model, data, None, cfg)
    weights, state = model.emb.read_rows("user", torch.arange(ROWS))
    item, item_state = model.emb.read_rows("item", torch.arange(100))
    return {"out": model.out.weight.detach().clone(), "user": weights, "item": item,
            **{f"user.{k}": v for k, v in state.items()}, **{f"item.{k}": v for k, v in item_state.items()}}  # fmt: skip


def worker(run: Path, point: str, steps: int) -> None:
    """Train in `run` and SIGKILL this process at `point` (see the module doc)."""
    import hugerec.embedding.disk as disk

    calls = [0]

    def die_at(n: int) -> None:
        calls[0] += 1
        if calls[0] == n:
            os.kill(os.getpid(), signal.SIGKILL)

    match point:
        case "mid-step":
            prepare = disk.DiskTier.prepare

            def killing_prepare(self: Any, *args: Any) -> Any:
                out = prepare(self, *args)
                die_at(steps // 2)
                return out

            disk.DiskTier.prepare = killing_prepare  # type: ignore[method-assign,assignment]
        case "mid-snapshot":
            clone = disk._clone

            def killing_clone(source: Path, target: Path) -> None:
                calls[0] += 1
                if calls[0] == 2:
                    with open(source, "rb") as src, open(target, "wb") as dst:
                        dst.write(src.read(os.path.getsize(source) // 2))
                    os.kill(os.getpid(), signal.SIGKILL)
                clone(source, target)

            disk._clone = killing_clone
        case _:
            flush = disk.row_cache.flush

            def killing_flush(*args: Any) -> int:
                written = flush(*args)
                die_at(4)  # the first flush of the 2nd checkpoint (each checkpoint's state_dict() flushes 3 times)
                return int(written)

            disk.row_cache.flush = killing_flush  # type: ignore[assignment]  # a plain function in place of the Numba dispatcher
    train(run, steps, resume=False)
    raise SystemExit(f"recovery: the worker was not killed at {point}")


def resume_disk_tier(steps: int, tmp: Path) -> list[dict[str, Any]]:
    (tmp / "whole").mkdir()
    whole = train(tmp / "whole", steps, resume=False)
    out = []
    for point in POINTS:
        run = tmp / point
        run.mkdir()
        proc = subprocess.run(
            [sys.executable, __file__, "--worker", str(run), point, str(steps)], capture_output=True, text=True
        )
        if proc.returncode != -signal.SIGKILL:
            raise SystemExit(f"recovery: worker {point} ended with {proc.returncode}: {proc.stderr[-500:]}")
        resumed = train(run, steps, resume=True)
        import torch

        same = sum(torch.equal(resumed[k], v) for k, v in whole.items()) / len(whole)
        out.append(
            record(f"resume disk_tier {point}", "hugerec fit resume=True", same, "fraction of tensors bitwise equal")
        )
    out.append(record("resume disk_tier", "uninterrupted", 1.0, "fraction of tensors bitwise equal"))
    return out


# -- embedded server restart ----------------------------------------------------------------------------------
SHRINK = [
    "data.stream.days=3",
    "data.stream.rows_per_day=3000",
    "data.stream.vocabulary=300",
    "data.stream.concept_drift_day=none",
    "data.stream.feature_shift_day=none",
    "embedding.capacity=3000",
    "server.replay_rows=300",
    "decisions.min_feedback=50",
    "gate.calibration_low=0.1",
    "gate.calibration_high=10",
]


def restart(tmp: Path) -> list[dict[str, Any]]:
    from hugerec.cli import main
    from hugerec.cli.loop_command import LoopFile, _make_loop, load_loop_file, loop_config
    from hugerec.continuous.decision_log import live_roles
    from hugerec.continuous.server_restore import restore_server
    from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig

    before = os.getcwd()
    os.chdir(tmp)
    try:
        assert main(["loop", "configs/loop_synthetic.toml", *SHRINK]) == 0
        cfg, _ = load_loop_file("configs/loop_synthetic.toml", SHRINK)
        assert isinstance(cfg, LoopFile)  # loop_synthetic.toml is a ranking loop
        config = loop_config(cfg)
        started = time.perf_counter()
        with ExitStack() as stack:
            srv = InferenceServer(ServerConfig(admin_token="x" * 16, seed=0))
            stack.callback(srv.close)
            stack.enter_context(BackgroundServer(srv))
            empty = time.perf_counter() - started
        started = time.perf_counter()
        with ExitStack() as stack:
            loop, _, _ = _make_loop(cfg, config, lambda k: None, stack)
            live = restore_server(loop)
            seconds = time.perf_counter() - started
            assert loop.publisher is not None
            status = loop.publisher.status() or {}
        log = live_roles(loop.log.records, config.canary_share)
    finally:
        os.chdir(before)
    same = float(
        (status.get("stable"), status.get("canary"), status.get("canary_share")) == (log.stable, log.canary, log.share)
    )
    return [
        record("embedded server restart", "hugerec restore", seconds, "s to serve stable + canary", higher=False),
        record("embedded server restart", "empty start", empty, "s to serve nothing", higher=False),
        record("embedded server restart roles", "hugerec restore", same, "1 = stable, canary, share as logged"),
        record(
            "embedded server restart roles",
            "empty start",
            float(live.stable is None),
            "1 = stable, canary, share as logged",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 training steps instead of 120")
    parser.add_argument("--json", help="write the records to this JSON file")
    parser.add_argument("--worker", nargs=3, metavar=("RUN", "POINT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.worker[1], int(args.worker[2]))
        return
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-recovery-"))
    try:
        (tmp / "disk").mkdir()
        (tmp / "loop").mkdir()
        records = resume_disk_tier(40 if args.quick else 120, tmp / "disk") + restart(tmp / "loop")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load = os.getloadavg()[0]
    for r in records:
        print(f"{r['config']:<36} {r['method']:<24} {r['value']:>10.4g} {r['unit']}")
    print(f"load average (1 min): {load:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
