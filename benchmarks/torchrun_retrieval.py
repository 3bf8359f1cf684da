"""A two-tower on MovieLens-1M trained by torchrun on 2 gloo ranks against the same config in one process.

    python benchmarks/torchrun_retrieval.py [--quick] [--json PATH] [--ranks 2]

Both runs are `hugerec train configs/movielens_two_tower.toml` (the second under
`torch.distributed.run --nproc-per-node 2`), in this invocation, each with its own out_dir: the same
data, split, validation split and early stopping; under torchrun each rank trains its half of every
batch, the user and item tables row-wise sharded by the planner's plan (printed by rank 0; the record
`item table row-wise` is 1.0 when the plan says so). The figure is the test split's Recall@10 (each
user's last event, full ranking, training items excluded) of the two models, and their difference
(target: within 0.002). --quick: the first 1000 users and at most 3 epochs.
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

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "movielens_two_tower.toml"
DATA = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data"))


def record(config: str, method: str, value: float, unit: str, higher: bool = True) -> dict[str, Any]:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


def train(out: Path, ranks: int, overrides: list[str]) -> tuple[dict[str, float], str, float]:
    """(test metrics, stdout, seconds) of one `hugerec train` of the config, in one process or on `ranks` ranks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_THREADING_LAYER": "workqueue", "HUGEREC_DATA": str(DATA)}
    args = ["train", str(CONFIG), f"train.out_dir={out}", "train.progress=false", *overrides]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "hugerec", *args]
    else:
        cmd = [sys.executable, "-m", "hugerec", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"torchrun_retrieval: {' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    curve = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    valid = " ".join(f"{r['recall@10']:.4f}" for r in curve if r["split"] == "eval")
    print(f"  {'one process' if ranks == 1 else f'{ranks} ranks'}: validation recall@10 per epoch {valid}", flush=True)
    return json.loads((out / "metrics.json").read_text()), proc.stdout, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first 1000 users, at most 3 epochs")
    parser.add_argument("--json", help="write the records to this JSON file")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    if not (DATA / "movielens" / "ml-1m").is_dir():
        raise SystemExit(f"torchrun_retrieval: {DATA / 'movielens' / 'ml-1m'} not found; set HUGEREC_DATA")
    overrides = ["interactions.max_users=1000", "train.epochs=3"] if args.quick else []
    size = "movielens-1m" + (" 1000 users" if args.quick else "")
    print(f"torchrun two-tower ({size}), load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        one, _, one_s = train(Path(tmp) / "one", 1, overrides)
        print(f"  one process: recall@10 {one['recall@10']:.4f} ndcg@10 {one['ndcg@10']:.4f} ({one_s:.0f} s)", flush=True)
        many, out, many_s = train(Path(tmp) / "ranks", args.ranks, overrides)
        print(f"  {args.ranks} gloo ranks: recall@10 {many['recall@10']:.4f} ndcg@10 {many['ndcg@10']:.4f} ({many_s:.0f} s)", flush=True)
    plan = [line for line in out.splitlines() if re.match(r"^(table|user_id|item_id|history|-)", line)]
    print("  the plan (rank 0):\n    " + "\n    ".join(plan), flush=True)
    row_wise = any(re.match(r"^item_id\s*\|\s*row_wise", line) for line in plan)
    diff = abs(many["recall@10"] - one["recall@10"])
    print(f"  |recall@10 difference| {diff:.4f} (target <= 0.002); item table row-wise: {row_wise}; load {os.getloadavg()[0]:.1f}", flush=True)
    name = f"torchrun {args.ranks} gloo ranks two_tower {size}"
    ours = f"hugerec-torchrun-{args.ranks}"
    records = [
        record(f"{name} recall@10", ours, many["recall@10"], "recall"),
        record(f"{name} recall@10", "one-process", one["recall@10"], "recall"),
        record(f"{name} recall@10 difference", ours, diff, "recall", higher=False),
        record(f"{name} item table row-wise", ours, 1.0 if row_wise else 0.0, "bool"),
        record(f"{name} train wall time", ours, many_s, "s", higher=False),
        record(f"{name} train wall time", "one-process", one_s, "s", higher=False),
    ]
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
