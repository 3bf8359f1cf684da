"""Checkpoints of a run, one format for one process and for W sharded ranks, resumable on any number of ranks.

    run/checkpoints/
      step-0000001000/            complete checkpoints, the highest step is the latest; each one is
      step-0000002000/            hugerec.distributed.checkpoint_directory's directory: index.json + rank-R.pt
      .step-0000003000.tmp/       a write in progress (or one a crash interrupted): never read
      step-0000000900.damaged/    a checkpoint that failed its checksums, set aside on resume
      best/                       the best evaluation's weights (`save_best`; the trainer's early stopping),
                                  in the same format: read it with `load_checkpoint` like any other
      average/                    the weights `fit` returned when it averaged epochs (`save_best(..., AVERAGE)`:
                                  the mean of the last epoch ends; the step-N/ ones keep the raw weights)

`save_checkpoint` is collective (every rank calls it; one process is a group of one) and atomic: the
ranks write into the temporary directory, rank 0 renames it into place once every file and the index
are on disk. A checkpoint holds the model (embedding tables in global coordinates, so that a group
of another size, or one process, can read it), the dense optimizer, the caller's JSON `extra`, and
per rank its `rank_state` (RNG states, loader position): a group of the same size resumes exactly.
Every file is checked against its sha256 and read with torch.load(weights_only=True): loading a
checkpoint cannot run code, and a damaged one is named instead of loading as wrong weights.

`atomic_save` / `read_weights` are the single-file versions (the model file uses them): torch.save
behind an atomic rename, and a read that checks every zip member's CRC-32 first.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hugerec.distributed import checkpoint_directory as directory_format

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step-(\d{10})$")
BEST = "best"  # the best evaluation's checkpoint, beside the step-N/ ones
AVERAGE = "average"  # the epoch-averaged weights fit returned (TrainConfig.average_epochs > 1)


@dataclass(frozen=True)
class Resumed:
    """What `load_checkpoint` read besides the model and optimizer (which it loaded in place)."""

    path: Path
    extra: Any  # the JSON given to save_checkpoint
    rank_state: dict[str, Any] | None  # this rank's, when saved by a group of this size; else None


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:010d}"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `directory`, oldest first ([] if it does not exist)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m and directory_format.is_checkpoint(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    directory: str | Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Any = None,
    rank_state: Mapping[str, Any] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write the checkpoint of `step` (collective, atomic); keep the `keep_last` newest (0: keep all).

    model: sharded or not; extra: JSON-able; rank_state: this rank's tensors and plain data.
    """
    if step < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0, got {step}")
    if keep_last < 0:
        raise ValueError(f"save_checkpoint: keep_last must be >= 0, got {keep_last}")
    d = Path(directory)
    final = directory_format.save_checkpoint_dir(checkpoint_path(d, step), model, optimizer, extra, rank_state)
    if _rank() == 0:
        if keep_last:
            for _, old in list_checkpoints(d)[:-keep_last]:
                shutil.rmtree(old)
        for stale in d.glob(".step-*.tmp"):  # left behind by a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()  # nobody lists the directory while rank 0 prunes it
    return final


def load_checkpoint(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *, verified: bool = False
) -> Resumed:
    """Load the checkpoint at `path` into `model` (sharded any way, or not) and `optimizer`.

    FileNotFoundError when there is none; ValueError (one line, naming the file) when it is damaged or
    does not fit the model. verified: its checksums were just checked (verify_checkpoint); not again.
    """
    p = Path(path)
    extra = directory_format.load_checkpoint_dir(p, model, optimizer, verified)
    return Resumed(p, extra, directory_format.load_rank_state(p))


def load_latest_checkpoint(
    directory: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> Resumed | None:
    """Load the newest intact checkpoint in `directory` (None when there is none at all); see
    `find_latest_checkpoint` for how damaged ones are handled."""
    path = find_latest_checkpoint(directory)
    return None if path is None else load_checkpoint(path, model, optimizer, verified=True)


def find_latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest intact checkpoint in `directory`, its files' checksums verified (None when there is none).

    Every rank checks the candidates' checksums (all of them get the same answer); a damaged one is
    reported in one line (a logged warning), renamed `<name>.damaged` by rank 0 so that it no longer
    poses as a checkpoint, and the next older one is tried. ValueError if none is intact.
    """
    found = list_checkpoints(directory)
    damaged: list[tuple[Path, str]] = []
    chosen = None
    for _, path in reversed(found):
        try:
            directory_format.verify_checkpoint(path)
        except ValueError as e:
            damaged.append((path, str(e)))
            continue
        chosen = path
        break
    _barrier()  # every rank has verified before any checkpoint is renamed
    if _rank() == 0:
        for path, message in damaged:
            aside = path.with_name(path.name + ".damaged")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(path, aside)
            log.warning("%s; moved to %s, resuming from the checkpoint before it", message, aside.name)
    if chosen is None and found:
        raise ValueError(f"load_latest_checkpoint: none of the {len(found)} checkpoints in {directory} is intact")
    return chosen


def checkpoint_extra(path: str | Path) -> Any:
    """The JSON `extra` a checkpoint was saved with, read from its index alone (no weights loaded)."""
    return directory_format.read_extra(path)


def save_best(directory: str | Path, model: nn.Module, extra: Any = None, name: str = BEST) -> Path:
    """Write `model` (sharded or not) as `directory`/best/ (or `name`: AVERAGE), replacing the previous one:
    collective and atomic like save_checkpoint, in its format (no optimizer, no rank state); `load_checkpoint`
    reads it on any number of ranks or in one process."""
    if name not in (BEST, AVERAGE):
        raise ValueError(f"save_best: name must be {BEST!r} or {AVERAGE!r}, got {name!r}")
    return directory_format.save_checkpoint_dir(Path(directory) / name, model, None, extra)


def best_checkpoint(directory: str | Path) -> Path | None:
    """`directory`/best/ when `save_best` has completed one there, else None."""
    path = Path(directory) / BEST
    return path if directory_format.is_checkpoint(path) else None


def remove_checkpoints(directory: str | Path) -> None:
    """Delete every checkpoint in `directory`, the best and set-aside damaged ones included (a fresh run
    replacing an old one's)."""
    d = Path(directory)
    if not d.is_dir():
        return
    for p in d.iterdir():
        doomed = _NAME.match(p.name) or p.name.endswith(".damaged") or p.name.startswith((".step-", f".{BEST}.", f".{AVERAGE}."))
        if p.is_dir() and (doomed or p.name in (BEST, AVERAGE)):
            shutil.rmtree(p)


def atomic_save(obj: Any, path: str | Path) -> Path:
    """torch.save `obj` to `path` so that a crash leaves the old file or the new one, never half of one."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.stem}.tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def read_weights(path: str | Path, caller: str, what: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A dict written by torch.save, checked and read without running code: the zip CRC-32 of every
    member, then torch.load(weights_only=True). Errors name `caller`, the file and what it should be."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{caller}: no {what} at {p}")
    try:
        with zipfile.ZipFile(p) as archive:
            bad = archive.testzip()  # reads every member, compares its CRC-32 with the directory's
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise ValueError(f"{caller}: {p} is damaged or not a {what} ({e})") from None
    if bad is not None:
        raise ValueError(f"{caller}: {p} is damaged (checksum mismatch in {bad})")
    try:
        state = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # a foreign file, or a pickle that is not plain data: say which one
        message = " ".join(str(e).split())[:300]
        raise ValueError(f"{caller}: cannot read {p} as a {what}: {type(e).__name__}: {message}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{caller}: {p} holds a {type(state).__name__}, not a {what}")
    return state


def rng_state() -> dict[str, Any]:
    """torch (CPU and every CUDA device), numpy and Python `random` states, as tensors and primitives."""
    kind, keys, pos, has_gauss, cached_gaussian = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(x: Any) -> Any:
    """Tuples -> lists, recursively (the weights_only unpickler is happiest with plain lists)."""
    if isinstance(x, tuple):
        return [_to_lists(v) for v in x]
    return x


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
