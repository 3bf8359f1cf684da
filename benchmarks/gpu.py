"""The GPU engine on one H100 / H200 (issue 30): CUDA kernel tests, then every figure, hugerec and plain
PyTorch in the same run.

    python benchmarks/gpu.py [--quick] [--json PATH] [--skip-tests]
    python benchmarks/gpu.py --dry-run      # tiny shapes on the CPU, Triton's interpreter: checks the script

Figures (configs and methods as the issue names them; ours start with `hugerec`):
  copy bandwidth             device-to-device copy, bytes read + written per second (the limit)
  lookup fwd / <shape>       pooled forward, GB/s of ids read + rows read + output written:
                             hugerec (one Triton launch for the 26 tables) vs nn.EmbeddingBag per table
  lookup fwd+bwd+update      samples/s of forward + backward + Adagrad on the touched rows: hugerec (fused
                             backward) vs nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad
                             shapes: mlperf (26 tables of MLPerf DLRM's sizes, capped; dim 128, one id each),
                             heavy (8 tables, dim 256, 30 ids per bag), zipf (26 tables, dim 64, Zipf ids)
  hash find / hash insert    keys/s at load factor 0.5 and 0.9 (keys held / rows); insert = the raw
                             compare-and-swap insert of new keys; find_or_insert = the table's full training
                             lookup (dedupe, admission, rows, bookkeeping); baseline: a sorted key array
                             (torch.searchsorted to find, cat + sort to insert)
  dlrm step                  MLPerf DLRM (13 dense, 26 x 128, 512-256-128 / 1024-1024-512-256-1), Adam sparse
                             and dense, same batch: hugerec eager, hugerec with the dense part as a CUDA graph,
                             plain PyTorch (EmbeddingBag + SparseAdam + Adam)
  hbm cache                  one table 4x its HBM cache, rows in pinned host memory, Zipf ids, samples/s of
                             prepare + lookup + fused backward, vs the same table all in HBM

Only what ran is printed and written; `--dry-run` records carry config prefix `dry-run` and are no GPU figure.
The GPU path imports torch, numpy, numba, triton and hugerec's embedding/ops/models/sparse only (plus
pytest and hypothesis for the tests): nothing that the GPU machines lack.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing (the GPU machine)
    sys.path.insert(0, str(ROOT))

KERNEL_TESTS = [  # Triton against the torch reference first; the last three also run the Numba path (compiled here)
    "tests/ops/gpu",
    "tests/ops/test_hash_table_tensors.py",
    "tests/embedding/test_hbm_cache.py",
    "tests/sparse/test_device_copy.py",
    "tests/embedding/test_feature_remap.py::test_tables_on_a_device_remap_as_on_the_host",
    "tests/embedding/test_collection.py::test_cuda_matches_cpu",
    "tests/embedding/test_collection_dynamic.py::test_cuda_matches_cpu",
    "tests/models/test_cuda_graph.py",  # the DLRM figure's CUDA graph of the dense part, never yet run on a GPU
]
# MLPerf DLRM (Criteo Terabyte) table sizes; capped per run so that both methods fit
MLPERF_ROWS = [
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155, 4,
    976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
]  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    cap: int  # largest table of the lookup shapes (rows)
    batch: int  # mlperf and zipf shapes
    heavy_batch: int
    heavy_rows: int
    hash_capacity: int
    hash_keys: int  # keys per timed find / insert
    dlrm_batch: int
    dlrm_cap: int
    cache_rows: int  # the hbm-cache table's rows (4x its cache)
    cache_batch: int
    steps: int
    warmup: int


FULL = Sizes(2_000_000, 65536, 16384, 1_000_000, 1 << 24, 1 << 22, 65536, 2_000_000, 8_000_000, 65536, 10, 3)
QUICK = Sizes(200_000, 16384, 4096, 200_000, 1 << 21, 1 << 19, 8192, 200_000, 1_000_000, 16384, 8, 2)
DRY = Sizes(64, 8, 2, 32, 64, 16, 8, 32, 64, 8, 1, 0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller shapes and fewer steps (about a minute)")
    p.add_argument("--json", type=Path, help="write the records here")
    p.add_argument("--skip-tests", action="store_true", help="measure without running the CUDA kernel tests first")
    p.add_argument("--tests-budget", type=float, default=180.0, help="seconds the kernel tests may take (default 180)")
    p.add_argument(
        "--dry-run", action="store_true", help="tiny shapes on the CPU under Triton's interpreter (checks the script)"
    )
    return p.parse_args()


class Timer:
    """Median milliseconds of fn over timed repetitions (CUDA events on the GPU, perf_counter elsewhere)."""

    def __init__(self, cuda: bool, sizes: Sizes) -> None:
        self.cuda = cuda
        self.sizes = sizes

    def __call__(self, fn: Callable[[], Any], steps: int | None = None) -> float:
        import torch

        for _ in range(self.sizes.warmup):
            fn()
        times = []
        for _ in range(steps or self.sizes.steps):
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


class Report:
    """The records, printed as they come and rewritten to `path` after each (a run cut short keeps its figures)."""

    def __init__(self, prefix: str, device: str, path: Path | None) -> None:
        self.prefix = prefix
        self.device = device
        self.path = path
        self.records: list[dict[str, Any]] = []

    def add(self, config: str, method: str, value: float, unit: str, higher: bool = True) -> None:
        config = f"{self.prefix}{config}"
        self.records.append(
            {
                "config": config,
                "method": method,
                "value": value,
                "unit": unit,
                "higher_is_better": higher,
                "device": self.device,
            }
        )
        print(f"  {config:<44} {method:<26} {value:>16,.4g} {unit}", flush=True)
        if self.path is not None:
            self.path.write_text(json.dumps(self.records, indent=1))

    def ratio(self, config: str, ours: str, theirs: str, label: str) -> None:
        by = {(r["config"], r["method"]): r["value"] for r in self.records}
        a, b = by.get((f"{self.prefix}{config}", ours)), by.get((f"{self.prefix}{config}", theirs))
        if a is not None and b:
            print(f"  {'':<44} {label:<26} {a / b:>14.2f} x", flush=True)


# -- the measurements -----------------------------------------------------------------------------------


def copy_bandwidth(rep: Report, timer: Timer, device: Any, sizes: Sizes) -> float:
    import torch

    n = (1 << 28) if timer.cuda else 1 << 12  # 1 GiB of fp32 each way on the GPU
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    gbs = 2 * src.numel() * 4 / ms / 1e6
    rep.add("copy bandwidth", "device copy", gbs, "GB/s")
    return gbs


@dataclass
class Shape:
    name: str
    rows: list[int]
    dim: int
    batch: int
    ids_per_bag: int
    zipf: float  # 0: uniform ids


def shapes(sizes: Sizes) -> list[Shape]:
    tables = 3 if sizes is DRY else None  # the interpreter runs every program in Python: a few tables
    return [
        Shape("mlperf", [min(r, sizes.cap) for r in MLPERF_ROWS][:tables], 128, sizes.batch, 1, 0.0),
        Shape(
            "heavy",
            [sizes.heavy_rows] * (8 if tables is None else 2),
            256 if sizes is not DRY else 16,
            sizes.heavy_batch,
            30,
            0.0,
        ),
        Shape("zipf", ([sizes.cap // 2] * 26)[:tables], 64, sizes.batch, 1, 1.05),
    ]


def draw_ids(rows: int, n: int, zipf: float, gen: Any, device: Any) -> Any:
    """n ids in [0, rows): uniform, or Zipf(zipf) ranks scattered over the rows by a fixed permutation."""
    import torch

    if zipf == 0.0:
        return torch.randint(0, rows, (n,), generator=gen).to(device)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    ranks = ((rows ** (1 - zipf) - 1) * u + 1) ** (1 / (1 - zipf)) - 1  # inverse CDF of a continuous Zipf
    ranks = ranks.long().clamp(0, rows - 1)
    return ((ranks * 2654435761) % rows).to(device)


def features_of(shape: Shape, device: Any, seed: int) -> Any:
    import torch

    from hugerec.sparse.features import SparseFeatures

    gen = torch.Generator().manual_seed(seed)
    n = shape.batch * shape.ids_per_bag
    values = torch.cat([draw_ids(r, n, shape.zipf, gen, "cpu") for r in shape.rows])
    lengths = torch.full((len(shape.rows) * shape.batch,), shape.ids_per_bag, dtype=torch.int32)
    return SparseFeatures(tuple(f"f{i}" for i in range(len(shape.rows))), values, lengths, None).to(device)


def lookups(rep: Report, timer: Timer, device: Any, sizes: Sizes, copy_gbs: float) -> None:
    import torch

    for shape in shapes(sizes):
        lookup_shape(rep, timer, device, shape)
        by = {(r["config"], r["method"]): r["value"] for r in rep.records}
        ours = by[(f"{rep.prefix}lookup fwd / {shape.name}", "hugerec")]
        print(f"  {'':<44} {'hugerec / copy bandwidth':<26} {ours / copy_gbs:>14.2f} x", flush=True)
        if timer.cuda:
            torch.cuda.empty_cache()


def lookup_shape(rep: Report, timer: Timer, device: Any, shape: Shape) -> None:
    """One shape: hugerec, then plain PyTorch (each built in its own function, so its memory goes before the next)."""
    features = features_of(shape, device, 1)
    tables = len(shape.rows)
    ids = shape.batch * shape.ids_per_bag * tables
    moved = ids * 8 + ids * shape.dim * 4 + shape.batch * tables * shape.dim * 4  # ids + rows read + output written
    for method, build in (("hugerec", hugerec_lookup), ("pytorch EmbeddingBag", torch_lookup)):
        forward, step = build(shape, features, device)
        ms = timer(forward)
        rep.add(f"lookup fwd / {shape.name}", method, moved / ms / 1e6, "GB/s")
        ms = timer(step)
        rep.add(f"lookup fwd+bwd+update / {shape.name}", method, shape.batch / ms * 1e3, "samples/s")
        del forward, step
    rep.ratio(f"lookup fwd / {shape.name}", "hugerec", "pytorch EmbeddingBag", "hugerec / pytorch")
    rep.ratio(f"lookup fwd+bwd+update / {shape.name}", "hugerec", "pytorch EmbeddingBag", "hugerec / pytorch")


Steps = tuple[Callable[[], Any], Callable[[], Any]]


def hugerec_lookup(shape: Shape, features: Any, device: Any) -> Steps:
    """(forward without grad, forward + backward with the fused Adagrad update) of an EmbeddingCollection."""
    import torch

    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.optimizers import Adagrad
    from hugerec.embedding.table_config import TableConfig

    configs = [TableConfig(f"t{i}", num_rows=r, dim=shape.dim, features=(f"f{i}",)) for i, r in enumerate(shape.rows)]
    emb = EmbeddingCollection(configs, Adagrad(lr=0.01), device=device)
    grad = torch.randn(shape.batch, len(shape.rows) * shape.dim, device=device)

    def forward() -> None:
        with torch.no_grad():
            emb(features)

    def step() -> None:
        (emb(features).values * grad).sum().backward()

    return forward, step


def torch_lookup(shape: Shape, features: Any, device: Any) -> Steps:
    """The same with one nn.EmbeddingBag(sparse=True) per table and torch.optim.Adagrad."""
    import torch
    from torch import nn

    bags = nn.ModuleList(nn.EmbeddingBag(r, shape.dim, mode="sum", sparse=True, device=device) for r in shape.rows)
    opt = torch.optim.Adagrad(bags.parameters(), lr=0.01)
    grad = torch.randn(shape.batch, len(shape.rows) * shape.dim, device=device)
    b = shape.batch
    values, offsets = features.values, features.offsets()
    starts = offsets[::b].tolist()

    def pooled() -> torch.Tensor:
        return torch.cat(
            [
                bag(values[starts[f] : starts[f + 1]], offsets[f * b : (f + 1) * b] - starts[f])
                for f, bag in enumerate(bags)
            ],
            dim=1,
        )

    def forward() -> None:
        with torch.no_grad():
            pooled()

    def step() -> None:
        opt.zero_grad()
        (pooled() * grad).sum().backward()
        opt.step()

    return forward, step


def hash_tables(rep: Report, timer: Timer, device: Any, sizes: Sizes) -> None:
    for load in (0.5, 0.9):
        hash_table_at(rep, timer, device, sizes, load)


def hash_table_at(rep: Report, timer: Timer, device: Any, sizes: Sizes, load: float) -> None:
    import torch

    from hugerec.embedding.hash_table import HashTable
    from hugerec.embedding.table_config import DynamicConfig, Eviction, Missing
    from hugerec.ops.gpu import hash_table_kernels as kernels

    capacity, n = sizes.hash_capacity, sizes.hash_keys
    gen = torch.Generator().manual_seed(7)
    table = HashTable(capacity, DynamicConfig(eviction=Eviction.LRU, missing=Missing.ZEROS), "bench").move(device)
    held = torch.randint(-(2**62), 2**62, (int(load * capacity),), generator=gen).unique().to(device)
    chunk = max(1, capacity // 8)
    for i in range(0, held.shape[0], chunk):
        table.find_or_insert_tensor(held[i : i + chunk], 0)
    t = table.tensors
    assert t is not None
    config = f"load {load}"
    queries = held[torch.randint(0, held.shape[0], (n,), generator=gen).to(device)]
    ms = timer(lambda: table.find_tensor(queries))
    rep.add(f"hash find / {config}", "hugerec", n / ms * 1e3, "keys/s")
    fresh = torch.randint(2**62, 2**63 - 1, (n,), generator=gen).unique().to(device)
    rows = torch.arange(fresh.shape[0], device=device)
    times = []
    for _ in range(sizes.steps):  # the raw insert of new keys, undone (untimed) after each repetition
        times.append(_timed(timer, lambda: kernels.insert_mapping(t.slot_keys, t.slot_rows, fresh, rows)))
        kernels.delete_keys(t.slot_keys, t.slot_rows, fresh)
    rep.add(f"hash insert / {config}", "hugerec", fresh.shape[0] / statistics.median(times) * 1e3, "keys/s")
    # the full training lookup of new keys into free rows (undone by remove, untimed)
    some = fresh[: max(1, min(fresh.shape[0], (capacity - held.shape[0]) // 2))]
    times = []
    for step in range(1, sizes.steps + 1):
        times.append(_timed(timer, functools.partial(table.find_or_insert_tensor, some, step)))
        table.remove(some)
    rep.add(f"hash find_or_insert / {config}", "hugerec", some.shape[0] / statistics.median(times) * 1e3, "keys/s")
    # baseline: a sorted key array
    keys_sorted, _ = torch.sort(held)
    ms = timer(lambda: torch.searchsorted(keys_sorted, queries))
    rep.add(f"hash find / {config}", "torch searchsorted", n / ms * 1e3, "keys/s")
    ms = timer(lambda: torch.sort(torch.cat([keys_sorted, fresh])))
    rep.add(f"hash insert / {config}", "torch cat+sort", fresh.shape[0] / ms * 1e3, "keys/s")
    rep.ratio(f"hash find / {config}", "hugerec", "torch searchsorted", "hugerec / torch")
    rep.ratio(f"hash insert / {config}", "hugerec", "torch cat+sort", "hugerec / torch")


def _timed(timer: Timer, fn: Callable[[], Any]) -> float:
    """One timed call (state-changing work that is undone between repetitions)."""
    import torch

    if timer.cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def dlrm_step(rep: Report, timer: Timer, device: Any, sizes: Sizes, dry: bool) -> None:
    import torch

    dim = 128 if not dry else 16
    rows = [min(r, sizes.dlrm_cap) for r in MLPERF_ROWS][: 3 if dry else None]
    shape = Shape("dlrm", rows, dim, sizes.dlrm_batch, 1, 0.0)
    features = features_of(shape, device, 3)
    gen = torch.Generator().manual_seed(4)
    dense = torch.rand(shape.batch, 13, generator=gen).to(device)
    labels = (torch.rand(shape.batch, generator=gen) < 0.25).float().to(device)
    widths = ([512, 256, dim], [1024, 1024, 512, 256, 1]) if not dry else ([32, dim], [32, 1])
    for method, ms in hugerec_dlrm(timer, shape, features, dense, labels, widths).items():
        rep.add("dlrm step", method, shape.batch / ms * 1e3, "samples/s")
    if timer.cuda:
        torch.cuda.empty_cache()
    ms = torch_dlrm(timer, shape, features, dense, labels, widths)
    rep.add("dlrm step", "pytorch", shape.batch / ms * 1e3, "samples/s")
    rep.ratio("dlrm step", "hugerec", "pytorch", "hugerec / pytorch")
    rep.ratio("dlrm step", "hugerec+cuda-graph", "pytorch", "hugerec+cuda-graph / pytorch")


LR = 1e-3


def hugerec_dlrm(
    timer: Timer, shape: Shape, features: Any, dense: Any, labels: Any, widths: tuple[list[int], list[int]]
) -> dict[str, float]:
    """Step milliseconds of hugerec's DLRM (Adam sparse, fused Adam dense): eager, and the dense part as a CUDA graph."""
    import torch
    from torch import nn

    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.optimizers import Adam
    from hugerec.embedding.table_config import TableConfig
    from hugerec.models.cuda_graph import graph_dense_forward
    from hugerec.models.dlrm import DLRM

    configs = [TableConfig(f"t{i}", num_rows=r, dim=shape.dim, features=(f"f{i}",)) for i, r in enumerate(shape.rows)]
    model = DLRM(EmbeddingCollection(configs, Adam(lr=LR), device=dense.device), 13, *widths).to(dense.device)
    dense_opt = torch.optim.Adam(model.dense_parameters(), lr=LR, fused=timer.cuda)

    def step(dense_fn: Callable[..., torch.Tensor]) -> None:
        loss = nn.functional.binary_cross_entropy_with_logits(dense_fn(dense, model.embed(features)), labels)
        dense_opt.zero_grad(set_to_none=False)
        loss.backward()
        dense_opt.step()

    out = {"hugerec": timer(lambda: step(model.dense_forward))}
    if timer.cuda:  # the dense part as one CUDA graph (static shapes: every batch of this size)
        graphed = graph_dense_forward(model, dense, model.embed(features))
        out["hugerec+cuda-graph"] = timer(lambda: step(graphed))
    return out


def torch_dlrm(
    timer: Timer, shape: Shape, features: Any, dense: Any, labels: Any, widths: tuple[list[int], list[int]]
) -> float:
    """Step milliseconds of plain PyTorch's DLRM: EmbeddingBag(sparse=True) + SparseAdam, bmm interaction, dense Adam."""
    import torch
    from torch import nn

    device, dim, b = dense.device, shape.dim, shape.batch
    bags = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum", sparse=True, device=device) for r in shape.rows)

    def mlp(out_widths: list[int], width_in: int, last_relu: bool) -> nn.Sequential:
        layers: list[nn.Module] = []
        for i, (a, c) in enumerate(zip([width_in, *out_widths[:-1]], out_widths, strict=True)):
            layers += [nn.Linear(a, c)] + ([nn.ReLU()] if i < len(out_widths) - 1 or last_relu else [])
        return nn.Sequential(*layers).to(device)

    f = len(shape.rows) + 1
    bottom, top = mlp(widths[0], 13, True), mlp(widths[1], dim + f * (f - 1) // 2, False)
    li, lj = torch.tril_indices(f, f, offset=-1, device=device)
    sparse_opt = torch.optim.SparseAdam(list(bags.parameters()), lr=LR)
    dense_opt = torch.optim.Adam([*bottom.parameters(), *top.parameters()], lr=LR, fused=timer.cuda)
    values, offsets = features.values, features.offsets()
    starts = offsets[::b].tolist()

    def step() -> None:
        embs = [
            bag(values[starts[i] : starts[i + 1]], offsets[i * b : (i + 1) * b] - starts[i])
            for i, bag in enumerate(bags)
        ]
        x = bottom(dense)
        t = torch.cat([x, *embs], dim=1).view(b, -1, dim)  # [B, F+1, D]
        z = torch.bmm(t, t.transpose(1, 2))[:, li, lj]  # [B, (F+1)F/2]
        loss = nn.functional.binary_cross_entropy_with_logits(top(torch.cat([x, z], dim=1)).squeeze(1), labels)
        sparse_opt.zero_grad()
        dense_opt.zero_grad(set_to_none=False)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()

    return timer(step)


def hbm_cache(rep: Report, timer: Timer, device: Any, sizes: Sizes, dry: bool) -> None:
    import torch

    rows, dim, batch, per_bag = sizes.cache_rows, 128 if not dry else 16, sizes.cache_batch, 8 if not dry else 1
    gen = torch.Generator().manual_seed(5)
    ids = [draw_ids(rows, batch * per_bag, 1.05, gen, device) for _ in range(8)]
    host_weight = torch.rand(rows, dim) * 0.01
    host_state = torch.zeros(rows, 1)
    config = "hbm cache / 25% of the table"
    samples, hit_rate = cached_steps(timer, host_weight, host_state, ids, batch, per_bag, device)
    rep.add(config, "hugerec", samples, "samples/s")
    print(f"  {'':<44} {'hit rate':<26} {hit_rate:>14.3f}", flush=True)
    if timer.cuda:
        torch.cuda.empty_cache()
    weight, state = host_weight.to(device), host_state.to(device)
    rep.add(
        config,
        "all in HBM",
        batch / fused_steps(timer, weight, state, lambda v: v, ids, batch, per_bag) * 1e3,
        "samples/s",
    )
    rep.ratio(config, "hugerec", "all in HBM", "hugerec / all in HBM")


def cached_steps(
    timer: Timer, host_weight: Any, host_state: Any, ids: list[Any], batch: int, per_bag: int, device: Any
) -> tuple[float, float]:
    from hugerec.embedding.hbm_cache import HbmCache

    cache = HbmCache(host_weight, host_state, host_weight.shape[0] // 4, device)
    ms = fused_steps(timer, cache.weight, cache.state, cache.prepare, ids, batch, per_bag)
    return batch / ms * 1e3, cache.stats()["hit_rate"]


def fused_steps(
    timer: Timer, weight: Any, state: Any, rows_of: Callable[[Any], Any], ids: list[Any], batch: int, per_bag: int
) -> float:
    """Milliseconds of one step on `weight`: rows_of(ids) (the cache's prepare, or nothing), the pooled lookup and
    the fused backward with row-wise Adagrad, through hugerec.ops."""
    import torch

    from hugerec import ops
    from hugerec.ops.update_rule import RuleKind, UpdateRule
    from hugerec.ops.workspace import Workspace

    device, dim = weight.device, weight.shape[1]
    offsets = torch.arange(0, batch * per_bag + 1, per_bag, device=device)
    plan = torch.tensor([[0, 0, 0, weight.shape[0], 0, 0, 0]])
    rule = UpdateRule(RuleKind.ROWWISE_ADAGRAD, lr=0.01, eps=1e-8)
    lrs = torch.tensor([0.01], dtype=torch.float64)
    grad = torch.randn(batch, dim, device=device)
    out = torch.empty(batch, dim, device=device)
    workspace = Workspace()
    turn = [0]

    def step() -> None:
        values = rows_of(ids[turn[0] % len(ids)])
        turn[0] += 1
        ops.pooled_lookup(weight, values, offsets, None, plan, dim, out)
        ops.sparse_backward(weight, state, values, offsets, None, plan, dim, batch, False, grad, rule, lrs, workspace)

    return timer(step)


def kernel_tests(budget_s: float) -> bool:
    """The CUDA kernel tests (compile-only checks skipped: the kernels run for real here), in parallel
    processes where pytest-xdist is installed (most of their time is Triton compiling), stopped after
    budget_s so that the figures are still measured inside a short lease."""
    import importlib.util

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "150", "-k", "not compile"]
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(min(8, os.cpu_count() or 1))]
    cmd += KERNEL_TESTS
    print("$", " ".join(cmd), flush=True)
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, timeout=budget_s)
    except subprocess.TimeoutExpired:
        print(f"kernel tests: stopped after {budget_s:.0f} s (--tests-budget)", flush=True)
        return False
    return done.returncode == 0


def main() -> None:
    args = parse()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports the Triton kernels
    import torch

    from hugerec import ops

    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        sys.exit("benchmarks/gpu.py: no CUDA device; run it on a GPU machine, or with --dry-run to check the script")
    if not ops.HAS_TRITON:
        sys.exit("benchmarks/gpu.py: Triton is not installed")
    sizes = DRY if args.dry_run else QUICK if args.quick else FULL
    device = torch.device("cuda" if cuda else "cpu")
    name = torch.cuda.get_device_name(0) if cuda else "cpu (Triton interpreter: no GPU figure)"
    print(f"device: {name}; torch {torch.__version__}; triton {__import__('triton').__version__}", flush=True)
    started = time.perf_counter()
    tests_ok = True
    if cuda and not args.skip_tests:
        tests_ok = kernel_tests(args.tests_budget)
        print(f"kernel tests: {'passed' if tests_ok else 'FAILED'} ({time.perf_counter() - started:.0f} s)", flush=True)
    rep = Report("dry-run " if args.dry_run else "", name, args.json)
    timer = Timer(cuda, sizes)
    forced = ops.triton_on_cpu() if args.dry_run else contextlib.nullcontext()
    with forced:
        for part in (
            lambda: lookups(rep, timer, device, sizes, copy_bandwidth(rep, timer, device, sizes)),
            lambda: hash_tables(rep, timer, device, sizes),
            lambda: dlrm_step(rep, timer, device, sizes, args.dry_run),
            lambda: hbm_cache(rep, timer, device, sizes, args.dry_run),
        ):
            part()
            if cuda:
                torch.cuda.empty_cache()
    print(f"device: {name}; {time.perf_counter() - started:.0f} s in all", flush=True)
    if not tests_ok:
        sys.exit("benchmarks/gpu.py: the CUDA kernel tests failed (figures above were still measured)")


if __name__ == "__main__":
    main()
