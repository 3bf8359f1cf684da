"""Atomic checkpoints in a directory, and the RNG states a run needs to resume exactly.

    run/checkpoints/
      step-0000001000.pt      complete checkpoints, the highest step is the latest
      step-0000002000.pt
      .step-0000003000.tmp    a write in progress (or one a crash interrupted): never read

A checkpoint is written to a temporary file in the same directory, flushed and fsync'ed, then
renamed over its final name with os.replace (atomic on POSIX), and the directory is fsync'ed. A
crash at any point leaves either the previous checkpoints or the new complete one, never a
truncated file under a checkpoint name. It holds only tensors and plain containers of primitives,
so it loads with torch.load(weights_only=True): loading a checkpoint cannot run code.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

_NAME = re.compile(r"^step-(\d{10})\.pt$")


def checkpoint_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:010d}.pt"


def list_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `directory`, oldest first ([] if it does not exist)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def save_checkpoint(directory: str | Path, step: int, state: dict[str, Any], keep_last: int = 3) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the `keep_last` newest (0: keep all)."""
    if step < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0, got {step}")
    if keep_last < 0:
        raise ValueError(f"save_checkpoint: keep_last must be >= 0, got {keep_last}")
    d = Path(directory)
    final = atomic_save(state, checkpoint_path(d, step))
    if keep_last:
        for _, old in list_checkpoints(d)[:-keep_last]:
            old.unlink()
    for stale in d.glob(".step-*.tmp"):  # left behind by a crash mid-write
        stale.unlink(missing_ok=True)
    return final


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


def remove_checkpoints(directory: str | Path) -> None:
    """Delete every checkpoint in `directory` (a fresh run replacing an old one's)."""
    for _, p in list_checkpoints(directory):
        p.unlink()


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by `save_checkpoint` (weights_only: tensors and primitives only)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"load_checkpoint: no checkpoint at {p}")
    try:
        state = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # a corrupt or foreign file: say which one
        raise ValueError(f"load_checkpoint: cannot read {p}: {e}") from e
    if not isinstance(state, dict):
        raise ValueError(f"load_checkpoint: {p} holds a {type(state).__name__}, not a checkpoint dict")
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
