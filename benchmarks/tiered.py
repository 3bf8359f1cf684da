"""Disk-tier tables against in-memory tables: training-step throughput of the embeddings, and the cache's hit rate.

    26 tables x R rows, dim 64, RowWiseAdagrad, one id per table per example, batch B
    ids   zipf: Zipf(1.05) ranks over the R rows (hot rows scattered by a random permutation per table)
          uniform: uniform over the R rows
    cache 10% of each table's rows (cache_rows = R / 10)

Methods (each step: pooled lookup of the 26 features, a loss on it, the fused backward):

    in-memory            the same EmbeddingCollection with storage = memory
    hugerec-disk         storage = disk, batch i + 1's rows prefetched by hugerec.training.pipeline while step i runs
    hugerec-no-pipeline  storage = disk, rows mapped to cache slots inside the step

Methods take their steps in turn so a shared machine slows them alike; the ratio is what to read.
The tables' files are small enough here to sit in the page cache: "disk" reads are copies from the
kernel's cache, not device reads (the `larger than memory` case is the one that reads the device).

Also `record store`: reading 20k random 260-byte records (a row and its row-wise state) from a
memory-mapped file with the cache's kernel against rocksdict's batched get (the store TorchRec's SSD
tables use), the measurement behind the disk tier's choice of file.

`larger than memory` (--large, not in --quick, not in CI): 26 tables of dim 64 with Adagrad state,
>= 32 GB of rows + state on disk (skipped with a message when the disk lacks the space), trained for
a fixed number of steps with a 1 GB cache; peak RSS and throughput reported.

    python benchmarks/tiered.py --quick                  # < 1 minute
    python benchmarks/tiered.py --json out.json          # R = 100,000, B = 4096
    python benchmarks/tiered.py --large --dir /mnt/ssd   # needs ~40 GB free in --dir
    python benchmarks/tiered.py --large-only             # only that case
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adagrad, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import TableConfig
from hugerec.ops import row_cache
from hugerec.sparse.batch import Batch
from hugerec.sparse.features import SparseFeatures
from hugerec.training.pipeline import Pipeline

TABLES, DIM = 26, 64


def ids(kind: str, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """[n] int64 row ids of one table."""
    if kind == "uniform":
        return rng.integers(0, rows, n)
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -1.05)
    ranks = np.searchsorted(cdf, rng.random(n) * cdf[-1])
    return rng.permutation(rows)[ranks].astype(np.int64)


def make_batches(kind: str, rows: int, batch: int, steps: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    cols = [ids(kind, rows, batch * steps, rng) for _ in range(TABLES)]
    out = []
    for s in range(steps):
        sparse = SparseFeatures.from_dense(
            {f"t{t}": torch.from_numpy(cols[t][s * batch : (s + 1) * batch]) for t in range(TABLES)}
        )
        out.append(Batch(torch.empty(batch, 0), sparse, torch.zeros(batch)))
    return out


class Model(nn.Module):
    """The 26 pooled lookups, and a loss that gives every output a gradient."""

    def __init__(self, tables: list[TableConfig], opt: Optimizer) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = EmbeddingCollection(tables, optimizer=opt)
        self.w = torch.linspace(-1, 1, TABLES * DIM)

    def step(self, batch: Batch) -> None:
        pooled = self.emb(batch.sparse).values  # [B, 26 * 64]
        (pooled * self.w).square().mean().backward()


def tables(rows: int, disk: Path | None, cache: int) -> list[TableConfig]:
    extra: dict[str, Any] = {}
    out = []
    for t in range(TABLES):
        if disk is not None:
            extra = {"storage": "disk", "cache_rows": cache, "path": str(disk / f"t{t}.rows")}
        out.append(TableConfig(f"t{t}", num_rows=rows, dim=DIM, **extra))
    return out


def block(model: Model, data: list[Batch], pipeline: bool) -> float:
    """Seconds for the steps of `data`; with the pipeline its first prepare is not hidden (a fresh one per block)."""
    t0 = time.perf_counter()
    for b in Pipeline(model, torch.device("cpu"))(data) if pipeline else data:
        model.step(b)
    return time.perf_counter() - t0


def run_ids(kind: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows, batch, k = args.rows, args.batch_size, args.block
    cache = max(1, int(rows * args.cache))
    data = make_batches(kind, rows, batch, args.warmup + args.steps)
    names = ["in-memory", "hugerec-disk", "hugerec-no-pipeline"]
    models = {}
    for name in names:
        d = None if name == "in-memory" else tmp / f"{kind}-{name}"
        if d is not None:
            d.mkdir()
        models[name] = Model(tables(rows, d, cache), RowWiseAdagrad(lr=0.01))
    for n in names:  # warm-up: the caches fill, the kernels compile
        block(models[n], data[: args.warmup], n == "hugerec-disk")
    before = models["hugerec-disk"].emb.disk_stats()
    seconds = dict.fromkeys(names, 0.0)
    for start in range(args.warmup, args.warmup + args.steps, k):  # blocks of k steps, methods in turn
        for n in names:
            seconds[n] += block(models[n], data[start : start + k], n == "hugerec-disk")
    after = models["hugerec-disk"].emb.disk_stats()
    rates = {n: args.steps / seconds[n] for n in names}
    delta = {key: after[key] - before[key] for key in after}
    hit = delta["hits"] / max(delta["hits"] + delta["misses"], 1)
    config = f"tiered {kind} cache {args.cache:g}"
    print(f"\n{config}: {TABLES} tables x {rows:,} rows, dim {DIM}, batch {batch}, cache {cache:,} rows per table")
    for n in names:
        print(f"  {n:22s} {rates[n]:8.2f} steps/s   {rates[n] / rates['in-memory']:.2f}x in-memory")
    print(
        f"  hugerec-disk: hit rate {hit:.3f}, rows read {delta['rows_read'] / args.steps:,.0f} and written "
        f"{delta['rows_written'] / args.steps:,.0f} per step, prefetch {1000 * delta['prepare_s'] / args.steps:.1f} ms per step"
    )
    records = [
        {"config": config, "method": n, "value": rates[n], "unit": "steps/s", "higher_is_better": True} for n in names
    ]
    records.append(
        {"config": config, "method": "hugerec-disk hit rate", "value": hit, "unit": "share", "higher_is_better": True}
    )
    return records


def record_store(tmp: Path, rows: int = 200_000, reads: int = 20_000, record: int = 260) -> list[dict[str, Any]]:
    """Random record reads: memory-mapped file + the cache kernel vs rocksdict's batched get."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, size=(rows, record), dtype=np.uint8)
    path = tmp / "records.bin"
    mm = np.memmap(path, dtype=np.uint8, mode="w+", shape=(rows, record))
    mm[:] = data
    mm.flush()
    want = rng.integers(0, rows, reads)
    slots = reads
    wcache = np.zeros((slots, record - 4), dtype=np.uint8)
    scache = np.zeros((slots, 4), dtype=np.uint8)
    times: dict[str, list[float]] = {"hugerec-mmap": [], "rocksdict": []}
    try:
        from rocksdict import Rdict
    except ImportError:
        print("\nrecord store: rocksdict not installed, skipped")
        return []
    db = Rdict(str(tmp / "records.rocks"))
    for start in range(0, rows, 10_000):
        for r in range(start, min(rows, start + 10_000)):
            db[r.to_bytes(8, "big")] = data[r].tobytes()
    db.flush()
    keys = [int(r).to_bytes(8, "big") for r in want]
    for _ in range(5):
        slot_of_row = np.full(rows, -1, dtype=np.int32)
        row_of_slot = np.full(slots, -1, dtype=np.int64)
        prev = np.arange(-1, slots - 1, dtype=np.int32)
        nxt = np.arange(1, slots + 1, dtype=np.int32)
        nxt[-1] = -1
        stamp = np.full(slots, -(1 << 40), dtype=np.int64)
        state = np.array([0, slots - 1, 0], dtype=np.int64)
        out = np.empty(reads, dtype=np.int64)
        counters = np.zeros(4, dtype=np.int64)
        dirty = np.zeros(slots, dtype=np.uint8)
        t0 = time.perf_counter()
        row_cache.prepare(want, False, False, 2, slot_of_row, row_of_slot, prev, nxt, stamp, dirty, state, mm, wcache, scache, out, counters)  # fmt: skip
        times["hugerec-mmap"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        got = cast(list[bytes], db[cast(Any, keys)])  # a multi-get: rocksdict's stub types the list's items loosely
        block = np.frombuffer(b"".join(got), dtype=np.uint8).reshape(reads, record)
        times["rocksdict"].append(time.perf_counter() - t0)
        assert np.array_equal(block, data[want])
    db.close()
    Rdict.destroy(str(tmp / "records.rocks"))
    best = {k: min(v) for k, v in times.items()}
    config = f"record store {reads} random reads of {record} B"
    print(f"\n{config} (from {rows:,} records, page cache warm):")
    for k, v in best.items():
        print(f"  {k:14s} {1000 * v:8.2f} ms   {v / best['hugerec-mmap']:.1f}x hugerec-mmap")
    return [
        {"config": config, "method": k, "value": 1000 * v, "unit": "ms", "higher_is_better": False}
        for k, v in best.items()
    ]


def larger_than_memory(args: argparse.Namespace) -> list[dict[str, Any]]:
    """>= 32 GB of rows + Adagrad state on disk, a 1 GB cache; throughput and peak RSS."""
    rows = args.large_rows  # 2.5M (default) x 26 tables x (256 + 256) bytes = 33.3 GB
    record = 2 * DIM * 4
    need = TABLES * rows * record
    d = Path(args.dir or tempfile.gettempdir()) / "hugerec-larger-than-memory"
    free = shutil.disk_usage(d.parent).free
    if free < need * 1.1:
        print(
            f"\nlarger than memory: skipped, {d.parent} has {free / 1e9:.1f} GB free, needs {need * 1.1 / 1e9:.1f} GB"
        )
        return []
    d.mkdir(exist_ok=True)
    cache = (1 << 30) // (TABLES * record)
    try:
        model = Model(tables(rows, d, cache), Adagrad(lr=0.01))
        data = make_batches("zipf", rows, args.batch_size, args.large_steps)  # every step a new batch
        pipe = Pipeline(model, torch.device("cpu"))
        steps = 0
        sampler = _RssSampler()
        t0 = time.perf_counter()
        for b in pipe(data):
            model.step(b)
            steps += 1
        rate = steps / (time.perf_counter() - t0)
        sampler.stop()
        rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # peak RSS, file-backed pages included
        hits = model.emb.disk_stats()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    hit = hits["hits"] / max(hits["hits"] + hits["misses"], 1)
    print(
        f"\nlarger than memory: {need / 1e9:.1f} GB on disk, cache 1 GB, {steps} steps of {args.batch_size}: "
        f"{rate:.2f} steps/s, hit rate {hit:.3f} (the cache starts cold), peak RSS {rss_gb:.2f} GB (bound: cache + 2 GB "
        f"= 3 GB); sampled every 0.1 s while training: peak anonymous {sampler.peak['RssAnon'] / 1e6:.2f} GB, "
        f"peak file pages {sampler.peak['RssFile'] / 1e6:.2f} GB"
    )
    return [
        {"config": "larger than memory", "method": "hugerec-disk", "value": rate, "unit": "steps/s", "higher_is_better": True},
        {"config": "larger than memory", "method": "hugerec-disk peak RSS", "value": rss_gb, "unit": "GB", "higher_is_better": False},
    ]  # fmt: skip


class _RssSampler:
    """Peak RssAnon and RssFile of this process, sampled every 0.1 s by a thread until `stop`."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0.0, "RssFile": 0.0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(0.1):
            for k, v in _rss_now().items():
                self.peak[k] = max(self.peak[k], v)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def _rss_now() -> dict[str, float]:
    """RssAnon and RssFile of this process now, in kB (/proc/self/status; zeros where it does not exist)."""
    out = {"RssAnon": 0.0, "RssFile": 0.0}
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] = float(value.split()[0])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="R = 20,000, B = 1024, 3 + 10 steps")
    p.add_argument("--ids", choices=["zipf", "uniform", "all"], default="all")
    p.add_argument("--rows", type=int, default=None, help="rows per table (default 100,000)")
    p.add_argument("--batch-size", type=int, default=None, help="default 4096")
    p.add_argument("--cache", type=float, default=0.1, help="cache share of each table's rows")
    p.add_argument("--steps", type=int, default=None, help="timed steps per method (default 40)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10)")
    p.add_argument("--block", type=int, default=10, help="steps per method in turn (default 10)")
    p.add_argument("--large", action="store_true", help="also the larger-than-memory case (>= 32 GB on disk)")
    p.add_argument("--large-only", action="store_true", help="only the larger-than-memory case")
    p.add_argument("--large-steps", type=int, default=60, help="steps of the larger-than-memory case (default 60)")
    p.add_argument("--large-rows", type=int, default=2_500_000, help="rows per table of that case (default 2.5M)")
    p.add_argument("--dir", default=None, help="where the tables' files go (default: the temp directory)")
    p.add_argument("--json", type=Path, default=None, help="write the records here")
    args = p.parse_args()
    args.rows = args.rows or (20_000 if args.quick else 100_000)
    args.batch_size = args.batch_size or (1024 if args.quick else 4096)
    args.steps = args.steps or (10 if args.quick else 40)
    args.warmup = args.warmup or (3 if args.quick else 10)
    records: list[dict[str, Any]] = []
    if not args.large_only:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            for kind in ["zipf", "uniform"] if args.ids == "all" else [args.ids]:
                records += run_ids(kind, args, Path(tmp))
            records += record_store(Path(tmp))
    if args.large or args.large_only:
        records += larger_than_memory(args)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
        print(f"\nwrote {len(records)} records to {args.json}")


if __name__ == "__main__":
    main()
