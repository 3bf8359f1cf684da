"""Data pipeline: the hugerec loader against the usual PyTorch approach, plus the preprocessing records.

    python benchmarks/data.py [--quick] [--json PATH]

Dataset: the `criteo-like` synthetic preset (label + 13 dense + 26 sparse, Criteo Kaggle
cardinalities and missing rates), written as Parquet shards by the generator; batch size 8192.

Methods, each timed from construction (file reading included) to the last batch:
    hugerec           hugerec.data.load(...): Arrow decode (and, shuffled, the window's permutation:
                      a Numba scatter of the ids, np.take of the dense rows) and NumPy batch assembly
                      on two background threads; yields Batch(dense [B, 13], SparseFeatures, labels [B])
    torch-dataloader  the usual user code: pandas.read_parquet, NumPy arrays, a map-style Dataset
                      whose __getitem__ returns one row, torch.utils.data.DataLoader(batch_size=8192)
                      with the default collate (dense, [B, 26] ids with -1 for missing, labels).
                      Per-row Python is slow, so after the pandas read it runs a fixed number of
                      batches; its epoch time = read time + (time per row of those batches) x rows.
Configs: loader/criteo-like/sequential (shuffle=False) and loader/criteo-like/shuffled
(shuffle=True: row-group order + a 131,072-row shuffle window for hugerec, a full permutation for
the baseline). loader/criteo-like/memory: peak resident-memory growth while hugerec's shuffled
epoch runs in a fresh process (peak RSS, read after every batch, minus RSS before the loader is made),
against the size of the dataset it reads: about 2-3 shuffle windows of 131,072 rows, whatever the size.
The preprocessing records come from benchmarks/data_preprocess.py (`run(quick)`), when present.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, Dataset

from hugerec.data.loader import load
from hugerec.data.schema import Schema
from hugerec.data.synthetic import generate, preset

BATCH = 8192


def _record(config: str, method: str, value: float, unit: str, higher_is_better: bool, **extra: Any) -> dict[str, Any]:
    return {
        "config": config,
        "method": method,
        "value": value,
        "unit": unit,
        "higher_is_better": higher_is_better,
        **extra,
    }


class _Rows(Dataset[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """What a user typically writes: one example per __getitem__."""

    def __init__(self, frame: pd.DataFrame, dense: list[str], sparse: list[str], label: str) -> None:
        self.dense = np.array(frame[dense].to_numpy(np.float32))
        self.sparse = np.array(frame[sparse].fillna(-1).to_numpy(np.int64))
        self.labels = np.array(frame[label].to_numpy(np.float32))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]), torch.tensor(self.labels[i])


def _hugerec(paths: list[Path], schema: Any, shuffle: bool) -> tuple[float, int]:
    """(seconds, rows) for one epoch."""
    start = time.perf_counter()
    rows = 0
    for batch in load(paths, schema, BATCH, shuffle=shuffle, seed=0):
        rows += batch.batch_size
    return time.perf_counter() - start, rows


def _memory_child(directory: str) -> None:
    """Runs in a fresh process: resident memory before the loader exists, and its peak (read after every
    batch) over a shuffled epoch."""
    paths = sorted(Path(directory).glob("*.parquet"))
    schema = Schema.load(Path(directory) / "schema.json")
    base = _rss()
    peak, rows = base, 0
    for b in load(paths, schema, BATCH, shuffle=True, seed=0):
        rows += b.batch_size
        peak = max(peak, _rss())
    json.dump({"rows": rows, "base_rss": base, "peak_rss": peak}, sys.stdout)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _memory(directory: Path) -> dict[str, Any]:
    code = "import sys; sys.path.insert(0, sys.argv[1]); from data import _memory_child; _memory_child(sys.argv[2])"
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.run(
        [sys.executable, "-c", code, here, str(directory)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"loader memory run failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def _baseline(paths: list[Path], schema: Any, shuffle: bool, batches: int) -> tuple[float, int]:
    """(estimated seconds for a whole epoch, rows): the pandas read, plus `batches` batches timed and
    scaled to the epoch (per-row Python makes a full epoch take minutes)."""
    start = time.perf_counter()
    frame = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    data = _Rows(frame, list(schema.dense_names), list(schema.sparse_names), schema.label_names[0])
    loader = DataLoader(data, batch_size=BATCH, shuffle=shuffle, generator=torch.Generator().manual_seed(0))
    read_seconds = time.perf_counter() - start
    start = time.perf_counter()
    timed = 0
    for i, (dense, ids, labels) in enumerate(loader):
        assert dense.shape[1] == len(schema.dense) and ids.shape[1] == len(schema.sparse)
        timed += labels.shape[0]
        if i + 1 == batches:
            break
    per_row = (time.perf_counter() - start) / timed
    return read_seconds + per_row * len(data), len(data)


def loader_records(rows: int, baseline_batches: int, tmp: Path) -> list[dict[str, Any]]:
    cfg = preset("criteo-like", rows, seed=0)
    start = time.perf_counter()
    report = generate(cfg, tmp / "criteo-like")
    gen_seconds = time.perf_counter() - start
    dataset_mib = sum(p.stat().st_size for p in report.paths) / 2**20
    schema = report.schema
    # Warm-up: page cache, Arrow/NumPy first calls, Numba kernels (compiled on first use when not cached).
    for shuffle in (False, True):
        for i, _ in enumerate(load(report.paths, schema, BATCH, shuffle=shuffle)):
            if i == 4:
                break
    records = [
        _record(
            "data/generate-criteo-like", "hugerec", rows / gen_seconds, "rows/s", True,
            rows=rows, seconds=round(gen_seconds, 2), oracle_auc=round(report.oracle_auc["label"], 4),
        )
    ]  # fmt: skip
    for name, shuffle in (("sequential", False), ("shuffled", True)):
        seconds, served = _hugerec(report.paths, schema, shuffle)
        base_seconds, base_rows = _baseline(report.paths, schema, shuffle, baseline_batches)
        config = f"loader/criteo-like/{name}"
        extra = {"batch_size": BATCH, "dataset_rows": rows}
        records.append(_record(config, "hugerec", served / seconds, "rows/s", True, seconds=round(seconds, 2), **extra))
        records.append(
            _record(
                config, "torch-dataloader", base_rows / base_seconds, "rows/s", True,
                seconds_estimated=round(base_seconds, 2), batches_timed=baseline_batches, **extra,
            )
        )  # fmt: skip
    mem = _memory(tmp / "criteo-like")
    decoded_mib = rows * (4 + 4 * len(schema.dense) + 8 * len(schema.sparse)) / 2**20
    records.append(
        _record(
            "loader/criteo-like/memory", "hugerec", (mem["peak_rss"] - mem["base_rss"]) / 2**20,
            "MiB peak RSS growth", False, dataset_rows=mem["rows"], dataset_mib_on_disk=round(dataset_mib, 1),
            dataset_mib_decoded=round(decoded_mib), rss_before_loader_mib=round(mem["base_rss"] / 2**20),
            peak_rss_mib=round(mem["peak_rss"] / 2**20),
        )
    )  # fmt: skip
    return records


def preprocess_records(quick: bool) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        import data_preprocess  # sibling script, not a package
    except ImportError as e:
        print(f"note: benchmarks/data_preprocess.py not importable ({e}); preprocessing records skipped")
        return []
    records: list[dict[str, Any]] = data_preprocess.run(quick)
    return records


def _print_table(records: list[dict[str, Any]]) -> None:
    by_config: dict[str, dict[str, dict[str, Any]]] = {}
    for r in records:
        by_config.setdefault(r["config"], {})[r["method"]] = r
    print(f"{'config':40} {'method':18} {'value':>14} unit")
    for config, methods in by_config.items():
        for method, r in methods.items():
            print(f"{config:40} {method:18} {float(r['value']):14,.1f} {r['unit']}")
        baselines = [m for m in methods if not m.startswith("hugerec")]
        for ours in (m for m in methods if m.startswith("hugerec") and baselines):
            base = baselines[0]
            ratio = float(methods[ours]["value"]) / float(methods[base]["value"])
            target = " (target >= 5)" if config.startswith("loader") else " (target >= 3)"
            print(f"{config:40} {'ratio':18} {ratio:14.2f} {ours} / {base}{target}")
        if config == "loader/criteo-like/memory":
            r = methods["hugerec"]
            print(
                f"  shuffled epoch over {r['dataset_rows']:,} rows ({r['dataset_mib_on_disk']} MiB Parquet, "
                f"{r['dataset_mib_decoded']} MiB as tensors): RSS {r['rss_before_loader_mib']} MiB before the "
                f"loader -> {r['peak_rss_mib']} MiB peak (bounded by shuffle_buffer, not the dataset)"
            )


def run(quick: bool) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="hugerec-bench-data-") as tmp:
        records = loader_records(1 << 19 if quick else 1 << 22, 4 if quick else 24, Path(tmp))
    return records + preprocess_records(quick)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    parser.add_argument("--json", type=Path, help="write the records to this JSON file")
    args = parser.parse_args()
    records = run(args.quick)
    _print_table(records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
