"""Hybrid-parallel training on torch.distributed (gloo, CPU): 2 processes against 1 on the same global batch.

    python benchmarks/sharding.py [--quick] [--json PATH]

Model: DLRM (13 dense features, bottom 64-32-16, top 64-32-1) over 8 tables of dim 16 with 10 to
200,000 rows (quick: 20,000), Adagrad; features 0-5 one id per example, 6-7 three. Ids uniform.
Global batch 8192 (quick: 2048): each of the 2 ranks trains on its half, the single process on all.

Per sharding kind (all tables data-parallel, table-wise, row-wise, column-wise, and the planner's
choice, with and without `prefetching`) it reports:
    step time      median ms per training step (forward, backward, sparse and dense updates), slowest rank,
                   against one process on the whole global batch with 1 thread and with 2 threads
                   (2 x 1 thread vs 1 x 1: scaling; vs 1 x 2: the same 2 cores; ratio < 1: faster)
    bytes sent     embedding all_to_all bytes a rank sent to the other per step (measured by
                   ShardedEmbeddingCollection.stats), against `estimate_bytes_sent` (must be within 25%);
                   the dense all-reduce payload (DDP buckets) is listed beside it
    comm share     the share of the steps' time a rank spent inside embedding all_to_alls
Timings come from 2 shared CPU cores; both methods run in the same invocation, with Numba's
workqueue threading layer (see below).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

# Numba's default OpenMP threading layer shares libgomp with torch: after a parallel Numba kernel its
# spinning threads make torch's own CPU ops (index_add_, linear, ...) up to 1000x slower on a busy
# machine. The workqueue layer does not; both methods below run under it (set before Numba loads).
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import numba
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from hugerec.distributed.launch import spawn
from hugerec.distributed.planner import Workload, estimate_bytes_sent, plan
from hugerec.distributed.shard import ShardedModel, prefetching, shard, sharded_collections
from hugerec.distributed.sharding_plan import ShardingPlan, TablePlacement
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures

WORLD = 2
DIM = 16
HOTNESS = (1, 1, 1, 1, 1, 1, 3, 3)


def tables(quick: bool) -> list[TableConfig]:
    rows: tuple[int, ...] = (200_000, 100_000, 50_000, 20_000, 5_000, 1_000, 100, 10)
    if quick:
        rows = tuple(min(r, 20_000) for r in rows)
    return [TableConfig(f"t{i}", r, DIM, features=(f"f{i}",)) for i, r in enumerate(rows)]


def make_batches(tabs: list[TableConfig], size: int, n: int, seed: int) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        jag = {}
        for t, hot in zip(tabs, HOTNESS, strict=True):
            ids = torch.randint(0, t.num_rows, (size * hot,), generator=g)
            jag[t.features[0]] = ids.view(size, hot)
        sf = SparseFeatures.from_dense(jag)
        out.append(Batch(torch.randn(size, 13, generator=g), sf, torch.randint(0, 2, (size,), generator=g).float()))
    return out


def split(batch: Batch, rank: int) -> Batch:
    per = batch.batch_size // WORLD
    keep = slice(rank * per, (rank + 1) * per)
    jag = {k: batch.sparse[k].to_padded()[keep] for k in batch.sparse.keys}  # fixed hotness: no padding
    return Batch(batch.dense[keep], SparseFeatures.from_dense(jag), batch.labels[keep])


def model(tabs: list[TableConfig]) -> DLRM:
    torch.manual_seed(0)
    return DLRM(EmbeddingCollection(tabs, Adagrad(lr=0.05)), num_dense=13, bottom=[64, 32, DIM], top=[64, 32, 1])


def train_steps(m: nn.Module, batches: Any, opt: torch.optim.Optimizer) -> list[float]:
    """Seconds of each step, from the end of the previous one (fetching the batch included)."""
    times = []
    last = time.perf_counter()
    for b in batches:
        loss = nn.functional.binary_cross_entropy_with_logits(m(b), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times


def plans(tabs: list[TableConfig], per_rank: int) -> dict[str, ShardingPlan]:
    load = Workload(per_rank, {f"f{i}": float(h) for i, h in enumerate(HOTNESS)})
    every = {
        "data_parallel": {t.name: TablePlacement.data_parallel(WORLD) for t in tabs},
        "table_wise": {t.name: TablePlacement.table_wise(i % WORLD) for i, t in enumerate(tabs)},
        "row_wise": {t.name: TablePlacement.row_wise(range(WORLD)) for t in tabs},
        "column_wise": {t.name: TablePlacement.column_wise(range(WORLD)) for t in tabs},
    }
    out = {k: ShardingPlan(tuple(tabs), v, WORLD, optimizer=Adagrad()) for k, v in every.items()}
    out["planner"] = plan(tabs, WORLD, load=load, optimizer=Adagrad())
    return out


def _worker(
    rank: int, world: int, quick: bool, runs: list[tuple[str, bool]], steps: int, size: int
) -> list[dict[str, float]]:
    """Every (plan, prefetch) run in these two processes, one after the other."""
    numba.set_num_threads(1)
    tabs = tables(quick)
    batches = [split(b, rank) for b in make_batches(tabs, size, steps + 2, seed=1)]
    out = []
    for plan_json, use_prefetch in runs:
        m = shard(model(tabs), ShardingPlan.from_json(plan_json))
        assert isinstance(m, ShardedModel)  # the model has dense parameters, so shard wraps it in DDP
        dense_bytes = [0]

        def count(state, bucket, dense_bytes=dense_bytes):  # type: ignore[no-untyped-def]  # DDP checks real annotations
            dense_bytes[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            return allreduce_hook(state, bucket)

        m.register_comm_hook(None, count)
        opt = torch.optim.Adam(m.dense_parameters(), lr=1e-3)
        train_steps(m, batches[:2], opt)  # warm-up
        (emb,) = sharded_collections(m)
        emb.stats.reset()
        dense_bytes[0] = 0
        dist.barrier()
        timed = batches[2:]
        times = train_steps(m, prefetching(m, timed) if use_prefetch else timed, opt)
        out.append(
            {
                "step_s": statistics.median(times),  # the median: other jobs share these cores
                "bytes": emb.stats.bytes_sent / steps,
                "comm_share": emb.stats.seconds / sum(times),
                "dense_bytes": dense_bytes[0] / steps,
            }
        )
    return out


def single(quick: bool, steps: int, size: int, threads: int) -> float:
    torch.set_num_threads(threads)
    numba.set_num_threads(threads)
    tabs = tables(quick)
    batches = make_batches(tabs, size, steps + 2, seed=1)
    m = model(tabs)
    opt = torch.optim.Adam(m.dense_parameters(), lr=1e-3)
    train_steps(m, batches[:2], opt)
    return statistics.median(train_steps(m, batches[2:], opt))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller tables and batch, fewer steps (< 1 minute)")
    ap.add_argument("--json", help="write the records to this path")
    args = ap.parse_args()
    quick = bool(args.quick)
    size, steps = (2048, 7) if quick else (8192, 15)
    tabs = tables(quick)
    per_rank = size // WORLD
    the_plans = plans(tabs, per_rank)
    load = Workload(per_rank, {f"f{i}": float(h) for i, h in enumerate(HOTNESS)})
    bases = {threads: single(quick, steps, size, threads) for threads in (1, 2)}
    records: list[dict[str, Any]] = []
    config_base = f"dlrm-8x{DIM}/batch{size}"
    rows = []
    runs = [(k, p, False) for k, p in the_plans.items()]
    runs.append(("planner", the_plans["planner"], True))
    results = spawn(WORLD, _worker, quick, [(p.to_json(), pre) for _, p, pre in runs], steps, size)
    for i, (kind, p, use_prefetch) in enumerate(runs):
        name = kind + ("+prefetch" if use_prefetch else "")
        got = [r[i] for r in results]
        step = max(g["step_s"] for g in got)
        measured = [g["bytes"] for g in got]
        estimate = estimate_bytes_sent(p, load)
        share = max(g["comm_share"] for g in got)
        config = f"{config_base}/{name}"
        records += [
            {
                "config": config,
                "method": "hugerec-2proc-gloo",
                "value": step * 1e3,
                "unit": "ms/step",
                "higher_is_better": False,
            },
            *(
                {
                    "config": config,
                    "method": f"single-process-{threads}-thread",
                    "value": base * 1e3,
                    "unit": "ms/step",
                    "higher_is_better": False,
                }
                for threads, base in bases.items()
            ),
            {
                "config": config,
                "method": "hugerec-bytes-measured",
                "value": max(measured),
                "unit": "bytes/step/rank",
                "higher_is_better": False,
                "per_rank": measured,
            },
            {
                "config": config,
                "method": "planner-estimate",
                "value": max(estimate),
                "unit": "bytes/step/rank",
                "higher_is_better": False,
                "per_rank": estimate,
            },
            {
                "config": config,
                "method": "hugerec-comm-share",
                "value": share,
                "unit": "fraction of step",
                "higher_is_better": False,
            },
            {
                "config": config,
                "method": "ddp-dense-allreduce-payload",
                "value": got[0]["dense_bytes"],
                "unit": "bytes/step/rank",
                "higher_is_better": False,
            },
        ]
        worst = max(abs(m - e) / e for m, e in zip(measured, estimate, strict=True))
        rows.append(
            (name, step * 1e3, bases[1] * 1e3, bases[2] * 1e3, measured, estimate, worst, share, got[0]["dense_bytes"])
        )
    print(
        f"{'config':<18} {'2x1 thr ms':>10} {'1x1 thr ms':>10} {'ratio':>6} {'1x2 thr ms':>10} {'ratio':>6}  "
        f"{'sent/rank (measured)':>22} "
        f"{'planner estimate':>24} {'err':>6} {'comm':>6} {'dense allreduce':>16}"
    )
    for name, s2, s1, s1x2, meas, est, err, share, dense in rows:
        ms = "/".join(f"{x / 1e6:.2f}" for x in meas) + " MB"
        es = "/".join(f"{x / 1e6:.2f}" for x in est) + " MB"
        print(
            f"{name:<18} {s2:>10.1f} {s1:>10.1f} {s2 / s1:>6.2f} {s1x2:>10.1f} {s2 / s1x2:>6.2f}  {ms:>22} {es:>24} "
            f"{err:>6.1%} {share:>6.1%} "
            f"{dense / 1e6:>13.3f} MB"
        )
    chosen = the_plans["planner"].placements
    print("planner:", ", ".join(f"{t.name} ({t.num_rows} rows)={chosen[t.name].kind.value}" for t in tabs))
    bad = [r[0] for r in rows if r[6] > 0.25]
    print("bytes within 25% of the planner's estimate:", "yes" if not bad else f"NO for {bad}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
