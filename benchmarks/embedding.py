"""Embedding engine: one training step (forward + backward + sparse optimizer) of 26 tables, hugerec
against plain PyTorch, on the same synthetic Zipf(1.05) and uniform ids.

    python benchmarks/embedding.py [--quick] [--json PATH] [--only SUBSTRING]

Methods (built side by side and timed step by step in turn, or one at a time when memory is short):
    hugerec          EmbeddingCollection (fused buffers, Numba lookup, fused sparse optimizer in backward)
    hugerec-dynamic  the same with dynamic tables (hash-table vocabularies with room for every id, LRU)
                     fed raw 64-bit keys; reported as its step time over hugerec's (static tables)
    torch-per-table  one nn.EmbeddingBag(sparse=True) per table + torch.optim.SGD / SparseAdam, or for
                     row-wise Adagrad the few lines people write (coalesce, per-row accumulator, index_add_)
    torch-concat     the 26 tables concatenated into one nn.EmbeddingBag(sparse=True), same optimizers
    torchrec         FusedEmbeddingBagCollection when torchrec is importable (no Adam on CPU)
The upstream gradient is a fixed [B, 26 * D] tensor (no loss temporaries); tables start at zero (an
RNG fill of gigabytes would dominate --quick; the values do not change the work). Effective bandwidth counts
the bytes every method must move: rows read by the lookup, the pooled output written, the output
gradient read once per id, and weights + optimizer state of the unique rows read and written. It is
reported as a fraction of the machine's random-row gather bandwidth, measured in the same run.

Configurations: rows 100k / 1M per table, dim 16 / 128, 1 / 10 ids per bag, Zipf / uniform ids,
optimizers sgd / rowwise_adagrad / adam; a configuration whose tables do not fit in the available
memory is skipped (and says so); 1M rows x dim 128 (13 GB of fp32 rows per copy) needs a big machine. --quick: rows100k-d128-h1-zipf-rowwise_adagrad only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hugerec.embedding.collection import EmbeddingCollection
from hugerec.embedding.optimizers import SGD, Adam, Optimizer, RowWiseAdagrad
from hugerec.embedding.table_config import DynamicConfig, Eviction, TableConfig, Zeros
from hugerec.sparse.features import SparseFeatures

TABLES, BATCH = 26, 8192
LR = 0.01
OPTIMIZERS: dict[str, Optimizer] = {"sgd": SGD(lr=LR), "rowwise_adagrad": RowWiseAdagrad(lr=LR), "adam": Adam(lr=LR)}


@dataclass(frozen=True)
class Config:
    rows: int
    dim: int
    hotness: int
    dist: str
    optimizer: str

    @property
    def name(self) -> str:
        rows = f"{self.rows // 1_000_000}m" if self.rows >= 1_000_000 else f"{self.rows // 1000}k"
        return f"rows{rows}-d{self.dim}-h{self.hotness}-{self.dist}-{self.optimizer}"

    @property
    def state_floats(self) -> int:
        """fp32 optimizer-state values per row."""
        return {"sgd": 0, "rowwise_adagrad": 1, "adam": 2 * self.dim}[self.optimizer]


def all_configs() -> list[Config]:
    return [
        Config(rows, dim, hotness, dist, opt)
        for rows in (100_000, 1_000_000)
        for dim in (16, 128)
        for hotness in (1, 10)
        for dist in ("zipf", "uniform")
        for opt in OPTIMIZERS
    ]


# -- inputs ------------------------------------------------------------------------------------------
def draw_ids(rng: np.random.Generator, config: Config, n: int) -> np.ndarray:
    """[T, n] row ids; Zipf ranks are scattered over the rows by a per-table permutation."""
    if config.dist == "uniform":
        return rng.integers(0, config.rows, size=(TABLES, n), dtype=np.int64)
    cdf = np.cumsum(1.0 / np.arange(1, config.rows + 1) ** 1.05)
    ranks = np.searchsorted(cdf / cdf[-1], rng.random((TABLES, n)))
    perms = [rng.permutation(config.rows) for _ in range(TABLES)]
    return np.stack([perms[t][ranks[t]] for t in range(TABLES)]).astype(np.int64)


@dataclass
class Batch:
    ids: torch.Tensor  # [T, B * L] int64, table-major
    unique_rows: int  # sum over tables of the distinct rows touched


def make_batches(config: Config, count: int, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = draw_ids(rng, config, BATCH * config.hotness)
        unique = sum(len(np.unique(ids[t])) for t in range(TABLES))
        out.append(Batch(torch.from_numpy(ids), unique))
    return out


def useful_bytes(config: Config, batch: Batch) -> int:
    """Bytes a step must move: lookup reads, output write, output-gradient reads, unique rows + state updated."""
    n = TABLES * BATCH * config.hotness
    row = 4 * config.dim
    return n * row + BATCH * TABLES * row + n * row + batch.unique_rows * 2 * (row + 4 * config.state_floats)


# -- methods -----------------------------------------------------------------------------------------
class Method:
    """Builds its tables in __init__; step(i) runs forward + backward + optimizer on batch i."""

    name = ""

    def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self, i: int) -> None:
        raise NotImplementedError


class HugeRec(Method):
    name = "hugerec"

    def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
        tables = [TableConfig(f"t{t}", config.rows, config.dim, init=Zeros()) for t in range(TABLES)]
        self.emb = EmbeddingCollection(tables, OPTIMIZERS[config.optimizer])
        lengths = torch.full((TABLES * BATCH,), config.hotness, dtype=torch.int32)
        keys = tuple(f"t{t}" for t in range(TABLES))
        self.features = [SparseFeatures(keys, b.ids.reshape(-1), lengths) for b in batches]
        self.grad = grad

    def step(self, i: int) -> None:
        self.emb(self.features[i]).values.backward(self.grad)


class HugeRecDynamic(HugeRec):
    """The same collection with dynamic tables (hash-table vocabularies, capacity for every row id, LRU),
    fed raw 64-bit keys: each row id scattered over the int64 range by an odd multiplier (a bijection)."""

    name = "hugerec-dynamic"

    def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
        dynamic = DynamicConfig(eviction=Eviction.LRU)
        tables = [
            TableConfig(f"t{t}", config.rows + 1, config.dim, init=Zeros(), dynamic=dynamic) for t in range(TABLES)
        ]
        self.emb = EmbeddingCollection(tables, OPTIMIZERS[config.optimizer])
        lengths = torch.full((TABLES * BATCH,), config.hotness, dtype=torch.int32)
        keys = tuple(f"t{t}" for t in range(TABLES))
        self.features = [SparseFeatures(keys, raw_keys(b.ids).reshape(-1), lengths) for b in batches]
        self.grad = grad


def raw_keys(ids: torch.Tensor) -> torch.Tensor:
    """Row ids -> distinct raw int64 keys spread over the whole range (multiplication by an odd constant
    modulo 2^64 is a bijection), as hashed user or item ids look."""
    return torch.from_numpy(ids.numpy().astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(torch.int64)


def rowwise_adagrad_step(params: list[torch.Tensor], accumulators: list[torch.Tensor], lr: float, eps: float) -> None:
    """Row-wise Adagrad as people write it in plain torch."""
    with torch.no_grad():
        for p, acc in zip(params, accumulators, strict=True):
            assert p.grad is not None
            grad = p.grad.coalesce()
            rows, g = grad.indices()[0], grad.values()
            acc.index_add_(0, rows, (g * g).mean(dim=1))
            p.index_add_(0, rows, -lr * g / (acc[rows].sqrt() + eps)[:, None])
            p.grad = None


class TorchBase(Method):
    def _optimizer(self, config: Config, params: list[torch.Tensor]) -> Callable[[], None]:
        if config.optimizer == "rowwise_adagrad":
            accs = [torch.zeros(p.shape[0]) for p in params]
            opt = OPTIMIZERS[config.optimizer]
            assert isinstance(opt, RowWiseAdagrad)
            return lambda: rowwise_adagrad_step(params, accs, opt.lr, opt.eps)
        torch_opt: torch.optim.Optimizer
        if config.optimizer == "sgd":
            torch_opt = torch.optim.SGD(params, lr=LR)
        else:
            torch_opt = torch.optim.SparseAdam(params, lr=LR)

        def step() -> None:
            torch_opt.step()
            torch_opt.zero_grad(set_to_none=True)

        return step


class TorchPerTable(TorchBase):
    name = "torch-per-table"

    def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
        self.bags = [
            nn.EmbeddingBag(
                config.rows, config.dim, mode="sum", sparse=True, _weight=torch.zeros(config.rows, config.dim)
            )
            for _ in range(TABLES)
        ]
        self.opt_step = self._optimizer(config, [b.weight for b in self.bags])
        self.offsets = torch.arange(BATCH, dtype=torch.int64) * config.hotness
        self.batches, self.grad = batches, grad

    def step(self, i: int) -> None:
        ids = self.batches[i].ids
        out = torch.cat([bag(ids[t], self.offsets) for t, bag in enumerate(self.bags)], dim=1)  # [B, T*D]
        out.backward(self.grad)
        self.opt_step()


class TorchConcat(TorchBase):
    name = "torch-concat"

    def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
        rows = TABLES * config.rows
        self.bag = nn.EmbeddingBag(rows, config.dim, mode="sum", sparse=True, _weight=torch.zeros(rows, config.dim))
        self.opt_step = self._optimizer(config, [self.bag.weight])
        shift = (torch.arange(TABLES, dtype=torch.int64) * config.rows)[:, None]
        # [T, B*L] -> [T, B, L] -> [B, T, L] -> [B*T, L]: bag (b, t) at row b*T + t, so out is [B, T*D] directly
        self.inputs = [
            (b.ids + shift).view(TABLES, BATCH, config.hotness).transpose(0, 1).reshape(-1, config.hotness)
            for b in batches
        ]
        self.grad, self.dim = grad, config.dim

    def step(self, i: int) -> None:
        out = self.bag(self.inputs[i]).view(BATCH, TABLES * self.dim)  # [B*T, D] -> [B, T*D]
        out.backward(self.grad)
        self.opt_step()


def torchrec_method() -> type[Method] | None:
    try:
        from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad as TorchRecRowWiseAdagrad
    except ImportError:
        return None

    class TorchRec(Method):
        name = "torchrec"

        def __init__(self, config: Config, batches: list[Batch], grad: torch.Tensor) -> None:
            tables = [
                EmbeddingBagConfig(
                    name=f"t{t}", embedding_dim=config.dim, num_embeddings=config.rows, feature_names=[f"t{t}"]
                )
                for t in range(TABLES)
            ]
            kind = {"sgd": torch.optim.SGD, "rowwise_adagrad": TorchRecRowWiseAdagrad}[config.optimizer]
            self.ebc = FusedEmbeddingBagCollection(tables=tables, optimizer_type=kind, optimizer_kwargs={"lr": LR})
            lengths = torch.full((TABLES * BATCH,), config.hotness, dtype=torch.int64)
            keys = [f"t{t}" for t in range(TABLES)]
            self.kjts = [KeyedJaggedTensor.from_lengths_sync(keys, b.ids.reshape(-1), lengths) for b in batches]
            self.grad = grad

        def step(self, i: int) -> None:
            self.ebc(self.kjts[i]).values().backward(self.grad)

    return TorchRec


# -- measurement -------------------------------------------------------------------------------------
class Gather(Method):
    """The machine's random-row gather: torch.index_select of 262,144 random rows of a 1M x 128 fp32 table."""

    name = "gather"

    def __init__(self) -> None:
        self.table = torch.randn(1_000_000, 128)
        self.ids = torch.randint(0, self.table.shape[0], (262_144,))
        self.out = torch.empty(self.ids.numel(), 128)

    def step(self, i: int) -> None:
        torch.index_select(self.table, 0, self.ids, out=self.out)

    @property
    def bytes(self) -> int:
        return 2 * self.out.numel() * 4  # rows read + written


def time_interleaved(methods: dict[str, Method], batches: int, warmup: int, rounds: int) -> dict[str, float]:
    """Median seconds per step of each method, their steps taken in turn: on a shared, noisy machine
    every method sees the same load, so their ratio holds even when the absolute numbers do not."""
    for method in methods.values():
        for i in range(warmup):
            method.step(i % batches)
    times: dict[str, list[float]] = {name: [] for name in methods}
    for r in range(rounds):
        for name, method in methods.items():
            t0 = time.perf_counter()
            method.step(r % batches)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def memory_needed(config: Config, method: type[Method]) -> int:
    """Bytes a method holds: weights and optimizer state, plus per-step buffers (torch: the N x D sparse
    gradient and its coalesced copy; hugerec: pooled outputs and the row -> slot map), plus the hash
    tables of dynamic tables (slots at load <= 0.5 and per-row info: about 105 bytes per row at worst)."""
    weights = TABLES * config.rows * config.dim * 4
    state = TABLES * config.rows * 4 * config.state_floats
    step = 2 * TABLES * BATCH * config.hotness * config.dim * 4
    hashing = TABLES * config.rows * 105 if method is HugeRecDynamic else 0
    return weights + state + step + hashing


def available_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def allocator() -> str:
    preload = os.environ.get("LD_PRELOAD", "")
    if "tcmalloc" in preload:
        return f"tcmalloc (LD_PRELOAD={preload})"
    if "jemalloc" in preload:
        return f"jemalloc (LD_PRELOAD={preload})"
    return "glibc malloc"


def run(configs: list[Config], quick: bool) -> list[dict[str, Any]]:
    methods: list[type[Method]] = [HugeRec, HugeRecDynamic, TorchPerTable, TorchConcat]
    torchrec = torchrec_method()
    if torchrec is not None:
        methods.append(torchrec)
    print(
        f"allocator: {allocator()}; threads: torch {torch.get_num_threads()}; torchrec: "
        f"{'yes' if torchrec else 'not installed (skipped)'}"
    )
    print("gather = random-row gather bandwidth (1M x 128 fp32, index_select), timed in turn with each configuration\n")
    header = (
        f"{'config':42} {'method':16} {'samples/s':>11} {'GB/s':>6} {'%gather':>8} {'ours/torch':>10} {'ours/trec':>9}"
    )
    print(header)
    print("-" * len(header))
    gather = Gather()
    records: list[dict[str, Any]] = []
    for config in configs:
        batches = make_batches(config, 2 if quick else 3)
        grad = torch.randn(BATCH, TABLES * config.dim)
        moved = statistics.mean(useful_bytes(config, b) for b in batches)
        kinds = [cls for cls in methods if not (cls.name == "torchrec" and config.optimizer == "adam")]
        free = 0.7 * available_memory()  # the machine may be shared: leave room
        needs = {cls: memory_needed(config, cls) for cls in kinds}
        for cls in [c for c in kinds if needs[c] > free]:
            print(
                f"{config.name:42} {cls.name:16} skipped: needs ~{needs[cls] / 2**30:.1f} GiB, {free / 2**30:.1f} GiB usable"
            )
            del needs[cls]
        kinds = list(needs)
        if HugeRec not in kinds or not any(cls in kinds for cls in (TorchPerTable, TorchConcat)):
            print(f"{config.name:42} skipped: hugerec and a plain-PyTorch baseline do not both fit")
            continue
        # all methods side by side when they fit, else one at a time; the gather in turn with them
        groups = [kinds] if sum(needs.values()) <= free else [[cls] for cls in kinds]
        seconds: dict[str, float] = {}
        gather_gbps: list[float] = []
        for group in groups:
            built: dict[str, Method] = {cls.name: cls(config, batches, grad) for cls in group}
            built[gather.name] = gather
            timed = time_interleaved(built, len(batches), 1 if quick else 2, 3 if quick else 6)
            gather_gbps.append(gather.bytes / timed.pop(gather.name) / 1e9)
            seconds |= timed
            del built
            gc.collect()
        machine = statistics.median(gather_gbps)
        plain = min(seconds[m] for m in ("torch-per-table", "torch-concat") if m in seconds)
        ratios = {"torch": plain / seconds["hugerec"]}  # against the best plain-PyTorch variant
        if "torchrec" in seconds:
            ratios["torchrec"] = seconds["torchrec"] / seconds["hugerec"]
        # step time of dynamic over static tables (nan where the dynamic tables did not fit: not recorded)
        dynamic_cost = seconds.get("hugerec-dynamic", float("nan")) / seconds["hugerec"]
        for name, t in seconds.items():
            gbps = moved / t / 1e9
            shown = ""
            if name == "hugerec":
                shown = f"{ratios['torch']:10.2f} " + (f"{ratios['torchrec']:9.2f}" if "torchrec" in ratios else "")
            if name == "hugerec-dynamic":
                shown = f"{'':10} {'':9} {dynamic_cost:.2f}x static"
            print(f"{config.name:42} {name:16} {BATCH / t:11.0f} {gbps:6.2f} {100 * gbps / machine:7.1f}% {shown}")
            records.append(
                {
                    "config": config.name,
                    "method": name,
                    "value": BATCH / t,
                    "unit": "samples/s",
                    "higher_is_better": True,
                    "gbps": gbps,
                    "gather_fraction": gbps / machine,
                    "allocator": allocator(),
                    "interleaved": len(groups) == 1,
                }
            )
        print(f"{config.name:42} {'gather':16} {'':11} {machine:6.2f}")
        records.append(
            {"config": config.name, "method": "gather", "value": machine, "unit": "GB/s", "higher_is_better": True}
        )
        if "hugerec-dynamic" in seconds:
            records.append(
                {
                    "config": config.name,
                    "method": "hugerec-dynamic/hugerec step time",
                    "value": dynamic_cost,
                    "unit": "x",
                    "higher_is_better": False,
                }
            )
        for against, ratio in ratios.items():
            records.append(
                {
                    "config": config.name,
                    "method": f"hugerec/{against}",
                    "value": ratio,
                    "unit": "x",
                    "higher_is_better": True,
                }
            )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="rows100k-d128-h1-zipf-rowwise_adagrad only (< 1 min)")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--only", default="", help="run the configurations whose name contains this")
    args = parser.parse_args()
    configs = [Config(100_000, 128, 1, "zipf", "rowwise_adagrad")] if args.quick else all_configs()
    configs = [c for c in configs if args.only in c.name]
    records = run(configs, args.quick)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
