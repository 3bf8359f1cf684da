"""Where a run's numbers go: a JSON-lines log, TensorBoard scalars and, at the end, a PNG of the curves.

out_dir/metrics.jsonl   one JSON object per line: {"split": "train" | "eval", "step": ..., ...}
out_dir/tensorboard/    scalars "train/loss", "eval/auc", ... (tensorboard --logdir out_dir)
out_dir/curves.png      training loss and eval logloss (left), the early-stopping metric (right) against step
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any


class RunLog:
    """Appends records to metrics.jsonl and TensorBoard; both optional (out_dir None: keeps nothing)."""

    def __init__(
        self, out_dir: str | Path | None, tensorboard: bool = True, append: bool = False, resume_step: int | None = None
    ) -> None:
        """append=False starts the log afresh (metrics.jsonl and TensorBoard scalars of an old run are removed).

        resume_step (with append): the step of the checkpoint a run resumes from; what the interrupted
        run logged after it (its steps are run again) is removed from metrics.jsonl and TensorBoard.
        """
        self.out_dir = None if out_dir is None else Path(out_dir)
        self._file = None
        self._tb: Any = None
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            if not append:
                shutil.rmtree(self.out_dir / "tensorboard", ignore_errors=True)
            elif resume_step is not None:
                truncate_log(self.out_dir / "metrics.jsonl", resume_step)
            mode = "a" if append else "w"
            self._file = open(self.out_dir / "metrics.jsonl", mode, encoding="utf-8")  # noqa: SIM115 (closed in close())
            if tensorboard:
                from tensorboardX import SummaryWriter  # imported lazily: it pulls in protobuf

                purge = None if not append or resume_step is None else resume_step + 1
                self._tb = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=purge)

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


def truncate_log(path: Path, step: int) -> None:
    """Keep the records of metrics.jsonl up to `step` (and none torn by a crash mid-line); atomically."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line of a run killed while writing it
        if isinstance(record, dict) and isinstance(record.get("step"), int | float) and record["step"] <= step:
            kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def plot_curves(
    train: Sequence[dict[str, float]], evals: Sequence[dict[str, float]], path: str | Path, metric: str = "auc"
) -> Path:
    """PNG with the training loss and eval logloss (left) and the eval `metric` (right; AUC for
    ranking, e.g. recall@10 for retrieval and sequential models) against step."""
    import matplotlib

    matplotlib.use("Agg")  # no display: works on servers and in CI
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss", lw=1)
    if evals:
        steps = [r["step"] for r in evals]
        if all("logloss" in r for r in evals):
            ax_loss.plot(steps, [r["logloss"] for r in evals], "o-", label="eval logloss")
        if all(metric in r for r in evals):
            ax_auc.plot(steps, [r[metric] for r in evals], "o-", color="tab:green", label=f"eval {metric}")
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_auc.set(xlabel="step", ylabel=metric, title=f"eval {metric}")
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
