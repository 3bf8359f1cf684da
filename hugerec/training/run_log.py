"""Where a run's numbers go: a JSON-lines log, TensorBoard scalars and, at the end, a PNG of the curves.

out_dir/metrics.jsonl   one JSON object per line: {"split": "train" | "eval", "step": ..., ...}
out_dir/tensorboard/    scalars "train/loss", "eval/auc", ... (tensorboard --logdir out_dir)
out_dir/curves.png      training loss and eval logloss (left), eval AUC (right) against step
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any


class RunLog:
    """Appends records to metrics.jsonl and TensorBoard; both optional (out_dir None: keeps nothing)."""

    def __init__(self, out_dir: str | Path | None, tensorboard: bool = True, append: bool = False) -> None:
        """append=False starts the log afresh (metrics.jsonl and TensorBoard scalars of an old run are removed)."""
        self.out_dir = None if out_dir is None else Path(out_dir)
        self._file = None
        self._tb: Any = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if not append:
                shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)
            mode = "a" if append else "w"
            self._file = open(self.out_dir / "metrics.jsonl", mode, encoding="utf-8")  # noqa: SIM115 (closed in close())
            if tensorboard:
                from tensorboardX import SummaryWriter  # imported lazily: it pulls in protobuf

                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))

    def write(self, split: str, step: int, values: dict[str, float]) -> None:
        if self._file is not None:
            record = {"split": split, "step": step, **{k: _json_number(v) for k, v in values.items()}}
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._tb is not None:
            for key, v in values.items():
                if key != "epoch" and math.isfinite(v):
                    self._tb.add_scalar(f"{split}/{key}", v, step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def plot_curves(train: Sequence[dict[str, float]], evals: Sequence[dict[str, float]], path: str | Path) -> Path:
    """PNG with the training loss and eval logloss (left) and eval AUC (right) against step."""
    import matplotlib

    matplotlib.use("Agg")  # no display: works on servers and in CI
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1)
    if evals:
        steps = [r["step"] for r in evals]
        ax_loss.plot(steps, [r["logloss"] for r in evals], "o-", label="eval logloss")
        ax_auc.plot(steps, [r["auc"] for r in evals], "o-", color="tab:green", label="eval AUC")
    ax_loss.set(xlabel="step", ylabel="logloss", title="loss")
    ax_auc.set(xlabel="step", ylabel="AUC", title="eval AUC")
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _json_number(v: float) -> float | None:
    """JSON has no NaN/inf: write null instead of invalid JSON."""
    return v if math.isfinite(v) else None
