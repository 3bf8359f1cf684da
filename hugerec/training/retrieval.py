"""Training and evaluating retrieval models (TwoTower, MatrixFactorization): fit, item vectors, top-K, metrics.

    history = fit_retrieval(model, lambda epoch: iter_examples(train, 1024, 50, seed=epoch), item_counts,
                            RetrievalTrainConfig(epochs=10))
    items = all_item_vectors(model)                                   # [I, D] for the index
    scores, ids = recommend(model, users, user_history, k=10, exclude=train_csr)
    metrics = evaluate_retrieval(model, users, user_history, held_out, exclude, ks=(10, 50))

A step: user vectors [B, D] for the batch, item vectors [B + M, D] for its positives and the sampled
negatives in one lookup, then the loss; dense parameters (MLPs) step with torch Adam, the embedding
rows with the collections' own sparse optimizers inside the backward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from hugerec.index.topk import top_k
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.losses import BPR, NegativeSampler, RetrievalLoss, SampledSoftmax, bpr, sampled_softmax
from hugerec.training.ranking_metrics import CSR, csr_minus, list_metrics

RetrievalModel = TwoTower | MatrixFactorization
Example = tuple[torch.Tensor, torch.Tensor, JaggedTensor]  # users [B], target items [B], history


@dataclass(frozen=True)
class RetrievalTrainConfig:
    """epochs, dense lr (torch Adam on the towers' MLPs), the loss, the seed of the negative sampler."""

    epochs: int = 10
    lr: float = 1e-3
    loss: RetrievalLoss = field(default_factory=SampledSoftmax)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"RetrievalTrainConfig: epochs must be >= 1, got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"RetrievalTrainConfig: lr must be > 0, got {self.lr}")


def train_step(model: RetrievalModel, batch: Example, sampler: NegativeSampler, generator: torch.Generator) -> torch.Tensor:
    """Forward and loss of one batch (the caller runs backward and the dense optimizer step)."""
    users, items, history = batch
    b = users.numel()
    neg_ids = sampler.sample(b, generator)
    query = model.user_vectors(users, history)  # [B, D]
    cand = model.item_vectors(torch.cat([items, neg_ids]))  # [B + M, D]
    pos, neg = cand[:b], cand[b:]
    match sampler.loss:
        case SampledSoftmax(logq=logq, mask_history=mask_history):
            log_q = sampler.log_q(torch.cat([items, neg_ids]), b) if logq else None
            exclude = (torch.repeat_interleave(torch.arange(b), history.lengths.to(torch.int64)), history.values) if mask_history else None
            return sampled_softmax(query, pos, items, neg, neg_ids, log_q, sampler.uses_in_batch, model.temperature, exclude)
        case BPR():
            return bpr(query, pos, items, neg, neg_ids, model.temperature)


def fit_retrieval(
    model: RetrievalModel,
    batches: Callable[[int], Iterable[Example]],
    item_counts: np.ndarray,
    config: RetrievalTrainConfig,
    on_epoch: Callable[[int, float, float], None] | None = None,
) -> list[float]:
    """Trains `model` for config.epochs over `batches(epoch)`; returns the mean loss of each epoch.

    on_epoch(epoch, mean_loss, seconds) is called after each epoch (logging, evaluation, early stop).
    """
    sampler = NegativeSampler(config.loss, item_counts)
    generator = torch.Generator().manual_seed(config.seed)
    dense = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(dense, lr=config.lr) if dense else None
    model.train()
    losses = []
    for epoch in range(config.epochs):
        start, total, n = time.perf_counter(), 0.0, 0
        for batch in batches(epoch):
            loss = train_step(model, batch, sampler, generator)
            if opt is not None:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            if opt is not None:
                opt.step()
            total, n = total + float(loss.detach()), n + 1
        losses.append(total / max(n, 1))
        if on_epoch is not None:
            on_epoch(epoch, losses[-1], time.perf_counter() - start)
    model.eval()
    return losses


@torch.no_grad()
def all_item_vectors(model: RetrievalModel, block: int = 65536) -> torch.Tensor:
    """[I, D] float32 vectors of every item id 0..I-1 (what the index is built from)."""
    was = model.training
    model.eval()
    out = torch.cat([model.item_vectors(torch.arange(i, min(i + block, model.num_items))) for i in range(0, model.num_items, block)])
    model.train(was)
    return out.float()


@torch.no_grad()
def user_vectors(model: RetrievalModel, users: torch.Tensor, history: JaggedTensor, block: int = 4096) -> torch.Tensor:
    """[U] users and their histories -> [U, D] in blocks (eval mode, no update)."""
    was = model.training
    model.eval()
    offsets = np.concatenate([[0], np.cumsum(history.lengths.numpy())]).astype(np.int64)
    parts = []
    for lo in range(0, users.numel(), block):
        hi = min(lo + block, users.numel())
        h = JaggedTensor(history.values[offsets[lo] : offsets[hi]], history.lengths[lo:hi])
        parts.append(model.user_vectors(users[lo:hi], h))
    model.train(was)
    return torch.cat(parts).float() if parts else torch.empty(0, model.dim)


@dataclass(frozen=True)
class Recommendations:
    """Top-k per user: scores [U, k], items [U, k] (-1 where fewer than k items were left), and
    cold [U]: True where the user was unknown to the model and got the popularity ranking instead."""

    scores: torch.Tensor
    items: torch.Tensor
    cold: torch.Tensor


def recommend(
    model: RetrievalModel,
    users: torch.Tensor,
    history: JaggedTensor,
    k: int,
    exclude: CSR | None = None,
    item_counts: np.ndarray | None = None,
) -> Recommendations:
    """Exact top-k items per user by the model's inner product; exclude: CSR of items not to return per user.

    A user id outside 0..num_users-1 (never seen in training) is a cold start: with `item_counts` it
    gets the most popular items (marked in `cold`), without them it is an error naming the id.
    An empty history is an error when the model has nothing else to go on (no user-id embedding).
    """
    if k < 1 or k > model.num_items:
        raise ValueError(f"recommend: k = {k} must be in 1..{model.num_items} (the catalogue's size)")
    if history.lengths.numel() != users.numel():
        raise ValueError(f"recommend: {users.numel()} users but {history.lengths.numel()} histories")
    if history.values.numel() and (int(history.values.min()) < 0 or int(history.values.max()) >= model.num_items):
        bad = int(history.values[(history.values < 0) | (history.values >= model.num_items)][0])
        raise ValueError(f"recommend: history item id {bad} is not in the catalogue 0..{model.num_items - 1}")
    cold = (users < 0) | (users >= model.num_users)
    if bool(cold.any()) and item_counts is None:
        raise ValueError(f"recommend: user id {int(users[cold][0])} was never seen in training (0..{model.num_users - 1}) and no item counts were given for a popularity fallback")
    uses_id = not isinstance(model, TwoTower) or model.config.use_user_id
    if not uses_id and not (isinstance(model, TwoTower) and model.config.user_features):
        empty = history.lengths == 0
        if bool(empty.any()):
            raise ValueError(f"recommend: user {int(users[empty][0])} has an empty history, and the model has no user-id embedding or user features to go on")
    warm = ~cold
    q = torch.zeros(users.numel(), model.dim)
    if bool(warm.any()):
        lengths = history.lengths.to(torch.int64)
        keep_ids = torch.repeat_interleave(warm, lengths)
        q[warm] = user_vectors(model, users[warm], JaggedTensor(history.values[keep_ids], history.lengths[warm]))
    v = all_item_vectors(model)
    pop = torch.from_numpy(np.asarray(item_counts, dtype=np.float32)) if item_counts is not None else torch.zeros(model.num_items)

    def score(u0: int, u1: int, i0: int, i1: int) -> torch.Tensor:
        s = q[u0:u1] @ v[i0:i1].T  # [b, n]
        c = cold[u0:u1]
        return torch.where(c[:, None], pop[i0:i1].expand(u1 - u0, -1), s) if bool(c.any()) else s

    scores, pos = top_k(score, users.numel(), model.num_items, k, exclude)
    return Recommendations(scores, pos, cold)


def evaluate_retrieval(
    model: RetrievalModel,
    users: torch.Tensor,
    history: JaggedTensor,
    held_out: CSR,
    exclude: CSR | None,
    ks: tuple[int, ...] = (10, 50),
) -> dict[str, float]:
    """Full-ranking metrics (see ranking_metrics) of the model for `users` (rows of held_out/exclude)."""
    q, v = user_vectors(model, users, history), all_item_vectors(model)
    if exclude is not None:
        exclude = csr_minus(exclude, held_out)
    _, top = top_k(lambda u0, u1, i0, i1: q[u0:u1] @ v[i0:i1].T, users.numel(), model.num_items, max(ks), exclude)
    return list_metrics(top, held_out, model.num_items, ks)
