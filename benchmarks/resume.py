"""kill -9 and resume: a two-tower and a SASRec on MovieLens-100k, killed at three points, end bit for bit
where the uninterrupted run ends.

    python benchmarks/resume.py [--quick] [--json PATH]

Each model is trained by `fit` (the one trainer; pipeline on, checkpoints every half epoch, an
evaluation on the validation split every half epoch plus one step) for 3 epochs, once without
interruption, then three times killed with SIGKILL and resumed with train.resume: while the pipeline
prepares a batch mid-epoch (`mid-epoch`), while a checkpoint is being written (its rank file written,
its index not: `mid-checkpoint`), and while an evaluation runs (`mid-evaluation`). Each record is
the fraction of the model's state-dict tensors (dense weights, embedding rows, their optimizer state)
that equal the uninterrupted run's bit for bit: 1.0 = identical. `resume two_tower` and `resume
sasrec` are the minimum over the three points; the reference side (`uninterrupted`) is 1.0 by
definition. --quick: the first 300 users, smaller models.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data"))
POINTS = ("mid-epoch", "mid-checkpoint", "mid-evaluation")


def record(config: str, method: str, value: float, unit: str, higher: bool = True) -> dict[str, Any]:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


# -- the worker: one training run, optionally stopped at a point ---------------------------------------
def setup(kind: str, quick: bool) -> tuple[Any, Any, Any, Any, int]:
    """(build, data, validation, family, steps per epoch) of one model kind on MovieLens-100k."""
    import gzip

    import numpy as np
    import polars as pl
    import torch

    from hugerec.data.interactions import (
        categorify,
        held_out_csr,
        histories,
        iter_examples,
        last_items,
        leave_last_out,
    )
    from hugerec.data.sessions import ItemVocabulary, group_sequences, last_n
    from hugerec.data.sessions import leave_last_out as sequences_leave_last_out
    from hugerec.embedding.optimizers import Adam
    from hugerec.models.sasrec import SASRec
    from hugerec.models.sequence import SequenceConfig
    from hugerec.models.two_tower import Similarity, TwoTower, TwoTowerConfig
    from hugerec.training.epoch_batches import EpochBatches
    from hugerec.training.losses import SampledSoftmax
    from hugerec.training.retrieval import RetrievalFamily, RetrievalValidation
    from hugerec.training.sequential import FullSoftmax, NextItemValidation, SequentialFamily, window_batches

    with gzip.open(DATA / "movielens" / "ml-100k" / "u.data.gz", "rb") as f:
        raw = pl.read_csv(f.read(), separator="\t", has_header=False, new_columns=["user", "item", "rating", "timestamp"])
    if quick:
        raw = raw.filter(pl.col("user") <= 300)
    dim = 16 if quick else 32
    if kind == "two_tower":
        data, _ = categorify(raw)
        train, valid = leave_last_out(data)
        seen = histories(train)
        users = torch.arange(data.num_users)
        validation: RetrievalValidation | NextItemValidation = RetrievalValidation(users, last_items(*seen, users.numpy(), 20), held_out_csr(valid), seen)
        steps = -(-train.num_events // 512)
        batches: EpochBatches[Any] = EpochBatches(lambda e: iter_examples(train, 512, 20, seed=e), steps)
        config = TwoTowerConfig(dim=dim, embedding_dim=dim, user_layers=(64,), max_history=20, recent=(1, 5), similarity=Similarity.COSINE, temperature=0.05)

        def build() -> Any:
            torch.manual_seed(0)
            return TwoTower(config, data.num_users, data.num_items, Adam(lr=0.01))

        return build, batches, validation, RetrievalFamily(train.item_counts(), SampledSoftmax(num_negatives=256, mask_history=True)), steps
    seqs = group_sequences(raw.select("user", "item", "timestamp"), key="user", drop_repeats=False)
    vocab = ItemVocabulary.fit(seqs.items)
    encoded, _ = vocab.encode(seqs, min_length=2)
    train_seqs, targets = sequences_leave_last_out(encoded)
    windows = last_n(train_seqs, 21)
    validation = NextItemValidation(last_n(train_seqs, 20), targets, (train_seqs.offsets, train_seqs.items))
    batches = window_batches(windows, 64, seed=0)

    def build_sasrec() -> Any:
        torch.manual_seed(0)
        return SASRec(SequenceConfig(num_items=vocab.num_items, max_len=20, dim=dim, num_layers=1, dropout=0.2), Adam(lr=0.005))

    del np
    return build_sasrec, batches, validation, SequentialFamily(FullSoftmax()), len(batches)


def worker(out: str, kind: str, quick: bool, point: str, resume: bool) -> None:
    import hugerec.distributed.checkpoint_directory as directory
    from hugerec.training.early_stopping import EarlyStopping
    from hugerec.training.trainer import TrainConfig, fit

    build, data, validation, family, steps = setup(kind, quick)
    half = max(1, steps // 2)

    def stop_here() -> None:
        Path(out + ".marker").write_text(point)
        time.sleep(3600)

    if point == "mid-epoch":  # stop while preparing a batch of the second epoch, between checkpoints
        inner, taken = data.make, [0]

        def make(epoch: int) -> Any:
            for batch in inner(epoch):
                taken[0] += 1
                if taken[0] == steps + half + 2:
                    stop_here()
                yield batch

        data.make = make
    elif point == "mid-checkpoint":  # the third checkpoint: its rank file written, its index not
        checksum, seen = directory._sha256, [0]

        def hooked(path: Path) -> str:
            if path.parent.name.startswith(".step-"):
                seen[0] += 1
                if seen[0] == 3:
                    stop_here()
            return checksum(path)

        directory._sha256 = hooked
    elif point == "mid-evaluation":  # the third evaluation
        evaluate, calls = family.evaluate, [0]

        def slow_evaluate(*args: Any) -> Any:
            calls[0] += 1
            if calls[0] == 3:
                stop_here()
            return evaluate(*args)

        object.__setattr__(family, "evaluate", slow_evaluate)
    cfg = TrainConfig(
        epochs=3, lr=1e-3, eval_every=half + 1, checkpoint_every=half, keep_checkpoints=2, out_dir=out, resume=resume,
        seed=0, progress=False, tensorboard=False, early_stopping=EarlyStopping(patience=None),
    )
    fit(build(), data, validation, cfg, family=family)


# -- the driver -----------------------------------------------------------------------------------------
def launch(out: Path, kind: str, quick: bool, point: str, resume: bool) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HUGEREC_DATA": str(DATA)}
    args = [sys.executable, __file__, "--worker", str(out), kind, point, "1" if resume else "0"] + (["--quick"] if quick else [])
    return subprocess.Popen(args, env=env)


def final_state(out: Path, kind: str, quick: bool) -> dict[str, Any]:
    from hugerec.training.checkpoint import latest_checkpoint, load_checkpoint

    model = setup(kind, quick)[0]()
    path = latest_checkpoint(out / "checkpoints")
    assert path is not None
    load_checkpoint(path, model)
    return dict(model.state_dict())


def same_share(a: dict[str, Any], b: dict[str, Any]) -> float:
    import torch

    return sum(k in b and torch.equal(v, b[k]) for k, v in a.items()) / len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the first 300 users, smaller models")
    parser.add_argument("--json", help="write the records to this JSON file")
    parser.add_argument("--worker", nargs=4, metavar=("OUT", "KIND", "POINT", "RESUME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        out, kind, point, resume = args.worker
        worker(out, kind, args.quick, point, resume == "1")
        return
    if not (DATA / "movielens" / "ml-100k").is_dir():
        raise SystemExit(f"benchmarks/resume.py: {DATA / 'movielens' / 'ml-100k'} not found; set HUGEREC_DATA")
    print(f"resume after kill -9 ({'quick' if args.quick else 'full'}), load {os.getloadavg()[0]:.1f}", flush=True)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for kind in ("two_tower", "sasrec"):
            start = time.perf_counter()
            assert launch(root / f"{kind}-whole", kind, args.quick, "none", False).wait() == 0
            want = final_state(root / f"{kind}-whole", kind, args.quick)
            print(f"  {kind}: uninterrupted run in {time.perf_counter() - start:.0f} s", flush=True)
            shares = []
            for point in POINTS:
                out = root / f"{kind}-{point}"
                proc = launch(out, kind, args.quick, point, False)
                marker = Path(str(out) + ".marker")
                while not marker.is_file():
                    if proc.poll() is not None:
                        raise SystemExit(f"benchmarks/resume.py: the {kind} run ended before {point}")
                    time.sleep(0.05)
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                assert launch(out, kind, args.quick, "none", True).wait() == 0
                share = same_share(want, final_state(out, kind, args.quick))
                shares.append(share)
                print(f"    killed {point}, resumed: {share:.3f} of {len(want)} tensors bit for bit equal", flush=True)
                records.append(record(f"resume {kind} {point}", "hugerec-fit", share, "fraction identical"))
            records.append(record(f"resume {kind}", "hugerec-fit", min(shares), "fraction identical"))
            records.append(record(f"resume {kind}", "uninterrupted", 1.0, "fraction identical"))
    print(f"  load {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
