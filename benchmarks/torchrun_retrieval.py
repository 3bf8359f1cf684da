"""A two-tower on MovieLens-1M trained by torchrun on 2 gloo ranks against the same config in one process.

    python benchmarks/torchrun_retrieval.py [--quick] [--json PATH] [--ranks 2] [--seeds 0,1,2] [--float-order]

Both runs are `hugerec train configs/movielens_two_tower.toml` (the second under
`torch.distributed.run --nproc-per-node 2`), in this invocation, each with its own out_dir: the same
data, split, validation split and early stopping; under torchrun each rank trains its half of every
batch, the user and item tables row-wise sharded by the planner's plan (printed by rank 0; the record
`item table row-wise` is 1.0 when the plan says so). The figure is the test split's Recall@10 (each
user's last event, full ranking, training items excluded) of the two models, and their difference
(target: within 0.002). --quick: the first 1000 users and at most 3 epochs.

--seeds S0,S1,...: both runs once per `train.seed` (the initial weights, the batch order and the sampled
negatives), reporting the signed difference per seed, its mean and spread, beside the one-process runs'
seed-to-seed spread. --float-order: per seed also one process whose every batch has its rows in reverse
order (`reversed_rows`: the same examples, candidates, negatives and objective, summed in another order),
and its difference to the plain one-process run: how far this training's trajectory moves when nothing but
the floating-point summation order changes, the yardstick for the W-rank run's difference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "movielens_two_tower.toml"
DATA = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data"))


def record(config: str, method: str, value: float, unit: str, higher: bool = True) -> dict[str, Any]:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


# One process whose batches have their rows reversed: users, targets and each row's history in reverse row
# order. The objective is a mean over rows whose candidates are the batch's positives (by id: hits and
# histories masked by id, logQ by id) plus negatives drawn from the family's generator independently of the
# order, so only the order of the floating-point sums changes (the loss, the matmuls, each row's gradient).
REVERSED_ROWS = """
import sys
import torch
import hugerec.cli.task_commands as tc
from hugerec.cli import main
from hugerec.sparse.jagged import JaggedTensor

plain = tc.iter_examples

def reversed_rows(*args, **kwargs):
    for users, items, history in plain(*args, **kwargs):
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), history.lengths.to(torch.int64).cumsum(0)])
        values = [history.values[offsets[i] : offsets[i + 1]] for i in range(users.numel() - 1, -1, -1)]
        flipped = JaggedTensor(torch.cat(values) if values else history.values, history.lengths.flip(0))
        yield users.flip(0), items.flip(0), flipped

tc.iter_examples = reversed_rows
sys.exit(main(sys.argv[1:]))
"""


def train(out: Path, ranks: int, overrides: list[str], reversed_rows: bool = False) -> tuple[dict[str, float], str, float]:
    """(test metrics, stdout, seconds) of one `hugerec train` of the config, in one process or on `ranks` ranks
    (`reversed_rows`: one process, every batch's rows in reverse order)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue", "HUGEREC_DATA": str(DATA)}
    args = ["train", str(CONFIG), f"train.out_dir={out}", "train.progress=false", *overrides]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "hugerec", *args]
    elif reversed_rows:
        cmd = [sys.executable, "-c", REVERSED_ROWS, *args]
    else:
        cmd = [sys.executable, "-m", "hugerec", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"torchrun_retrieval: {' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    curve = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = " ".join(f"{r['recall@10']:.4f}" for r in curve if r["split"] == "eval")
    who = f"{ranks} ranks" if ranks > 1 else "one process, rows reversed" if reversed_rows else "one process"
    print(f"  {who}: validation recall@10 per epoch {valid}", flush=True)
    return json.loads((out / "metrics.json").read_text()), proc.stdout, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first 1000 users, at most 3 epochs")
    parser.add_argument("--json", help="write the records to this JSON file")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seeds", default="0", help="train.seed values, comma-separated (default: 0, the config's)")
    parser.add_argument("--float-order", action="store_true", help="also one process with every batch's rows reversed")
    args = parser.parse_args()
    if not (DATA / "movielens" / "ml-1m").is_dir():
        raise SystemExit(f"torchrun_retrieval: {DATA / 'movielens' / 'ml-1m'} not found; set HUGEREC_DATA")
    seeds = [int(s) for s in args.seeds.split(",")]
    size = "movielens-1m" + (" 1000 users" if args.quick else "")
    name = f"torchrun {args.ranks} gloo ranks two_tower {size}"
    ours = f"hugerec-torchrun-{args.ranks}"
    print(f"torchrun two-tower ({size}), seeds {seeds}, load {os.getloadavg()[0]:.1f}", flush=True)
    records: list[dict[str, Any]] = []
    ones, gaps, float_gaps = [], [], []
    for seed in seeds:
        overrides = ["interactions.max_users=1000", "train.epochs=3"] if args.quick else []
        overrides.append(f"train.seed={seed}")
        tag = "" if seeds == [0] else f" seed {seed}"
        with tempfile.TemporaryDirectory() as tmp:
            one, _, one_s = train(Path(tmp) / "one", 1, overrides)
            print(f"  seed {seed} one process: recall@10 {one['recall@10']:.4f} ndcg@10 {one['ndcg@10']:.4f} ({one_s:.0f} s)", flush=True)
            many, out, many_s = train(Path(tmp) / "ranks", args.ranks, overrides)
            print(f"  seed {seed} {args.ranks} gloo ranks: recall@10 {many['recall@10']:.4f} ndcg@10 {many['ndcg@10']:.4f} ({many_s:.0f} s)", flush=True)
            if args.float_order:
                flip, _, _ = train(Path(tmp) / "reversed", 1, overrides, reversed_rows=True)
                float_gaps.append(flip["recall@10"] - one["recall@10"])
                print(f"  seed {seed} one process, rows reversed: recall@10 {flip['recall@10']:.4f} ({float_gaps[-1]:+.4f})", flush=True)
                records.append(record(f"{name} recall@10{tag}", "one-process-reversed-rows", flip["recall@10"], "recall"))
        ones.append(one["recall@10"])
        gaps.append(many["recall@10"] - one["recall@10"])
        records += [
            record(f"{name} recall@10{tag}", ours, many["recall@10"], "recall"),
            record(f"{name} recall@10{tag}", "one-process", one["recall@10"], "recall"),
            record(f"{name} recall@10 difference{tag}", ours, abs(gaps[-1]), "recall", higher=False),
            record(f"{name} train wall time{tag}", ours, many_s, "s", higher=False),
            record(f"{name} train wall time{tag}", "one-process", one_s, "s", higher=False),
        ]
    plan = [line for line in out.splitlines() if re.match(r"^(table|user_id|item_id|history|-)", line)]
    print("  the plan (rank 0):\n    " + "\n    ".join(plan), flush=True)
    row_wise = any(re.match(r"^item_id\s*\|\s*row_wise", line) for line in plan)
    records.append(record(f"{name} item table row-wise", ours, 1.0 if row_wise else 0.0, "bool"))
    print(f"  {args.ranks} ranks - one process, recall@10 per seed: {' '.join(f'{g:+.4f}' for g in gaps)}", flush=True)
    if len(seeds) > 1:
        records += [
            record(f"{name} recall@10 difference mean over seeds", ours, float(np.mean(gaps)), "recall", higher=False),
            record(f"{name} recall@10 |difference| mean over seeds", ours, float(np.mean(np.abs(gaps))), "recall", higher=False),
            record(f"{name} recall@10 seed-to-seed std", "one-process", float(np.std(ones, ddof=1)), "recall", higher=False),
        ]
        print(
            f"  difference mean {np.mean(gaps):+.4f}, |difference| mean {np.mean(np.abs(gaps)):.4f}, max {np.max(np.abs(gaps)):.4f}; "
            f"one process seed to seed: std {np.std(ones, ddof=1):.4f}, range {np.max(ones) - np.min(ones):.4f}",
            flush=True,
        )
    if float_gaps:
        records.append(record(f"{name} recall@10 |reversed rows - one process| mean over seeds", "one-process-reversed-rows",
                              float(np.mean(np.abs(float_gaps))), "recall", higher=False))
        print(f"  one process with rows reversed - one process, per seed: {' '.join(f'{g:+.4f}' for g in float_gaps)}", flush=True)
    print(f"  item table row-wise: {row_wise}; target |difference| <= 0.002; load {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
