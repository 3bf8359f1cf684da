"""Training, scoring and recommending with the sequential models (SASRec, MaskedTransformer, GRU4Rec).

    model = SASRec(SequenceConfig(num_items=I, max_len=50))
    fit_sequential(model, last_n(train, window_width(model)), SequentialTrainConfig(loss=FullSoftmax(), epochs=20))
    metrics = evaluate_next_item(model, histories, targets, exclude=None, ks=(10, 20))
    top_items = recommend_next(model, [np.array([5, 17, 3])], k=10)

Losses (a closed union, consumed by one `match`):
  FullSoftmax     cross entropy over items 1..I: [N, I] logits for the N trained positions of a batch;
                  for catalogues small enough for that (the MovieLens and YOOCHOOSE samples)
  SampledSoftmax  (hugerec.training.losses) in-batch and/or sampled negatives with logQ correction;
                  [N, N + M] logits, never [N, I]: the loss for huge catalogues
  BCE             classic SASRec: one uniform negative per position, binary cross entropy
Next-item models (Objective.NEXT) train every position t of the last max_len + 1 items to predict
t + 1; the masked model (Objective.MASKED) trains the masked positions of the last max_len items.
Item rows are updated by the model's sparse optimizer inside the backward; the dense parameters
(positions, attention, GRU) by torch.optim.Adam here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hugerec.models.masked import mask_items
from hugerec.models.sequence import PAD, Objective, SequenceConfig
from hugerec.training.losses import NegativeSampler, SampledSoftmax, sampled_softmax
from hugerec.training.next_item import CSR, rank_metrics, target_ranks


@dataclass(frozen=True)
class FullSoftmax:
    """Cross entropy over the whole catalogue (small catalogues only: materialises [N, I])."""


@dataclass(frozen=True)
class BCE:
    """Binary cross entropy of each position's next item against one uniformly drawn negative."""


SequenceLoss = FullSoftmax | SampledSoftmax | BCE


class SequenceModel(Protocol):
    """What SASRec, MaskedTransformer and GRU4Rec have in common (three implementations)."""

    cfg: SequenceConfig
    objective: Objective

    def __call__(self, seq: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...
    def query(self, history: torch.Tensor) -> torch.Tensor: ...
    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor: ...
    def parameters(self) -> object: ...
    def train(self, mode: bool = True) -> nn.Module: ...


@dataclass(frozen=True)
class SequentialTrainConfig:
    """loss        FullSoftmax() | SampledSoftmax(...) | BCE()
    epochs         passes over the training sequences
    batch_size     sequences per step
    lr             dense Adam learning rate (the item table uses the model's sparse optimizer)
    mask_prob      masked model only: fraction of items masked
    max_steps      stop after this many steps (None: all epochs)
    seed           shuffling, masking and negative sampling
    """

    loss: SequenceLoss = field(default_factory=FullSoftmax)
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    mask_prob: float = 0.2
    max_steps: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"SequentialTrainConfig: {name} must be an int >= 1, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"SequentialTrainConfig: lr must be > 0, got {self.lr}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"SequentialTrainConfig: mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"SequentialTrainConfig: max_steps must be >= 1 or None, got {self.max_steps}")


@dataclass(frozen=True)
class TrainReport:
    steps: int
    samples: int  # sequences trained on
    seconds: float
    losses: tuple[float, ...]  # mean loss per epoch

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def window_width(model: SequenceModel) -> int:
    """W, the training window: the last max_len + 1 items for next-item models (inputs and shifted targets), max_len for masked."""
    return model.cfg.max_len + (1 if model.objective is Objective.NEXT else 0)


def fit_sequential(
    model: SequenceModel,
    windows: np.ndarray | torch.Tensor,
    cfg: SequentialTrainConfig,
    item_counts: np.ndarray | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> TrainReport:
    """Train on windows [S, W] (dense item ids 1..I, left-padded with PAD; `hugerec.data.sessions.last_n`
    of the training sequences with W = window_width(model)) and report steps, samples, time and losses.

    item_counts [I + 1] (index = item id) sets the popularity negatives and logQ of SampledSoftmax
    (default: counted from the windows). on_epoch(epoch, mean loss) runs after each epoch (in eval mode;
    training resumes in train mode), e.g. to score a validation split.
    """
    windows = torch.as_tensor(windows, dtype=torch.int64)
    if windows.dim() != 2 or windows.shape[1] != window_width(model):
        raise ValueError(f"fit_sequential: windows must be [S, {window_width(model)}], got shape {tuple(windows.shape)}")
    windows = windows[(windows != PAD).sum(dim=1) >= 2]  # a window needs an input and a target
    if not len(windows):
        raise ValueError("fit_sequential: no training sequence has 2 or more items")
    num_items = model.cfg.num_items
    if int(windows.max()) > num_items:
        raise ValueError(f"fit_sequential: item ids must be in 1..{num_items}, got {int(windows.max())}")
    counts = np.bincount(windows.reshape(-1).numpy(), minlength=num_items + 1) if item_counts is None else item_counts
    counts = counts.astype(np.float64).copy()
    counts[PAD] = 0.0
    sampler = NegativeSampler(cfg.loss, counts) if isinstance(cfg.loss, SampledSoftmax) else None
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(list(model.parameters()), lr=cfg.lr)  # type: ignore[call-overload]  # Protocol's parameters()
    model.train()
    steps, samples, losses = 0, 0, []
    start = time.perf_counter()
    for _ in range(cfg.epochs):
        order = torch.randperm(len(windows), generator=gen)
        total, n = 0.0, 0
        for b0 in range(0, len(order), cfg.batch_size):
            batch = windows[order[b0 : b0 + cfg.batch_size]]
            loss = step_loss(model, batch, cfg, sampler, gen)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n = total + float(loss.detach()), n + 1
            steps, samples = steps + 1, samples + len(batch)
            if cfg.max_steps is not None and steps >= cfg.max_steps:
                break
        losses.append(total / max(n, 1))
        if cfg.max_steps is not None and steps >= cfg.max_steps:
            break
        if on_epoch is not None:
            model.train(False)
            on_epoch(len(losses) - 1, losses[-1])
            model.train()
    model.train(False)
    return TrainReport(steps, samples, time.perf_counter() - start, tuple(losses))


def step_loss(
    model: SequenceModel, batch: torch.Tensor, cfg: SequentialTrainConfig, sampler: NegativeSampler | None, gen: torch.Generator
) -> torch.Tensor:
    """The loss of one batch of windows [B, W] (left-padded dense ids)."""
    match model.objective:
        case Objective.NEXT:
            seq, target = batch[:, :-1], batch[:, 1:]  # [B, L]: position t predicts t + 1
            valid = (seq != PAD) & (target != PAD)
        case Objective.MASKED:
            seq, target = mask_items(batch, model.cfg.mask_id, cfg.mask_prob, gen)
            valid = target != PAD
    tgt = target[valid]  # [N]
    n = tgt.numel()
    num_items = model.cfg.num_items
    match cfg.loss:
        case FullSoftmax():
            hidden, rows = model(seq, torch.arange(1, num_items + 1))
            logits = hidden[valid] @ rows.T  # [N, I]
            return F.cross_entropy(logits, tgt - 1)
        case SampledSoftmax(logq=logq):
            assert sampler is not None
            neg = sampler.sample(n, gen)  # [M]
            hidden, rows = model(seq, torch.cat([tgt, neg]))
            log_q = sampler.log_q(torch.cat([tgt, neg]), n) if logq else None
            return sampled_softmax(hidden[valid], rows[:n], tgt, rows[n:], neg, log_q, sampler.uses_in_batch)
        case BCE():
            neg = torch.randint(1, num_items + 1, (n,), generator=gen)
            hidden, rows = model(seq, torch.cat([tgt, neg]))
            h = hidden[valid]
            pos_logit, neg_logit = (h * rows[:n]).sum(1), (h * rows[n:]).sum(1)
            keep = (neg != tgt).to(h.dtype)  # a negative equal to the target is no negative
            return -(F.logsigmoid(pos_logit) + F.logsigmoid(-neg_logit) * keep).mean()


def all_item_vectors(model: SequenceModel, block: int = 65536) -> torch.Tensor:
    """[I, D] rows of items 1..I (row i - 1 is item i)."""
    with torch.no_grad():
        ids = torch.arange(1, model.cfg.num_items + 1)
        return torch.cat([model.item_vectors(ids[i : i + block]) for i in range(0, len(ids), block)])


def query_vectors(model: SequenceModel, histories: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """[Q, L] left-padded histories -> [Q, D] next-item query vectors (eval mode, no gradient)."""
    model.train(False)
    with torch.no_grad():
        return torch.cat([model.query(histories[i : i + block]) for i in range(0, len(histories), block)] or [torch.empty(0)])


def evaluate_next_item(
    model: SequenceModel,
    histories: np.ndarray,
    targets: np.ndarray,
    exclude: CSR | None = None,
    ks: Sequence[int] = (10, 20),
    block: int = 1024,
) -> dict[str, float]:
    """Full-ranking next-item metrics (see hugerec.training.next_item) of histories [Q, L] -> targets [Q]."""
    items = all_item_vectors(model)
    queries = query_vectors(model, torch.from_numpy(histories), block)

    def score(q0: int, q1: int) -> torch.Tensor:
        return queries[q0:q1] @ items.T  # [q, I]

    return rank_metrics(target_ranks(score, targets, model.cfg.num_items, exclude, block), ks)


def recommend_next(
    model: SequenceModel, histories: Sequence[np.ndarray], k: int = 10, exclude_history: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k next items for each history (dense ids, oldest first; longer than max_len: the last max_len are used).

    Returns (items [Q, k] int64, scores [Q, k]). An empty history is an error (it has nothing to go on).
    """
    if k < 1:
        raise ValueError(f"recommend_next: k must be >= 1, got {k}")
    for i, h in enumerate(histories):
        if len(h) == 0:
            raise ValueError(f"recommend_next: history {i} is empty (no known item); nothing to predict from")
    num_items, max_len = model.cfg.num_items, model.cfg.max_len
    padded = np.full((len(histories), max_len), PAD, dtype=np.int64)  # [Q, L], left-padded, the last max_len items
    for i, h in enumerate(histories):  # one row copy per history (not per item)
        tail = np.asarray(h, dtype=np.int64)[-max_len:]
        if int(tail.min()) < 1 or int(tail.max()) > num_items:
            raise ValueError(f"recommend_next: history {i}: item ids must be in 1..{num_items}, got range {int(tail.min())}..{int(tail.max())}")
        padded[i, max_len - len(tail) :] = tail
    scores = query_vectors(model, torch.from_numpy(padded)) @ all_item_vectors(model).T  # [Q, I]
    if exclude_history:
        for i, h in enumerate(histories):
            scores[i, torch.as_tensor(np.asarray(h, dtype=np.int64) - 1)] = float("-inf")
    top = torch.topk(scores, min(k, num_items), dim=1)
    return (top.indices + 1).numpy(), top.values.numpy()
