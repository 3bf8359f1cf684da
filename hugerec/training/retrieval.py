"""Retrieval models (TwoTower, MatrixFactorization): their training family, item vectors, top-K, metrics.

    family = RetrievalFamily(item_counts, SampledSoftmax(num_negatives=1024))
    batches = EpochBatches(lambda epoch: iter_examples(train, 1024, 50, seed=epoch), length=n_batches)
    valid = RetrievalValidation(users, history, held_out, exclude)
    history = fit(model, batches, valid, TrainConfig(epochs=20), family=family)   # early stopping on recall@10
    items = all_item_vectors(model)                                   # [I, D] for the index
    scores, ids = recommend(model, users, user_history, k=10, exclude=train_csr)
    metrics = retrieval_metrics(model, users, user_history, held_out, exclude, ks=(10, 50))
    top = top_items(model, users, user_history, exclude, k=50)      # [U, 50] positions, exclude taken as given

A step: user vectors [B, D] for the batch, item vectors [B + M, D] for its positives and the sampled
negatives in one lookup (`model(user_features, item_features)`), then the loss; dense parameters
(MLPs) step with the trainer's dense optimizer, the embedding rows with the collections' own sparse
optimizers inside the backward. The negatives and both lookups' features are made in `prepare` (the
training pipeline's worker thread), so dynamic and disk-tier tables are staged a step ahead.

Sharded (torchrun): each rank trains its part of the global batch. The in-batch candidates are the
positives of every rank (gathered, gradients summed back), the M sampled negatives are the same on
every rank (drawn from the family generator, seeded alike), BPR's per-row negatives are each rank's
slice of the global batch's draw, and logQ counts the global batch: W ranks take one process's step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import nn

from hugerec.index.topk import top_k
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import TwoTower
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.family import Prepared, StepContext, gather_rows, rows_of_ranks, share
from hugerec.training.losses import BPR, NegativeSampler, RetrievalLoss, SampledSoftmax, bpr, sampled_softmax
from hugerec.training.precision import Precision
from hugerec.training.ranking_metrics import CSR, csr_minus, list_metrics
from hugerec.training.schedule import Schedule

RetrievalModel = TwoTower | MatrixFactorization
Example = tuple[torch.Tensor, torch.Tensor, JaggedTensor]  # users [B], target items [B], history


@dataclass(frozen=True)
class RetrievalValidation:
    """What a retrieval model is validated on: full ranking of the catalogue for `users` [U] with their
    histories, held_out CSR (the items to find, rows = users), exclude CSR (items never to rank: the
    training items) or None. `retrieval_metrics` scores it."""

    users: torch.Tensor
    history: JaggedTensor
    held_out: CSR
    exclude: CSR | None = None


@dataclass(frozen=True)
class _Step:
    users: torch.Tensor  # [B]
    items: torch.Tensor  # [B] the positives
    neg: torch.Tensor  # [M] sampled negatives (BPR: [B], one per row)
    history: JaggedTensor
    user_features: Any  # SparseFeatures of the user tower's lookup
    item_features: Any  # SparseFeatures of the item tower's lookup: positives, then negatives


@dataclass(frozen=True, eq=False)
class RetrievalFamily:
    """The retrieval family (TwoTower, MatrixFactorization): batches of (users [B], items [B], history),
    the loss over the positives and sampled candidates, validation by full ranking (RetrievalValidation).

    item_counts  [I] training events per item: the negatives' distribution and logQ (Interactions.item_counts())
    loss         SampledSoftmax(...) | BPR()
    ks           cutoffs of the validation metrics (recall@K, ndcg@K, ...); early stopping watches recall@ks[0]
    """

    item_counts: np.ndarray
    loss: RetrievalLoss = field(default_factory=SampledSoftmax)
    ks: tuple[int, ...] = (10, 50)
    name: ClassVar[str] = "retrieval"

    def __post_init__(self) -> None:
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"RetrievalFamily: ks must be integers >= 1, got {self.ks!r}")
        object.__setattr__(self, "ks", tuple(self.ks))
        object.__setattr__(self, "sampler", NegativeSampler(self.loss, self.item_counts))

    @property
    def metric(self) -> str:
        return f"recall@{self.ks[0]}"

    @property
    def schedule(self) -> Schedule:
        return Schedule()  # a constant dense lr

    def settings(self) -> dict[str, Any]:
        counts = np.ascontiguousarray(np.asarray(self.item_counts, dtype=np.float64))
        return {"loss": self.loss, "ks": list(self.ks), "item_counts": hashlib.sha256(counts.tobytes()).hexdigest()[:16]}

    def prepare(self, model: nn.Module, batch: Example, ctx: StepContext) -> Prepared:
        users, items, history = batch
        towers = cast(Any, model)  # TwoTower | MatrixFactorization, possibly inside DistributedDataParallel
        b = users.numel()
        sampler: NegativeSampler = self.sampler  # type: ignore[attr-defined]  # set in __post_init__
        if isinstance(self.loss, BPR) and ctx.world > 1:  # this rank's rows of the global batch's draw
            neg = sampler.sample(b * ctx.world, ctx.generator).view(ctx.world, b)[ctx.rank]
        else:
            neg = sampler.sample(b, ctx.generator)
        users, items = users.to(ctx.device), items.to(ctx.device)
        user_features = towers.user_features(users, history).to(ctx.device)
        item_features = towers.item_features(torch.cat([items, neg.to(ctx.device)]))
        step = _Step(users, items, neg, history, user_features, item_features)
        return Prepared(step, (user_features, item_features), b)

    def step_loss(self, model: nn.Module, prepared: Prepared, ctx: StepContext) -> torch.Tensor:
        step: _Step = prepared.inputs
        b = step.items.numel()
        query, cand = model(step.user_features, step.item_features)  # [B, D], [B + M, D]
        query, cand = query.float(), cand.float()
        pos, neg = cand[:b], cand[b:]
        sampler: NegativeSampler = self.sampler  # type: ignore[attr-defined]
        sizes = rows_of_ranks(b, ctx)
        temperature = float(cast(Any, model).temperature)
        match self.loss:
            case SampledSoftmax(logq=logq, mask_history=mask_history):
                exclude = None
                if mask_history:
                    lengths = step.history.lengths.to(torch.int64)
                    exclude = (torch.repeat_interleave(torch.arange(b), lengths), step.history.values)
                first = 0
                pos_ids = step.items
                if sampler.uses_in_batch and ctx.world > 1:  # every rank's positives are this rank's candidates too
                    first = sum(sizes[: ctx.rank])
                    pos, pos_ids = gather_rows(pos, sizes, ctx), gather_rows(step.items, sizes, ctx)
                ids = torch.cat([pos_ids, step.neg])
                log_q = sampler.log_q(ids, sum(sizes)) if logq else None
                value = sampled_softmax(
                    query, pos, pos_ids, neg, step.neg, log_q, sampler.uses_in_batch, temperature, exclude, first
                )
            case BPR():
                value = bpr(query, pos, step.items, neg, step.neg, temperature)
        return value * share(b, sizes)

    def evaluate(
        self, model: nn.Module, data: RetrievalValidation, device: torch.device | None, precision: Precision
    ) -> dict[str, float]:
        return retrieval_metrics(model, data.users, data.history, data.held_out, data.exclude, self.ks)  # type: ignore[arg-type]


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


def retrieval_metrics(
    model: RetrievalModel,
    users: torch.Tensor,
    history: JaggedTensor,
    held_out: CSR,
    exclude: CSR | None,
    ks: tuple[int, ...] = (10, 50),
) -> dict[str, float]:
    """Full-ranking metrics (see ranking_metrics) of the model for `users` (rows of held_out/exclude)."""
    if exclude is not None:
        exclude = csr_minus(exclude, held_out)
    return list_metrics(top_items(model, users, history, exclude, max(ks)), held_out, model.num_items, ks)


def top_items(model: RetrievalModel, users: torch.Tensor, history: JaggedTensor, exclude: CSR | None, k: int) -> torch.Tensor:
    """[U, k] the model's exact top-k item positions for `users` (best first, -1 past the items left), every item
    scored; exclude: CSR over the users of the (user, item) pairs never returned, taken as given (`retrieval_metrics`
    first keeps each user's held-out items rankable; a caller measuring several models on one window computes that
    once)."""
    q, v = user_vectors(model, users, history), all_item_vectors(model)
    _, top = top_k(lambda u0, u1, i0, i1: q[u0:u1] @ v[i0:i1].T, users.numel(), model.num_items, k, exclude)
    return top
