"""`fit`: the one training loop of every deep model family, plus ranking's `evaluate` and `predict`.
A plain loop, no callback framework.

    for each batch:                       (epochs, or until max_steps)
        step = family.prepare(batch)      to the device, negatives drawn, lookups' features built
                                          (the pipeline's worker thread, one batch ahead)
        lr = base_lr * schedule(step)     dense optimizer param groups (and the tables' sparse
                                          optimizers when schedule.sparse)
        loss = family.step_loss(model, step)   autocast: bf16 (CPU/GPU) or fp16 (GPU, with loss scaling)
        loss.backward()                   embedding rows are updated here, by the fused sparse optimizer
        clip + dense optimizer step       any torch.optim optimizer (default Adam)
        log / evaluate / checkpoint       every log_every / eval_every / checkpoint_every steps
    stop early                            after early_stopping.patience evaluations without a new best

The family (hugerec.training.family) supplies the batch, the loss and the validation metrics:
`RankingFamily()` (the default: Batch -> logits [B], BCE, AUC/logloss), `RetrievalFamily` (two-tower, MF: sampled
softmax or BPR, Recall/NDCG@K), `Sequential` (SASRec, masked, GRU4Rec: next-item or masked-item
cross entropy, full or sampled, Recall/NDCG@K). Everything else here is the same for all of them.

Early stopping: every evaluation is scored by `early_stopping.metric` (the family's default when
None); the best one's weights are written atomically to checkpoints/best/ (a checkpoint in the format
of the step-N/ ones, which keep the last weights; a sharded model's ranks write it together) or,
without an out_dir, kept in memory when `restore_best` asks for them back (a sharded model needs the
out_dir for that).

Epoch averaging (average_epochs = K > 1, training/weight_average.py): the model that is evaluated, early-stopped
on, kept as the best, checkpointed as best/ and returned is the mean of the weights at the last K epoch ends
(between epoch ends, the weights as they are count as the newest); training goes on from the raw weights,
which the step-N/ checkpoints keep, with the ring of snapshots in each rank's part.

Resuming continues exactly: a checkpoint holds the model (with the embedding rows and their
optimizer state), the dense optimizer, the step and history, the family and the settings that shape
the result (a resumed run that changes one is refused, naming it), and per rank the loss scaler, the
loader position, the family's generator and every RNG state; the learning-rate schedule is a pure
function of the step (for the dense and the sparse optimizers alike).

Under torch.distributed (torchrun) every rank calls `fit` with its own part of the data: rank 0 alone
shows progress and writes logs, TensorBoard and the plot; logged losses and eval metrics are over all
ranks. Checkpoints are collective, in one format for one process and W ranks (training/checkpoint.py):
a run resumes exactly on as many ranks as wrote the checkpoint; on another number (or sharded another
way) the model, optimizer, step and history are restored, while the data order and random streams
start afresh at that step (the per-rank loader positions and RNG states do not carry over).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from hugerec.distributed.shard import sharded_collections
from hugerec.embedding.fused import sparse_tables
from hugerec.models.gbm import FeatureMatrix, TreeModel
from hugerec.sparse.batch import Batch
from hugerec.training.checkpoint import (
    AVERAGE,
    Resumed,
    best_checkpoint,
    checkpoint_extra,
    find_latest_checkpoint,
    load_checkpoint,
    remove_checkpoints,
    rng_state,
    save_best,
    save_checkpoint,
    set_rng_state,
)
from hugerec.training.early_stopping import BestTracker, EarlyStopping
from hugerec.training.family import Prepared, StepContext, TrainerFamily
from hugerec.training.gbm_fit import tree_metrics
from hugerec.training.metrics import BinaryMetrics
from hugerec.training.pipeline import Pipeline, TieredStats, prepare_batch
from hugerec.training.precision import Precision, autocast, unscale_sparse_gradients
from hugerec.training.retrieval import RetrievalModel, RetrievalValidation, retrieval_metrics
from hugerec.training.run_log import RunLog, plot_curves
from hugerec.training.run_settings import changed_settings, flat_settings
from hugerec.training.schedule import Schedule
from hugerec.training.sequential import NextItemValidation, SequenceModel, next_item_metrics
from hugerec.training.weight_average import EpochAverage


class DenseOptimizer(enum.Enum):
    ADAM = "adam"
    ADAMW = "adamw"
    ADAGRAD = "adagrad"
    SGD = "sgd"


# TrainConfig fields a resumed run may change: how far it goes, what it shows and writes, where it runs.
# Every other field (and the family's settings) shapes the weights: a change is refused, naming it.
RESUMABLE_CHANGES = frozenset(
    {
        "epochs",
        "max_steps",
        "log_every",
        "checkpoint_every",
        "keep_checkpoints",
        "out_dir",
        "resume",
        "device",
        "progress",
        "tensorboard",
        "plot",
        "pipeline",
        "compile",
        "early_stopping.patience",
        "early_stopping.restore_best",
    }
)


@dataclass(frozen=True)
class TrainConfig:
    """How `fit` trains. The sparse (embedding) optimizer is not here: it lives in the EmbeddingCollection.

    epochs            passes over train_data
    max_steps         stop after this many steps in total (None: run all epochs)
    lr                base (peak) learning rate of the dense optimizer. 0.003: with the default linear decay
                      to 0 over the first epoch, 0.001 left DLRM 0.03 AUC short on the Criteo sample
                      (DCN-v2 was as good at 0.001-0.003; benchmarks/quality.py `real criteo auc`)
    optimizer         dense optimizer when `fit` is not given one
    weight_decay      dense optimizer weight decay
    schedule          warmup / decay multiplier on the dense lr (Schedule.mlperf_dlrm(): the MLPerf policy);
                      the embedding tables keep their sparse optimizer's own lr unless schedule.sparse,
                      which scales theirs by the same factor. None: the family's default,
                      for ranking a linear decay to 0 over the first epoch (see Schedule), for retrieval and
                      sequential models a constant lr (Schedule())
    precision         fp32, bf16 (autocast, CPU and GPU) or fp16 (autocast + loss scaling, GPU only)
    compile           torch.compile the dense part of the model (the embedding lookups stay eager)
    clip_grad_norm    clip the dense gradients' global norm to this (None: no clipping)
    eval_every        evaluate every this many steps (None: at the end of each epoch); also at the end
    early_stopping    which evaluation is the best (metric: None = the family's, auc for ranking, recall@10
                      for retrieval and sequential models), when to stop (patience), whether `fit` loads the
                      best weights back at the end (restore_best); see EarlyStopping
    log_every         average the loss and measure samples/s over this many steps
    checkpoint_every  checkpoint every this many steps (None: only the final one); needs out_dir
    keep_checkpoints  keep the newest K checkpoints (0: all)
    out_dir           metrics.jsonl, tensorboard/, curves.png and checkpoints/ go here (None: nothing written);
                      a fresh run (not resumed) replaces what an earlier run left there
    resume            continue from the latest checkpoint in out_dir/checkpoints when there is one (refused
                      when a field outside RESUMABLE_CHANGES or the family's settings differ from its run's)
    device            "auto" (CUDA when available), "cpu", "cuda", "cuda:1", ...
    seed              seeds torch, numpy, random and the family's generator at the start of a fresh run
                      (None: leave the global ones, the family's generator starts from 0)
    progress          show a progress bar
    tensorboard       write TensorBoard scalars (needs out_dir)
    plot              write curves.png at the end (needs out_dir)
    pipeline          prepare batch i + 1 (decode, negatives, dynamic-table remap, disk-tier prefetch) in a
                      worker thread while step i runs (hugerec.training.pipeline; sharded: also the id exchange)
    average_epochs    1: off. K > 1: the model evaluated, kept as the best and returned is the mean of the weights
                      (dense parameters and table rows; not the optimizer state) at the last K epoch ends, while
                      training goes on from the raw weights (training/weight_average.py). Costs K copies of the
                      model's tables and dense parameters in memory and in each checkpoint; refused for disk
                      and dynamic tables; a sharded run's ranks each average their own shard
    """

    epochs: int = 1
    max_steps: int | None = None
    lr: float = 3e-3
    optimizer: DenseOptimizer = DenseOptimizer.ADAM
    weight_decay: float = 0.0
    schedule: Schedule | None = None
    precision: Precision = Precision.FP32
    compile: bool = False
    clip_grad_norm: float | None = None
    eval_every: int | None = None
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    log_every: int = 50
    checkpoint_every: int | None = None
    keep_checkpoints: int = 3
    out_dir: str | None = None
    resume: bool = False
    device: str = "auto"
    seed: int | None = 0
    progress: bool = True
    tensorboard: bool = True
    plot: bool = True
    pipeline: bool = True
    average_epochs: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.average_epochs, bool) or not isinstance(self.average_epochs, int) or self.average_epochs < 1:
            raise ValueError(
                f"TrainConfig: average_epochs must be an int >= 1 (1: no averaging), got {self.average_epochs!r}"
            )
        if isinstance(self.optimizer, str):
            object.__setattr__(self, "optimizer", DenseOptimizer(self.optimizer))
        if isinstance(self.precision, str):
            object.__setattr__(self, "precision", Precision(self.precision))
        if not isinstance(self.early_stopping, EarlyStopping):
            raise ValueError(f"TrainConfig: early_stopping must be an EarlyStopping, got {self.early_stopping!r}")
        if self.schedule is not None and not isinstance(self.schedule, Schedule):
            raise ValueError(f"TrainConfig: schedule must be a Schedule or None, got {self.schedule!r}")
        if self.epochs < 1:
            raise ValueError(f"TrainConfig: epochs must be >= 1, got {self.epochs}")
        for name in ("max_steps", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"TrainConfig: {name} must be >= 1 or None, got {value}")
        if self.log_every < 1:
            raise ValueError(f"TrainConfig: log_every must be >= 1, got {self.log_every}")
        if not self.lr > 0:
            raise ValueError(f"TrainConfig: lr must be > 0, got {self.lr}")
        if not self.weight_decay >= 0:
            raise ValueError(f"TrainConfig: weight_decay must be >= 0, got {self.weight_decay}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"TrainConfig: clip_grad_norm must be > 0 or None, got {self.clip_grad_norm}")
        if self.keep_checkpoints < 0:
            raise ValueError(f"TrainConfig: keep_checkpoints must be >= 0, got {self.keep_checkpoints}")
        if self.out_dir is None and (self.checkpoint_every is not None or self.resume):
            raise ValueError("TrainConfig: checkpoint_every and resume need an out_dir to keep checkpoints in")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(
                    f"TrainConfig: unknown device {self.device!r}; use auto, cpu, cuda or cuda:N"
                ) from None


@dataclass(frozen=True)
class RankingFamily:
    """The ranking family: the model maps a `Batch` to logits [B]; binary cross-entropy on batch.labels;
    evaluated on an iterable of Batch by exact AUC, logloss and calibration (`evaluate`)."""

    name: ClassVar[str] = "ranking"
    metric: ClassVar[str] = "auc"

    @property
    def schedule(self) -> Schedule:
        return Schedule(decay_epochs=1.0, power=1.0)

    def settings(self) -> dict[str, Any]:
        return {}

    def prepare(self, model: nn.Module, batch: Batch, ctx: StepContext) -> Prepared:
        return prepare_batch(batch, ctx.copy)

    def step_loss(self, model: nn.Module, prepared: Prepared, ctx: StepContext) -> torch.Tensor:
        batch: Batch = prepared.inputs
        return _loss(model(batch), batch.labels)

    def evaluate(
        self, model: nn.Module, data: Iterable[Batch], device: torch.device | None, precision: Precision
    ) -> dict[str, float]:
        return batch_metrics(model, data, device=device, precision=precision)


@dataclass
class History:
    """What `fit` did: one record per log window and per evaluation, and where it left things."""

    train: list[dict[str, float]] = field(default_factory=list)  # step, epoch, loss, lr, samples_per_s
    evals: list[dict[str, float]] = field(default_factory=list)  # step, epoch and the family's metrics
    steps: int = 0
    checkpoint: Path | None = None
    plot: Path | None = None
    best_eval: dict[str, float] | None = None  # the best evaluation by early_stopping.metric (step, epoch, ...)
    best_checkpoint: Path | None = None  # checkpoints/best/: the best evaluation's checkpoint (needs out_dir)
    stopped_early: bool = False  # stopped by early_stopping.patience before the epochs / max_steps ran out
    # the run's final model as a checkpoint (needs out_dir; restore_best's is best_checkpoint): `checkpoint` (the
    # last weights), or with average_epochs > 1 checkpoints/average/ (their epoch mean; step-N/ keeps the raw ones)
    model_checkpoint: Path | None = None

    @property
    def final_eval(self) -> dict[str, float] | None:
        return self.evals[-1] if self.evals else None


def fit(
    model: nn.Module,
    train_data: Iterable[Any],
    eval_data: Any = None,
    config: TrainConfig | None = None,
    *,
    family: TrainerFamily | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> History:
    """Train `model` of `family` (default RankingFamily(): Batch -> logits [B], binary cross-entropy) on `train_data`.

    train_data  any re-iterable of the family's batches (one pass per epoch): Batch for ranking,
                (users [B], items [B], history) for retrieval, windows [B, W] for sequential models. When it
                has state_dict() / load_state_dict() (hugerec's loader, EpochBatches do), checkpoints store
                its position; otherwise a resumed run skips the batches the interrupted epoch had used.
    eval_data   the family's validation data: a re-iterable of Batch (ranking), RetrievalValidation,
                NextItemValidation; evaluated at every eval_every steps or epoch end, and at the end
    optimizer   dense optimizer over the model's dense parameters (default: config.optimizer with
                config.lr; none when the model has no dense parameter, e.g. matrix factorisation)
    """
    cfg = config or TrainConfig()
    run = _Run(model, train_data, eval_data, cfg, family or RankingFamily(), optimizer)
    found = find_latest_checkpoint(run.ckpt_dir) if cfg.resume and run.ckpt_dir is not None else None
    if found is not None:
        run.check_resumable(found, checkpoint_extra(found))
        run.resume(load_checkpoint(found, model, run.opt, verified=True))
    else:
        if run.ckpt_dir is not None and run.rank == 0:
            remove_checkpoints(run.ckpt_dir)  # a fresh run replaces an old run's outputs in out_dir (best/ too)
        if run.world > 1:
            dist.barrier()  # no rank writes a checkpoint before rank 0 has cleared the old ones
        if cfg.seed is not None:
            seed_everything(cfg.seed)
    if cfg.compile:
        _compile_dense(model)
    total = cfg.max_steps if cfg.max_steps is not None else _epoch_length(train_data, cfg.epochs)
    show = cfg.progress and run.rank == 0
    # a terminal redraws one bar in place; a file or a CI log gets a plain line per log window and
    # evaluation instead (a bar's carriage returns would make one enormous line of it)
    terminal = sys.stderr.isatty()
    run.bar = tqdm(total=total, initial=run.step, disable=not (show and terminal), unit="step", dynamic_ncols=True)
    run.lines = show and not terminal
    run.total = total
    log_dir = run.out_dir if run.rank == 0 else None
    resume_step = None if found is None else run.step
    run.log = RunLog(log_dir, tensorboard=cfg.tensorboard, append=found is not None, resume_step=resume_step)
    if found is not None:
        run.log.write("resume", run.step, {"epoch": float(run.epoch)})
    done = (cfg.max_steps is not None and run.step >= cfg.max_steps) or run.tracker.stopped
    hooks = [] if run.scaler is None else unscale_sparse_gradients(model, run.scaler)
    try:
        while not done and not run.tracker.stopped and run.epoch < cfg.epochs:
            if run.batches_in_epoch and run.batches_in_epoch == _epoch_length(train_data, 1):
                run.end_epoch()  # resumed from a checkpoint taken after the epoch's last batch
                continue
            batches: Iterator[Any] = iter(train_data)
            if run.batches_in_epoch and run.fast_forward:  # a resumed plain iterable: skip the used batches
                batches = itertools.islice(batches, run.batches_in_epoch, None)
            steps: Iterator[Prepared] = (
                run.pipeline(batches) if run.pipeline is not None else (run.prepare(b) for b in batches)
            )
            for prepared in steps:
                run.train_step(prepared)
                done = cfg.max_steps is not None and run.step >= cfg.max_steps
                if run.window_steps == cfg.log_every or done:
                    run.log_window()
                if cfg.eval_every is not None and run.step % cfg.eval_every == 0:
                    run.evaluate()
                    done = done or run.tracker.stopped
                if done and run.batches_in_epoch == _epoch_length(train_data, 1):
                    run.end_epoch()  # max_steps at an epoch's last batch: that epoch is complete
                if cfg.checkpoint_every is not None and run.step % cfg.checkpoint_every == 0:
                    run.checkpoint()
                if done:
                    break
            else:
                if run.batches_in_epoch == 0:
                    raise ValueError(f"fit: train_data yielded no batches in epoch {run.epoch}")
                run.end_epoch()
        if run.window_steps:
            run.log_window()
        run.evaluate()
        run.checkpoint()
        run.history.model_checkpoint = run.history.checkpoint
        if run.average is not None:  # the checkpoint keeps the raw weights; the model leaves fit with their mean
            run.average.load_average(run.step)
            if run.ckpt_dir is not None:  # collective: a sharded run's whole model, for a reader in one process
                extra = {"step": run.step, "average_epochs": cfg.average_epochs, "family": run.family.name}
                run.history.model_checkpoint = save_best(run.ckpt_dir, model, extra, AVERAGE)
        if run.early_stopping.restore_best:
            run.restore_best()
    finally:
        for hook in hooks:
            hook.remove()
        for tables in run.sparse_tables:  # the model leaves fit with its optimizers' own lr
            tables.set_lr_scale(1.0)
        run.bar.close()
        run.log.close()
    history = run.history
    history.steps = run.step
    history.best_eval = run.tracker.best
    history.stopped_early = run.tracker.stopped
    history.best_checkpoint = None if run.ckpt_dir is None else best_checkpoint(run.ckpt_dir)
    if run.out_dir is not None and cfg.plot and run.rank == 0:
        history.plot = plot_curves(history.train, history.evals, run.out_dir / "curves.png", run.metric)
    return history


class _Run:
    """The mutable state of one `fit` call; `checkpoint()` writes exactly what a resume needs."""

    def __init__(
        self,
        model: nn.Module,
        train_data: Iterable[Any],
        eval_data: Any,
        cfg: TrainConfig,
        family: TrainerFamily,
        optimizer: torch.optim.Optimizer | None,
    ) -> None:
        self.model, self.train_data, self.eval_data, self.cfg, self.family = model, train_data, eval_data, cfg, family
        self.rank, self.world = _rank_and_world()
        self.early_stopping = cfg.early_stopping.for_metric(family.metric)
        self.metric = family.metric if cfg.early_stopping.metric is None else cfg.early_stopping.metric
        self.sharded = bool(sharded_collections(model))
        if self.sharded and cfg.out_dir is None and self.early_stopping.restore_best:
            raise ValueError("fit: restore_best of a sharded model needs an out_dir (its best is kept as a checkpoint)")
        self.device = resolve_device(cfg.device)
        if cfg.precision is Precision.FP16 and self.device.type != "cuda":
            raise ValueError(f"fit: precision fp16 needs a CUDA device (got {self.device}); use bf16 on CPU")
        model.to(self.device)
        model.train()
        # average_epochs > 1: the ring of epoch-end snapshots (refuses disk and dynamic tables, naming the key)
        self.average = EpochAverage(model, cfg.average_epochs) if cfg.average_epochs > 1 else None
        # a hugerec model names its dense parameters; any other module: every trainable parameter
        dense_parameters = getattr(model, "dense_parameters", model.parameters)
        self.params = [p for p in dense_parameters() if p.requires_grad]
        self.opt = optimizer or (_make_optimizer(cfg, self.params) if self.params else None)
        self.base_lrs = [] if self.opt is None else [float(g["lr"]) for g in self.opt.param_groups]
        self.schedule = (cfg.schedule or family.schedule).in_steps(_epoch_length(train_data, 1))
        self.sparse_tables = sparse_tables(model) if self.schedule.sparse else []
        self.scaler = torch.amp.GradScaler("cuda") if cfg.precision is Precision.FP16 else None
        self.autocast = autocast(self.device, cfg.precision)
        self.out_dir = None if cfg.out_dir is None else Path(cfg.out_dir)
        self.ckpt_dir = None if self.out_dir is None else self.out_dir / "checkpoints"
        self.history = History()
        self.tracker = BestTracker(self.early_stopping)
        self.best_state: dict[str, torch.Tensor] | None = None  # without an out_dir: restore_best's copy
        self.step = self.epoch = self.batches_in_epoch = 0
        self.last_eval_step = self.last_checkpoint_step = -1
        self.fast_forward = False  # resuming a plain iterable: skip the batches_in_epoch it already gave
        self.log = RunLog(None)
        self.bar: tqdm[Any] = tqdm(disable=True)
        self.lines = False  # progress as plain lines on stderr (not a terminal), see `fit`
        self.total: int | None = None  # steps of the run, when the data tells its length
        # the current log window: losses summed on the device (no sync per step), samples and wall time
        self.window_loss = torch.zeros((), device=self.device)
        self.window_steps = self.window_samples = 0
        self.window_start = time.perf_counter()
        # the family's random draws (negatives, masks): its own stream, in batch order, kept in checkpoints
        generator = torch.Generator().manual_seed(0 if cfg.seed is None else cfg.seed)
        group = None
        if self.world > 1:  # the families' per-step collectives, apart from DDP's and the lookups' groups
            group = dist.new_group(list(range(self.world)))
        self.ctx = StepContext(self.device, generator, self.rank, self.world, group)
        self.pipeline = Pipeline(model, self.device, self._boundary, self.prepare) if cfg.pipeline else None
        self.tiered = TieredStats(model, self.pipeline)

    def prepare(self, batch: Any) -> Prepared:
        return self.family.prepare(self.model, batch, self.ctx)

    def _boundary(self) -> bool:
        """Whether the trainer evaluates, checkpoints or stops after the step it is about to take."""
        cfg, step = self.cfg, self.step + 1
        return any(every is not None and step % every == 0 for every in (cfg.eval_every, cfg.checkpoint_every)) or (
            cfg.max_steps is not None and step >= cfg.max_steps
        )

    def train_step(self, prepared: Prepared) -> None:
        factor = self.schedule.factor(self.step)
        if self.opt is not None:
            for group, base in zip(self.opt.param_groups, self.base_lrs, strict=True):
                group["lr"] = base * factor
        for tables in self.sparse_tables:  # schedule.sparse: the same factor on the rows' updates in backward
            tables.set_lr_scale(factor)
        with self.autocast:
            loss = self.family.step_loss(self.model, prepared, self.ctx)
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        clip = self.cfg.clip_grad_norm
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.opt is not None:
                if clip is not None:
                    self.scaler.unscale_(self.opt)
                    nn.utils.clip_grad_norm_(self.params, clip)
                self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            if self.opt is not None:
                if clip is not None:
                    nn.utils.clip_grad_norm_(self.params, clip)
                self.opt.step()
        self.step += 1
        self.batches_in_epoch += 1
        self.window_loss += loss.detach()
        self.window_steps += 1
        self.window_samples += prepared.examples
        self.bar.update(1)

    def end_epoch(self) -> None:
        self.epoch, self.batches_in_epoch = self.epoch + 1, 0
        if self.average is not None:
            self.average.push(self.step)
        if self.cfg.eval_every is None:
            self.evaluate()

    def lr(self) -> float:
        if self.opt is not None:
            return float(self.opt.param_groups[0]["lr"])
        return self.cfg.lr * self.schedule.factor(max(self.step - 1, 0))

    def say(self, text: str) -> None:
        """One progress line on stderr, where there is no terminal to draw the bar on."""
        if self.lines:
            of = f"/{self.total:,}" if self.total is not None else ""
            print(f"step {self.step:,}{of}: {text}", file=sys.stderr, flush=True)

    def log_window(self) -> None:
        mean_loss = float(self.window_loss) / self.window_steps
        samples = float(self.window_samples)
        if self.world > 1:  # every rank logs (and checks) the mean loss over all ranks
            totals = torch.stack([self.window_loss.detach().float(), torch.full_like(self.window_loss, samples)])
            dist.all_reduce(totals)
            mean_loss = float(totals[0]) / (self.window_steps * self.world)
            samples = float(totals[1])
        if not math.isfinite(mean_loss):
            raise FloatingPointError(
                f"fit: training diverged, loss is {mean_loss} at step {self.step}; try a lower learning rate"
            )
        elapsed = time.perf_counter() - self.window_start
        record = {
            "epoch": float(self.epoch),
            "loss": mean_loss,
            "lr": self.lr(),
            "samples_per_s": samples / max(elapsed, 1e-9),
        }
        record.update(self.tiered.window(self.window_steps))
        self.history.train.append({"step": float(self.step), **record})
        self.log.write("train", self.step, record)
        self.bar.set_postfix_str(_postfix(self.history, self.metric), refresh=False)
        self.say(_postfix(self.history, self.metric))
        self.window_loss.zero_()
        self.window_steps = self.window_samples = 0
        self.window_start = time.perf_counter()

    def evaluate(self) -> None:
        if self.eval_data is None or self.last_eval_step == self.step:
            return
        started = time.perf_counter()
        was_training = self.model.training
        with self.averaged(), _preserved_rng():  # evaluation must not shift the training run's random stream
            try:
                result = self.family.evaluate(self.model, self.eval_data, self.device, self.cfg.precision)
            finally:
                self.model.train(was_training)
            record = {"step": float(self.step), "epoch": float(self.epoch), **result}
            self.history.evals.append(record)
            self.log.write("eval", self.step, result)
            best = self.tracker.update(record)
            if best:
                self.save_best()
        self.bar.set_postfix_str(_postfix(self.history, self.metric), refresh=False)
        if self.metric in record:
            self.say(f"eval {self.metric}={record[self.metric]:.4f}{' (best)' if best else ''}")
        self.last_eval_step = self.step
        self.window_start += time.perf_counter() - started  # keep evaluation time out of samples/s

    @contextmanager
    def averaged(self) -> Iterator[None]:
        """average_epochs > 1: the mean of the last epoch ends' weights in the model inside the block (evaluated
        and saved as the best), the raw ones back after it; else nothing changes."""
        if self.average is None:
            yield
            return
        with self.average.averaged(self.step):
            yield

    def save_best(self) -> None:
        """The weights of the evaluation just made, as the best: checkpoints/best/ (collective), or a copy in memory."""
        if self.ckpt_dir is not None:
            extra = {"step": self.step, "eval": dict(self.tracker.best or {}), "family": self.family.name}
            save_best(self.ckpt_dir, self.model, extra)
        elif self.early_stopping.restore_best:
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def restore_best(self) -> None:
        """Load the best evaluation's weights back into the model (the last ones are checkpointed already)."""
        if self.tracker.best is None:
            return
        if self.ckpt_dir is not None:
            best = best_checkpoint(self.ckpt_dir)
            assert best is not None  # save_best wrote it at the best evaluation (and ended in a barrier)
            load_checkpoint(best, self.model)  # each rank reads its part
        else:
            assert self.best_state is not None  # save_best kept it at the best evaluation
            self.model.load_state_dict(self.best_state)

    def settings(self) -> dict[str, Any]:
        """What a resumed run must keep: the family, its settings and the TrainConfig fields outside
        RESUMABLE_CHANGES, as flat JSON (dotted keys)."""
        cfg = dataclasses.replace(self.cfg, schedule=self.cfg.schedule or self.family.schedule)
        flat = {k: v for k, v in flat_settings(cfg).items() if k not in RESUMABLE_CHANGES}
        flat["early_stopping.metric"] = self.metric
        flat.update({f"family.{k}": v for k, v in flat_settings(self.family.settings()).items()})
        return flat

    def checkpoint(self) -> None:
        """Collective: every rank writes its part of checkpoints/step-N/ (rank 0 keeps the newest keep_checkpoints)."""
        if self.ckpt_dir is None or self.last_checkpoint_step == self.step:
            return
        loader = _stateful(self.train_data, "state_dict")
        extra = {
            "step": self.step,
            "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch,
            "history": {"train": self.history.train, "evals": self.history.evals},
            "early_stopping": self.tracker.state_dict(),
            "family": self.family.name,
            "settings": self.settings(),
        }
        rank_state = {
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "loader": None if loader is None else loader.state_dict(),
            "rng": rng_state(),
            "generator": self.ctx.generator.get_state(),
            "average": None if self.average is None else self.average.state_dict(),
        }
        self.history.checkpoint = save_checkpoint(
            self.ckpt_dir, self.step, self.model, self.opt, extra, rank_state, keep_last=self.cfg.keep_checkpoints
        )
        self.last_checkpoint_step = self.step

    def check_resumable(self, path: Path, extra: Any) -> None:
        """Refuse, before anything is loaded, a checkpoint that fit did not write, of another family, or
        of a run whose settings this one changes (naming the changed keys)."""
        if not isinstance(extra, dict) or not {"step", "epoch", "batches_in_epoch", "history"} <= extra.keys():
            raise ValueError(f"fit: {path} is a checkpoint, but not one written by fit (its extra: {extra!r:.80})")
        saved_family = extra.get("family", "ranking")  # checkpoints from before the families were ranking's
        if saved_family != self.family.name:
            raise ValueError(
                f"fit: {path} is a checkpoint of a {saved_family} model; this run trains a {self.family.name} model "
                "(resume with the same model family, or start a fresh run in another out_dir)"
            )
        saved = extra.get("settings")
        if not isinstance(saved, dict):
            return  # written before settings were kept: nothing to compare
        # keys added after a checkpoint was written count as the value that did what the run did before them
        detail = changed_settings(saved, self.settings(), {"schedule.sparse": False, "average_epochs": 1})
        if detail is not None:
            raise ValueError(
                f"fit: cannot resume {path}: the config changed ({detail}); "
                "resume with the run's settings or start a fresh run (resume=false)"
            )

    def resume(self, resumed: Resumed) -> None:
        """The rest of the run's state, after load_checkpoint has loaded the model and the optimizer."""
        extra = resumed.extra
        self.step, self.epoch = int(extra["step"]), int(extra["epoch"])
        self.batches_in_epoch = int(extra["batches_in_epoch"])
        self.history.train = list(extra["history"]["train"])
        self.history.evals = list(extra["history"]["evals"])
        self.last_eval_step = int(self.history.evals[-1]["step"]) if self.history.evals else -1
        if "early_stopping" in extra:  # checkpoints from before early stopping have none
            self.tracker.load_state_dict(extra["early_stopping"])
        self.last_checkpoint_step = self.step
        state = resumed.rank_state
        if state is None and self.average is not None:
            raise ValueError(
                f"fit: cannot resume {resumed.path} with average_epochs = {self.cfg.average_epochs} on another number "
                "of ranks: each rank's ring of epoch snapshots is its own shard's; resume on the ranks that wrote it"
            )
        if state is None:  # written by a group of another size: no rank's stream is ours, start anew here
            if self.cfg.seed is not None:
                seed_everything(self.cfg.seed + self.step)
                self.ctx.generator.manual_seed(self.cfg.seed + self.step)
            self.fast_forward = True
            return
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        if state.get("generator") is not None:
            self.ctx.generator.set_state(state["generator"])
        if state["loader"] is not None:
            _stateful(self.train_data, "load_state_dict").load_state_dict(state["loader"])
        if self.average is not None:
            self.average.load_state_dict(state["average"])
        self.fast_forward = state["loader"] is None


@torch.no_grad()
def evaluate(
    model: nn.Module | RetrievalModel | SequenceModel | TreeModel,
    data: Iterable[Batch] | RetrievalValidation | NextItemValidation | FeatureMatrix,
    *,
    ks: Sequence[int] | None = None,
    device: torch.device | str | None = None,
    precision: Precision = Precision.FP32,
    threads: int = 0,
) -> dict[str, float]:
    """The metrics of `model` on `data`; the one evaluation of every family, chosen by what `data` is (the
    data each family validates on):

      batches              ranking: exact AUC, logloss, calibration, CTR and count (batch_metrics)
      RetrievalValidation  retrieval: full ranking of the catalogue, Recall / NDCG / MRR / HitRate /
                           coverage at each of `ks` (default 10, 50; retrieval.retrieval_metrics)
      NextItemValidation   sequential: the next item's rank over the catalogue at each of `ks` (default
                           10, 20; sequential.next_item_metrics)
      FeatureMatrix        trees: the binary metrics, or NDCG / MAP / MRR at ks[0] (default 10) per query for
                           a ranking objective, on `threads` threads (gbm_fit.tree_metrics)
    """
    match data:
        case RetrievalValidation():
            return retrieval_metrics(model, data.users, data.history, data.held_out, data.exclude, tuple(ks or (10, 50)))  # type: ignore[arg-type]
        case NextItemValidation():
            return next_item_metrics(model, data.histories, data.targets, data.exclude, tuple(ks or (10, 20)), times=data.times)  # type: ignore[arg-type]
        case FeatureMatrix():
            if not isinstance(model, TreeModel):
                raise TypeError(f"evaluate: a FeatureMatrix is the data of trees, not of a {type(model).__name__}")
            return tree_metrics(model, data, threads, ks[0] if ks else 10)
    if not isinstance(model, nn.Module):
        raise TypeError(f"evaluate: batches are the data of a ranking model, not of a {type(model).__name__}")
    return batch_metrics(model, data, device=device, precision=precision)


def batch_metrics(
    model: nn.Module,
    data: Iterable[Batch],
    *,
    device: torch.device | str | None = None,
    precision: Precision = Precision.FP32,
) -> dict[str, float]:
    """Exact AUC, logloss, calibration (mean predicted / observed CTR), CTR and count over all of `data`.

    Under torch.distributed (world_size > 1) every rank passes its own part of the data (the same
    number of batches: a sharded model's lookups are collective) and gets the metrics over all ranks'
    examples: the logits and labels are all-gathered before computing them.
    """
    metrics = BinaryMetrics()
    world = _rank_and_world()[1]
    local: list[tuple[torch.Tensor, torch.Tensor]] = []
    for batch, logits in _score(model, data, device, precision):
        metrics.update(logits.float(), batch.labels)
        if world > 1:
            local.append((logits.float().cpu(), batch.labels.cpu()))
    if world > 1:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, local)
        metrics = BinaryMetrics()
        for part in parts:
            for logits, labels in part:
                metrics.update(logits, labels)
    if metrics.count == 0:
        raise ValueError("evaluate: the evaluation data yielded no examples")
    return metrics.compute()


@torch.no_grad()
def predict(
    model: nn.Module,
    data: Iterable[Batch],
    *,
    device: torch.device | str | None = None,
    precision: Precision = Precision.FP32,
) -> Iterator[torch.Tensor]:
    """Click probabilities, one CPU float32 tensor [B] per batch of `data`, in order."""
    for _, logits in _score(model, data, device, precision):
        yield torch.sigmoid(logits.float()).cpu()


def resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _score(
    model: nn.Module, data: Iterable[Batch], device: torch.device | str | None, precision: Precision
) -> Iterator[tuple[Batch, torch.Tensor]]:
    dev = _model_device(model) if device is None else resolve_device(device)
    was_training = model.training
    model.eval()
    try:
        with autocast(dev, precision):
            for batch in data:
                b = batch.to(dev, non_blocking=True)
                yield b, model(b)
    finally:
        model.train(was_training)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape != labels.shape:
        raise ValueError(
            f"fit: the model returned logits of shape {tuple(logits.shape)} for labels of shape {tuple(labels.shape)}"
        )
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def _make_optimizer(cfg: TrainConfig, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    match cfg.optimizer:
        case DenseOptimizer.ADAM:
            return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        case DenseOptimizer.ADAMW:
            return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        case DenseOptimizer.ADAGRAD:
            return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        case DenseOptimizer.SGD:
            return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _compile_dense(model: nn.Module) -> None:
    """torch.compile the part of `model` after the embedding lookups.

    hugerec models (RecModel) compile their tensor-only dense part and keep the lookups eager (their
    backward runs the fused sparse optimizer, which torch.compile must not trace); any other module
    is compiled whole, in place, so its state_dict keys (and checkpoints) stay the same.
    """
    compile_dense = getattr(model, "compile_dense", None)
    if callable(compile_dense):
        compile_dense()
    else:
        model.compile()


def _rank_and_world() -> tuple[int, int]:
    """(rank, world_size) under torch.distributed, (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _model_device(model: nn.Module) -> torch.device:
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")


def _stateful(data: Iterable[Batch], method: str) -> Any:
    """`data` if it has the method (a resumable loader), else None."""
    return data if callable(getattr(data, method, None)) else None


def _epoch_length(data: Iterable[Batch], epochs: int) -> int | None:
    try:
        return epochs * len(data)  # type: ignore[arg-type]  # a Sized iterable tells us its length
    except TypeError:
        return None


@contextmanager
def _preserved_rng() -> Iterator[None]:
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def _postfix(history: History, metric: str) -> str:
    parts = []
    if history.train:
        last = history.train[-1]
        parts += [f"loss={last['loss']:.4f}", f"{last['samples_per_s']:,.0f} samples/s"]
        if "cache_hit_rate" in last:  # the disk tier, per step: hit rate, rows read and written
            parts.append(
                f"hit={last['cache_hit_rate']:.0%} read={last['disk_rows_read']:,.0f} "
                f"wrote={last['disk_rows_written']:,.0f}"
            )
        if "prefetch_hidden" in last:  # the pipeline: preparation per step, and the share hidden behind it
            parts.append(f"prefetch={last['prefetch_ms']:.1f}ms hidden={last['prefetch_hidden']:.0%}")
    if history.evals and metric in history.evals[-1]:
        parts.append(f"{metric}={history.evals[-1][metric]:.4f}")
    return " ".join(parts)
