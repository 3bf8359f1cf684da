"""Model quality: eval AUC of each hugerec model on `criteo-like` synthetic data against the oracle AUC.

The generator draws labels from a hidden model and reports the oracle AUC (its true click
probabilities scored against the sampled labels): the best any model can reach. Each model trains
one epoch on the same data through the same path as `hugerec train` (synth -> preprocess -> fit)
and is scored on held-out rows; the figure of merit is the share of the oracle's lift over a coin
flip that the model captures: (AUC - 0.5) / (oracle AUC - 0.5). Target: >= 97% for DLRM and DCN-v2
within one epoch of 2 million rows.

    python benchmarks/quality.py                     # 2 M training rows, DLRM, DCN-v2, DeepFM, Wide&Deep
    python benchmarks/quality.py --quick             # 150 k rows, DLRM and DCN-v2 (about a minute)
    python benchmarks/quality.py --json out.json --models dlrm,dcn_v2 --train-rows 1000000
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from hugerec.cli.commands import preprocess, synth, train
from hugerec.cli.run_config import load_run_config

EVAL_FRACTION = 0.1
# Arches sized for 26 tables of dim 16 on a 2-core CPU; the same embedding settings for every model.
MODELS: dict[str, str] = {
    "dlrm": "{type='dlrm', bottom=[128, 64, 16], top=[256, 128, 1]}",
    "dcn_v2": "{type='dcn_v2', num_cross_layers=3, deep=[256, 128]}",
    "deepfm": "{type='deepfm', deep=[256, 128]}",
    "wide_and_deep": "{type='wide_and_deep', deep=[256, 128]}",
}
COMMON = [
    "embedding.dim=16",
    "embedding.optimizer={type='rowwise_adagrad', lr=0.05}",
    "data.batch_size=4096",
    "train.epochs=1",
    "train.lr=0.002",
    "train.log_every=50",
    "train.progress=false",
    "train.tensorboard=false",
    "train.plot=false",
]


def run(train_rows: int, models: list[str], workdir: Path, sparse_lr: float | None = None) -> list[dict[str, Any]]:
    rows = math.ceil(train_rows / (1 - EVAL_FRACTION))
    base = [
        f"synth.rows={rows}",
        f"synth.out={workdir / 'raw'}",
        f"preprocess.input={workdir / 'raw'}",
        f"preprocess.out={workdir / 'data'}",
        f"preprocess.eval_fraction={EVAL_FRACTION}",
        f"data.train={workdir / 'data' / 'train'}",
        f"data.eval={workdir / 'data' / 'eval'}",
        *COMMON,
    ]
    if sparse_lr is not None:
        base.append(f"embedding.optimizer={{type='rowwise_adagrad', lr={sparse_lr}}}")
    cfg = load_run_config(None, base)
    t0 = time.perf_counter()
    report = synth(cfg)
    pre = preprocess(cfg)
    oracle = report.oracle_auc["label"]
    name = f"criteo-like-{pre.train_rows // 1000}k"
    print(
        f"data: {pre.train_rows:,} train / {pre.eval_rows:,} eval rows in {time.perf_counter() - t0:.0f} s, "
        f"oracle AUC {oracle:.4f}",
        flush=True,
    )
    records: list[dict[str, Any]] = [
        {"config": name, "method": "oracle", "value": oracle, "unit": "AUC", "higher_is_better": True}
    ]
    for model in models:
        overrides = [*base, f"model={MODELS[model]}", f"train.out_dir={workdir / model}"]
        t0 = time.perf_counter()
        history = train(load_run_config(None, overrides))
        seconds = time.perf_counter() - t0
        final = history.final_eval
        assert final is not None
        records.append(
            {
                "config": name,
                "method": f"hugerec-{model}",
                "value": final["auc"],
                "unit": "AUC",
                "higher_is_better": True,
                "oracle_auc": oracle,
                "lift_captured": (final["auc"] - 0.5) / (oracle - 0.5),
                "logloss": final["logloss"],
                "calibration": final["calibration"],
                "train_rows": pre.train_rows,
                "eval_rows": pre.eval_rows,
                "train_seconds": seconds,
                "samples_per_s": pre.train_rows / seconds,
            }
        )
        r = records[-1]
        print(
            f"  {model:14s} AUC {r['value']:.4f}  lift captured {r['lift_captured']:6.1%}  "
            f"logloss {r['logloss']:.4f}  ({seconds:.0f} s)",
            flush=True,
        )
    return records


def print_table(records: list[dict[str, Any]]) -> None:
    oracle = next(r for r in records if r["method"] == "oracle")
    print(f"\n{records[0]['config']}: eval AUC vs the oracle AUC {oracle['value']:.4f}")
    print(f"{'method':24s} {'AUC':>7s} {'ours/oracle':>11s} {'lift captured':>14s} {'logloss':>8s} {'calib':>6s}")
    for r in records:
        if r["method"] == "oracle":
            continue
        print(
            f"{r['method']:24s} {r['value']:7.4f} {r['value'] / oracle['value']:11.3f} "
            f"{r['lift_captured']:14.1%} {r['logloss']:8.4f} {r['calibration']:6.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="150 k rows, DLRM and DCN-v2")
    parser.add_argument("--train-rows", type=int, default=None, help="training rows (default 2,000,000)")
    parser.add_argument("--models", default=None, help=f"comma-separated, from {','.join(MODELS)}")
    parser.add_argument("--sparse-lr", type=float, default=None, help="row-wise Adagrad lr of the tables")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the data and models here")
    parser.add_argument("--json", type=Path, default=None, help="write the records here")
    args = parser.parse_args()
    train_rows = args.train_rows or (150_000 if args.quick else 2_000_000)
    models = args.models.split(",") if args.models else (["dlrm", "dcn_v2"] if args.quick else list(MODELS))
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {list(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="hugerec-quality-") as tmp:
        records = run(train_rows, models, args.workdir or Path(tmp), args.sparse_lr)
    print_table(records)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
