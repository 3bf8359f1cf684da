"""End-to-end DLRM training throughput (samples/s, Parquet loading included): hugerec vs PyTorch and TorchRec.

Two shapes, 26 tables x 100,000 rows, Zipf ids (hugerec's synthetic generator, written as Parquet
and read back by hugerec's loader, one loader per method):

    mlperf           dim 64, one id per table, bottom 512-256-64, top 1024-1024-512-256-1, batch 8192
    embedding-heavy  dim 128, 10 ids per table, bottom 256-128, top 256-128-1, batch 8192

Methods, all with the same model, data, batch, loss and dense optimizer (Adam 1e-3); the sparse optimizer
is Adam 1e-3 too, except for the TorchRec pair (FBGEMM has no Adam on CPU):

    pytorch           how most users write it: one nn.EmbeddingBag(sparse=True) per table,
                      torch.optim.SparseAdam for them, Adam for the MLPs, the MLPerf reference's
                      interaction (bmm + lower-triangle gather)
    hugerec           hugerec.models.DLRM on an EmbeddingCollection (fused lookups; lazy Adam, the
                      same rule as SparseAdam, applied to the touched rows inside the backward); the
                      step of hugerec.training.fit (forward, BCE, backward, dense Adam)
    hugerec-compiled  (--compile) the same with torch.compile of the dense part
    hugerec-bf16      (--bf16) the same under bf16 autocast
    hugerec-fit       hugerec.training.fit itself, timed alone after the others (its last log window)
    torchrec          (when torchrec is importable) torchrec.models.dlrm.DLRM on TorchRec's
                      FusedEmbeddingBagCollection: FBGEMM's CPU kernel, all tables batched, row-wise
                      Adagrad 0.01 applied inside the backward (FBGEMM's CPU optimizers are SGD,
                      Adagrad and row-wise Adagrad); the ids go in as a KeyedJaggedTensor (no copy)
    hugerec-rowwise_adagrad  hugerec with the same row-wise Adagrad 0.01, timed beside torchrec:
                      hugerec-rowwise_adagrad / torchrec is the same-optimizer ratio

The methods take their steps in turn (pytorch, hugerec, pytorch, hugerec, ...) so that a machine
shared with other work slows them alike; the ratio is what to read. Then a profile of each step
split into phases (data, embedding forward, dense forward, dense backward, embedding backward +
sparse optimizer, dense optimizer), the backward cut at the pooled embeddings so each part runs once.

    python benchmarks/train_dlrm.py                 # both configs: 2 warmup + 8 timed + 2 profiled steps
    python benchmarks/train_dlrm.py --quick         # < 1 minute: 20,000 rows per table, batch 512, 1 + 2 + 1 steps
    python benchmarks/train_dlrm.py --config mlperf --json out.json
    python benchmarks/train_dlrm.py --no-torchrec   # leave TorchRec out even where it is installed
    python benchmarks/train_dlrm.py --no-dynamic    # leave out the dynamic-tables comparison below

`dlrm <shape> dynamic vs static` (--dynamic, on by default): the same hugerec DLRM on dynamic tables
fed raw 64-bit ids (each id hashed to a key; capacity = the rows, so nothing is evicted) against
static tables fed the pre-remapped ids, both Adam:

    static               static tables, the ids as the loader gives them (already 0..R-1), through
                         hugerec.training.pipeline (batch i + 1 decoded while step i runs), as fit does
    hugerec-dynamic      dynamic tables through the pipeline: batch i + 1 is decoded and remapped in
                         a worker thread while step i runs
    static-no-pipeline   static tables, the loading inside the step
    hugerec-no-pipeline  dynamic tables, the loading and the remap inside the step

Each method takes a block of steps in turn; a pipelined block starts with a fresh pipeline, so its
first batch's preparation is not hidden (the ratio is, if anything, understated).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrec_baseline import fused_collection, keyed_jagged, unavailable

from hugerec.data.loader import Loader
from hugerec.data.schema import Schema
from hugerec.data.synthetic import Hotness, SyntheticConfig, generate
from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import Adam, Optimizer, RowWiseAdagrad, optimizer_name
from hugerec.embedding.table_config import DynamicConfig, TableConfig
from hugerec.models.dlrm import DLRM
from hugerec.sparse.batch import Batch
from hugerec.training.pipeline import Pipeline
from hugerec.training.schedule import Schedule
from hugerec.training.trainer import TrainConfig, fit

NUM_TABLES = 26
NUM_DENSE = 13
LR = 1e-3
ADAM = Adam(lr=LR)
ADAGRAD = RowWiseAdagrad(lr=0.01)  # the sparse optimizer of the TorchRec pair


@dataclass(frozen=True)
class Shape:
    dim: int
    hotness: int
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    num_rows: int = 100_000


SHAPES = {
    "mlperf": Shape(64, 1, (512, 256, 64), (1024, 1024, 512, 256, 1)),
    "embedding-heavy": Shape(128, 10, (256, 128), (256, 128, 1)),
}
SPARSE = [f"C{i}" for i in range(1, NUM_TABLES + 1)]
DENSE = [f"I{i}" for i in range(1, NUM_DENSE + 1)]


# -- data --------------------------------------------------------------------------------------
def write_data(shape: Shape, num_rows: int, out: Path) -> Schema:
    multi = SPARSE if shape.hotness > 1 else []
    schema = Schema.build(dense=DENSE, sparse=dict.fromkeys(SPARSE, shape.num_rows), multi_hot=multi)
    group = 1 << 14
    rows = -(-num_rows // group) * group
    cfg = SyntheticConfig(schema, rows, hotness=Hotness(shape.hotness), rows_per_file=group * 8, row_group_rows=group)
    generate(cfg, out)
    return cfg.output_schema


def batches(path: Path, schema: Schema, batch_size: int) -> Iterator[Batch]:
    """Endless batches: the loader's epochs one after the other."""
    loader = Loader(path, schema, batch_size, drop_last=True)
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


class Endless:
    """A re-iterable that never ends (fit stops at max_steps); each iter() continues the stream."""

    def __init__(self, it: Iterator[Batch]) -> None:
        self.it = it

    def __iter__(self) -> Iterator[Batch]:
        return self.it


# -- plain PyTorch DLRM (what most users write) ---------------------------------------------------
def mlp(dims: tuple[int, ...], in_dim: int, last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip((in_dim, *dims[:-1]), dims, strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 1 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TorchDLRM(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        bound = math.sqrt(1.0 / shape.num_rows)
        self.embeddings = nn.ModuleList()
        for _ in SPARSE:
            bag = nn.EmbeddingBag(shape.num_rows, shape.dim, mode="sum", sparse=True)
            nn.init.uniform_(bag.weight, -bound, bound)
            self.embeddings.append(bag)
        self.bottom = mlp(shape.bottom, NUM_DENSE, last_relu=True)
        f = NUM_TABLES + 1
        self.li, self.lj = torch.tril_indices(f, f, offset=-1)
        self.top = mlp(shape.top, shape.dim + f * (f - 1) // 2, last_relu=False)
        self.dim = shape.dim

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.dense_part(batch.dense, self.embed(batch))

    def embed(self, batch: Batch) -> list[torch.Tensor]:
        b = batch.batch_size
        values, offsets = batch.sparse.values, batch.sparse.offsets()
        starts = offsets[::b].tolist()  # [F + 1]: where each feature's ids begin
        return [
            bag(values[starts[f] : starts[f + 1]], offsets[f * b : (f + 1) * b] - starts[f])
            for f, bag in enumerate(self.embeddings)
        ]

    def dense_part(self, dense: torch.Tensor, embs: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        t = torch.cat([x, *embs], dim=1).view(x.shape[0], -1, self.dim)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]  # [B, (F+1)F/2]
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


class Method:
    """One way to train: a step (Batch -> loss) and the same step cut into phases for the profile."""

    name: str
    profiled = True  # False where the profile's eager phases would not be the step that was timed

    def step(self, batch: Batch) -> float:
        raise NotImplementedError

    def embed(self, batch: Batch) -> torch.Tensor:
        """Pooled embeddings [B, F*D] (the graph is cut here for the profile)."""
        raise NotImplementedError

    def dense(self, batch: Batch, pooled: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dense_step(self) -> None:
        raise NotImplementedError

    def sparse_step(self) -> None:
        """The sparse optimizer step when it is not part of the backward."""


class TorchRun(Method):
    def __init__(self, shape: Shape) -> None:
        self.name = "pytorch"
        self.model = TorchDLRM(shape)
        self.sparse_opt = torch.optim.SparseAdam(list(self.model.embeddings.parameters()), lr=LR)
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("embeddings.")]
        self.dense_opt = torch.optim.Adam(dense, lr=LR)

    def step(self, batch: Batch) -> float:
        loss = nn.functional.binary_cross_entropy_with_logits(self.model(batch), batch.labels)
        self.dense_opt.zero_grad()
        self.sparse_opt.zero_grad()
        loss.backward()
        self.dense_opt.step()
        self.sparse_opt.step()
        return loss.item()

    def embed(self, batch: Batch) -> torch.Tensor:
        return torch.cat(self.model.embed(batch), dim=1)

    def dense(self, batch: Batch, pooled: torch.Tensor) -> torch.Tensor:
        return self.model.dense_part(batch.dense, list(pooled.split(self.model.dim, dim=1)))

    def dense_step(self) -> None:
        self.dense_opt.step()
        self.dense_opt.zero_grad()

    def sparse_step(self) -> None:
        self.sparse_opt.step()
        self.sparse_opt.zero_grad()


class HugerecRun(Method):
    """hugerec's DLRM, the step of hugerec.training.fit: the sparse optimizer runs inside the backward."""

    def __init__(self, shape: Shape, compile: bool = False, bf16: bool = False, sparse_opt: Optimizer = ADAM) -> None:
        self.name = "hugerec" + ("-compiled" if compile else "") + ("-bf16" if bf16 else "")
        if not isinstance(sparse_opt, Adam):
            self.name += f"-{optimizer_name(sparse_opt)}"
        tables = [TableConfig(name, shape.num_rows, shape.dim) for name in SPARSE]
        self.model = DLRM(EmbeddingCollection(tables, sparse_opt), NUM_DENSE, shape.bottom, shape.top)
        if compile:
            self.model.compile_dense()
            self.profiled = False
        self.opt = torch.optim.Adam(self.model.dense_parameters(), lr=LR)
        self.bf16 = bf16

    def step(self, batch: Batch) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            logits = self.model(batch)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.model.embed(batch.sparse)[0]

    def dense(self, batch: Batch, pooled: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            return self.model.dense_forward(batch.dense, (pooled,))

    def dense_step(self) -> None:
        self.opt.step()
        self.opt.zero_grad()


class TorchRecRun(Method):
    """TorchRec's DLRM on its fused collection: row-wise Adagrad (ADAGRAD) inside the backward, dense Adam."""

    def __init__(self, shape: Shape) -> None:
        from torchrec.models.dlrm import DLRM as TorchRecDLRM

        self.name = "torchrec"
        tables = [TableConfig(name, shape.num_rows, shape.dim) for name in SPARSE]
        ebc = fused_collection(tables, ADAGRAD)
        self.model = TorchRecDLRM(ebc, NUM_DENSE, list(shape.bottom), list(shape.top))
        # the fused tables show up as parameters too, but FBGEMM updates them in the backward; they get no .grad
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("sparse_arch.")]
        self.opt = torch.optim.Adam(dense, lr=LR)
        self.dim = shape.dim

    def step(self, batch: Batch) -> float:
        logits = self.model(batch.dense, keyed_jagged(batch.sparse)).squeeze(1)  # [B, 1] -> [B]
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return loss.item()

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.model.sparse_arch.embedding_bag_collection(keyed_jagged(batch.sparse)).values()

    def dense(self, batch: Batch, pooled: torch.Tensor) -> torch.Tensor:
        m = self.model
        sparse = pooled.view(batch.batch_size, NUM_TABLES, self.dim)  # [B, F*D] -> [B, F, D]
        return m.over_arch(m.inter_arch(m.dense_arch(batch.dense), sparse)).squeeze(1)

    def dense_step(self) -> None:
        self.opt.step()
        self.opt.zero_grad()


def sparse_optimizer(method: Method) -> str:
    match method:
        case TorchRun():
            return "sparse_adam"
        case HugerecRun():
            return optimizer_name(method.model.sparse_arch.optimizer)
        case TorchRecRun():
            return optimizer_name(ADAGRAD)
    raise ValueError(f"unknown method {method.name!r}")


# -- timing ------------------------------------------------------------------------------------
Phases = dict[str, float]
PHASES = ("data", "embedding fwd", "dense fwd", "dense bwd", "embedding bwd + sparse opt", "dense opt")


def time_interleaved(methods: list[Method], streams: list[Iterator[Batch]], warmup: int, steps: int) -> list[float]:
    """Samples/s of each method, their steps taken in turn so a busy machine slows them alike.

    next(stream) is inside each method's timed span: data loading counts.
    """
    for method, stream in zip(methods, streams, strict=True):
        for _ in range(warmup):
            method.step(next(stream))
    seconds = [0.0] * len(methods)
    samples = [0] * len(methods)
    for _ in range(steps):
        for i, (method, stream) in enumerate(zip(methods, streams, strict=True)):
            start = time.perf_counter()
            batch = next(stream)
            method.step(batch)
            seconds[i] += time.perf_counter() - start
            samples[i] += batch.batch_size
    return [n / s for n, s in zip(samples, seconds, strict=True)]


def profile_interleaved(methods: list[Method], streams: list[Iterator[Batch]], steps: int) -> list[Phases]:
    """Mean ms per step of each phase; the backward is cut at the pooled embeddings so each part runs once."""
    totals: list[Phases] = [dict.fromkeys(PHASES, 0.0) for _ in methods]
    for _ in range(steps):
        for method, stream, phases in zip(methods, streams, totals, strict=True):

            def add(name: str, t0: float, phases: Phases = phases) -> float:
                t1 = time.perf_counter()
                phases[name] += (t1 - t0) * 1000 / steps
                return t1

            t = time.perf_counter()
            batch = next(stream)
            t = add("data", t)
            pooled = method.embed(batch)
            t = add("embedding fwd", t)
            cut = pooled.detach().requires_grad_()
            loss = nn.functional.binary_cross_entropy_with_logits(method.dense(batch, cut), batch.labels)
            t = add("dense fwd", t)
            loss.backward()
            t = add("dense bwd", t)
            pooled.backward(cut.grad)
            method.sparse_step()
            t = add("embedding bwd + sparse opt", t)
            method.dense_step()
            add("dense opt", t)
    return totals


def time_fit(shape: Shape, stream: Iterator[Batch], warmup: int, steps: int) -> float:
    """hugerec.training.fit itself: its last log window of `steps` steps (the first holds the warmup)."""
    model = HugerecRun(shape).model
    window = max(warmup, steps)
    cfg = TrainConfig(
        max_steps=window + steps,
        lr=LR,
        schedule=Schedule(),  # a constant lr: the stream has no length for the default's decay over an epoch
        log_every=window,
        device="cpu",
        progress=False,
        tensorboard=False,
        plot=False,
    )
    return fit(model, Endless(stream), config=cfg).train[-1]["samples_per_s"]


# -- main --------------------------------------------------------------------------------------
def run_config(name: str, shape: Shape, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    batch_size = args.batch_size
    t = time.perf_counter()
    schema = write_data(shape, batch_size * (args.warmup + args.steps + args.profile + 1), tmp / name)
    print(
        f"\n== {name}: dim {shape.dim}, {shape.hotness} id(s)/table, bottom {'-'.join(map(str, shape.bottom))}, "
        f"top {'-'.join(map(str, shape.top))}, batch {batch_size} (data written in {time.perf_counter() - t:.0f}s)",
        flush=True,
    )
    torch.manual_seed(0)
    methods: list[Method] = [TorchRun(shape), HugerecRun(shape)]
    if args.torchrec:
        methods += [TorchRecRun(shape), HugerecRun(shape, sparse_opt=ADAGRAD)]
    if args.compile:
        methods.append(HugerecRun(shape, compile=True))
    if args.bf16:
        methods.append(HugerecRun(shape, bf16=True))
    streams = [batches(tmp / name, schema, batch_size) for _ in methods]
    rates = time_interleaved(methods, streams, args.warmup, args.steps)
    profiled = [i for i, m in enumerate(methods) if m.profiled] if args.profile else []
    phases = profile_interleaved([methods[i] for i in profiled], [streams[i] for i in profiled], args.profile)
    common = {"unit": "samples/s", "higher_is_better": True, "batch_size": batch_size, "num_rows": shape.num_rows}
    records = [
        {"config": name, "method": m.name, "value": rate, **common, "steps": args.steps, "sparse_optimizer": opt}
        for m, rate, opt in zip(methods, rates, map(sparse_optimizer, methods), strict=True)
    ]
    for i, p in zip(profiled, phases, strict=True):
        records[i]["profile_ms_per_step"] = p
    del methods, streams
    gc.collect()
    if args.fit:
        rate = time_fit(shape, batches(tmp / name, schema, batch_size), args.warmup, args.steps)
        records.append(
            {
                "config": name,
                "method": "hugerec-fit",
                "value": rate,
                **common,
                "steps": args.steps,
                "sparse_optimizer": "adam",
                "note": "hugerec.training.fit, timed alone (not interleaved)",
            }
        )
        gc.collect()
    base = records[0]["value"]
    torchrec = next((r["value"] for r in records if r["method"] == "torchrec"), None)
    print(
        f"  {'method':24s} {'sparse opt':>16s} {'samples/s':>10s} {'x pytorch':>10s}"
        + (" x torchrec" if torchrec else "")
    )
    for r in records:
        r["ratio_vs_pytorch"] = r["value"] / base
        line = f"  {r['method']:24s} {r['sparse_optimizer']:>16s} {r['value']:10.0f} {r['ratio_vs_pytorch']:10.2f}"
        if torchrec:
            r["ratio_vs_torchrec"] = r["value"] / torchrec
            line += f" {r['ratio_vs_torchrec']:10.2f}"
        print(line)
    if torchrec:
        print("  (the same-optimizer pair is hugerec-rowwise_adagrad vs torchrec: FBGEMM has no Adam on CPU)")
    if args.fit:
        print("  (hugerec-fit ran alone after the others, under whatever load the machine had then: indicative only)")
    if phases:
        print(f"  step profile, ms per step ({args.profile} steps, interleaved):")
        print("  " + f"{'phase':28s}" + "".join(f"{records[i]['method']:>24s}" for i in profiled))
        for phase in PHASES:
            print("  " + f"{phase:28s}" + "".join(f"{p[phase]:24.0f}" for p in phases))
        print("  " + f"{'total':28s}" + "".join(f"{sum(p.values()):24.0f}" for p in phases))
    return records


# -- dynamic tables on raw ids vs static tables on pre-remapped ids ---------------------------------
RAW = 0x9E3779B97F4A7C15 - (1 << 64)  # odd int64 multiplier: ids -> distinct raw 64-bit keys


def raw_ids(stream: Iterator[Batch]) -> Iterator[Batch]:
    """The loader's batches with each id turned into a raw 64-bit key (what an un-preprocessed log holds)."""
    for b in stream:
        sparse = replace(b.sparse, values=b.sparse.values * RAW + 12345)
        yield Batch(b.dense, sparse, b.labels)


class DynamicRun(HugerecRun):
    def __init__(self, shape: Shape, pipeline: bool) -> None:
        super().__init__(shape)
        self.name = "hugerec-dynamic" if pipeline else "hugerec-no-pipeline"
        tables = [TableConfig(name, shape.num_rows, shape.dim, dynamic=DynamicConfig()) for name in SPARSE]
        self.model = DLRM(EmbeddingCollection(tables, ADAM), NUM_DENSE, shape.bottom, shape.top)
        self.opt = torch.optim.Adam(self.model.dense_parameters(), lr=LR)
        self.pipeline = pipeline


def time_blocks(
    methods: list[HugerecRun], streams: list[Iterator[Batch]], warmup: int, steps: int, k: int
) -> list[float]:
    """Samples/s, each method taking k steps in turn; a pipelined method gets a fresh Pipeline per block."""

    def block(m: HugerecRun, stream: Iterator[Batch], n: int) -> tuple[float, int]:
        start, samples = time.perf_counter(), 0
        part = itertools.islice(stream, n)
        it = Pipeline(m.model, torch.device("cpu"))(part) if getattr(m, "pipeline", False) else part
        for batch in it:
            m.step(batch)
            samples += batch.batch_size
        return time.perf_counter() - start, samples

    for m, s in zip(methods, streams, strict=True):
        block(m, s, warmup)
    seconds, samples = [0.0] * len(methods), [0] * len(methods)
    for done in range(0, steps, k):
        for i, (m, s) in enumerate(zip(methods, streams, strict=True)):
            sec, n = block(m, s, min(k, steps - done))
            seconds[i] += sec
            samples[i] += n
    return [n / s for n, s in zip(samples, seconds, strict=True)]


def run_dynamic(name: str, shape: Shape, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    schema = write_data(shape, args.batch_size * (args.warmup + args.steps + 1), tmp / f"{name}-dyn")
    torch.manual_seed(0)
    static, plain = HugerecRun(shape), HugerecRun(shape)
    static.name, static.pipeline = "static", True  # type: ignore[attr-defined]
    plain.name = "static-no-pipeline"
    methods: list[HugerecRun] = [static, DynamicRun(shape, True), plain, DynamicRun(shape, False)]
    streams = [batches(tmp / f"{name}-dyn", schema, args.batch_size) for _ in methods]
    streams[1], streams[3] = raw_ids(streams[1]), raw_ids(streams[3])
    k = max(1, args.steps // 4)
    rates = time_blocks(methods, streams, args.warmup, args.steps, k)
    config = f"dlrm {name} dynamic vs static"
    print(f"\n== {config}: batch {args.batch_size}, {args.steps} steps per method in blocks of {k}")
    records = []
    for m, rate in zip(methods, rates, strict=True):
        print(f"  {m.name:22s} {rate:10.0f} samples/s   {rate / rates[0]:.2f}x static")
        records.append({"config": config, "method": m.name, "value": rate, "unit": "samples/s", "higher_is_better": True,
                        "ratio_vs_static": rate / rates[0], "batch_size": args.batch_size})  # fmt: skip
    print(f"  dynamic / static without the pipeline: {rates[3] / rates[2]:.2f}x")
    return records


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        help="20,000 rows per table, batch 512, 1 warmup + 2 timed + 1 profiled step (< 1 min)",
    )
    p.add_argument("--config", choices=[*SHAPES, "all"], default="all")
    p.add_argument("--batch-size", type=int, default=None, help="default 8192 (512 with --quick)")
    p.add_argument("--rows", type=int, default=None, help="rows per table (default 100,000; 20,000 with --quick)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per method (default 8)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per method first (default 2)")
    p.add_argument("--profile", type=int, default=None, help="profiled steps per method, 0: none (default 2)")
    p.add_argument("--compile", action="store_true", help="also time hugerec with torch.compile of the dense part")
    p.add_argument("--bf16", action="store_true", help="also time hugerec under bf16 autocast")
    p.add_argument(
        "--fit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also time hugerec through hugerec.training.fit (default: on unless --quick)",
    )
    p.add_argument(
        "--torchrec",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time TorchRec's DLRM and hugerec with its row-wise Adagrad, when torchrec is importable (default: on)",
    )
    p.add_argument(
        "--dynamic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time dynamic tables on raw ids against static tables, with and without the pipeline (default: on)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--json", type=Path, default=None, help="write the records here")
    args = p.parse_args()
    quick = args.quick
    args.batch_size = args.batch_size or (512 if quick else 8192)
    args.rows = args.rows or (20_000 if quick else 100_000)
    args.steps = args.steps or (2 if quick else 8)
    args.warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    args.profile = args.profile if args.profile is not None else (1 if quick else 2)
    args.fit = (not quick) if args.fit is None else args.fit
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {NUM_TABLES} tables x {args.rows:,} rows")
    if args.torchrec:
        reason = unavailable()
        if reason is not None:
            print(f"torchrec: skipped ({reason})")
            args.torchrec = False
    names = list(SHAPES) if args.config == "all" else [args.config]
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hugerec-train-dlrm-") as tmp:
        for name in names:
            records += run_config(name, replace(SHAPES[name], num_rows=args.rows), args, Path(tmp))
            if args.dynamic:
                records += run_dynamic(name, replace(SHAPES[name], num_rows=args.rows), args, Path(tmp))
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=1) + "\n")
        print(f"\nwrote {len(records)} records to {args.json}")


if __name__ == "__main__":
    main()
