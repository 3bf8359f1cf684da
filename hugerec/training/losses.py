"""Retrieval losses: sampled softmax (in-batch, sampled from the catalogue, or both) with logQ correction, and BPR.

    sampler = NegativeSampler(SampledSoftmax(), item_counts)          # the default: mixed negatives
    neg_ids = sampler.sample(generator)                                # [M] catalogue negatives
    loss = sampled_softmax(query, pos, pos_ids, neg, neg_ids, sampler.log_q(...), cfg)

Sampled softmax approximates the full softmax over the catalogue with a candidate set: the batch's
positives (in-batch negatives), M items drawn from the catalogue (uniformly or by popularity^alpha),
or both (mixed negative sampling, Yang et al. 2020). A candidate set drawn non-uniformly favours
popular items, and an uncorrected model learns to push them down: logQ correction (Bengio & Senecal
2008; Yi et al. 2019) subtracts log E[count of item j in the candidate set] from every logit,

    log_q[j] = log(B * p_data(j) [in-batch] + M * p_neg(j) [sampled]),

which makes the sampled softmax a consistent estimate of the full one. In-batch negatives alone
collapse on popular items (the default is therefore MIXED). Accidental hits, a candidate equal to the
row's own positive item but in another column, are masked out of the softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from hugerec.models.objectives import Negatives


@dataclass(frozen=True)
class SampledSoftmax:
    """negatives       which candidate set (MIXED: in-batch plus M sampled)
    num_negatives      M sampled items per batch (shared by all rows); ignored for IN_BATCH
    alpha              sampling distribution count^alpha for POPULARITY / MIXED (0 = uniform)
    logq               subtract log expected candidate count (on by default)
    mask_history       also mask, in each row, the candidates that are items of that row's history: the
                       next item of a log without repeats is never one already seen, and the evaluation
                       excludes seen items too, so they are not taught as negatives (off by default)
    """

    negatives: Negatives = Negatives.MIXED
    num_negatives: int = 1024
    alpha: float = 0.0
    logq: bool = True
    mask_history: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.negatives, str):
            object.__setattr__(self, "negatives", _enum(self.negatives))
        if self.negatives is not Negatives.IN_BATCH and self.num_negatives < 1:
            raise ValueError(f"SampledSoftmax: num_negatives must be >= 1 for {self.negatives.value}, got {self.num_negatives}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"SampledSoftmax: alpha must be in [0, 1], got {self.alpha}")


@dataclass(frozen=True)
class BPR:
    """Bayesian personalised ranking: -log sigmoid(s(u, pos) - s(u, neg)), one uniform negative per row."""


RetrievalLoss = SampledSoftmax | BPR


def _enum(value: str) -> Negatives:
    try:
        return Negatives(value)
    except ValueError:
        raise ValueError(f"SampledSoftmax: negatives must be one of {[n.value for n in Negatives]}, got {value!r}") from None


class NegativeSampler:
    """Draws catalogue negatives and gives each candidate's log expected count (the logQ term).

    item_counts [I]: training events per item (p_data for the in-batch term, count^alpha for sampling).
    """

    def __init__(self, loss: RetrievalLoss, item_counts: np.ndarray) -> None:
        counts = torch.as_tensor(np.asarray(item_counts), dtype=torch.float64)
        if counts.dim() != 1 or counts.numel() == 0 or bool((counts < 0).any()) or float(counts.sum()) <= 0:
            raise ValueError(f"NegativeSampler: item_counts must be a non-empty [I] vector of counts >= 0 with a positive sum, got shape {tuple(counts.shape)}")
        self.loss = loss
        self.num_items = counts.numel()
        self.p_data = counts / counts.sum()  # [I]
        match loss:
            case SampledSoftmax(negatives=Negatives.UNIFORM) | BPR():
                weights = torch.ones_like(counts)
            case SampledSoftmax(negatives=Negatives.POPULARITY | Negatives.MIXED, alpha=alpha):
                weights = counts.pow(alpha) if alpha > 0 else torch.ones_like(counts)
            case SampledSoftmax(negatives=Negatives.IN_BATCH):
                weights = torch.zeros_like(counts)
        self.p_neg = weights / weights.sum() if float(weights.sum()) > 0 else weights  # [I]

    @property
    def uses_in_batch(self) -> bool:
        return isinstance(self.loss, SampledSoftmax) and self.loss.negatives in (Negatives.IN_BATCH, Negatives.MIXED)

    def num_samples(self, batch_size: int) -> int:
        match self.loss:
            case BPR():
                return batch_size
            case SampledSoftmax(negatives=Negatives.IN_BATCH):
                return 0
            case SampledSoftmax(num_negatives=m):
                return m

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """[M] int64 negatives drawn with replacement (M = num_samples(batch_size))."""
        m = self.num_samples(batch_size)
        if m == 0:
            return torch.empty(0, dtype=torch.int64)
        if isinstance(self.loss, BPR) or (isinstance(self.loss, SampledSoftmax) and (self.loss.negatives is Negatives.UNIFORM or self.loss.alpha == 0)):
            return torch.randint(0, self.num_items, (m,), generator=generator)
        return torch.multinomial(self.p_neg.float(), m, replacement=True, generator=generator)

    def log_q(self, ids: torch.Tensor, batch_size: int) -> torch.Tensor:
        """[N] candidate ids -> [N] float32 log expected count in a candidate set of this batch size."""
        expected = torch.zeros(ids.shape, dtype=torch.float64)
        if self.uses_in_batch:
            expected += batch_size * self.p_data[ids]
        m = self.num_samples(batch_size)
        if m and isinstance(self.loss, SampledSoftmax):
            expected += m * self.p_neg[ids]
        return torch.log(expected.clamp_min(1e-30)).float()


def sampled_softmax(
    query: torch.Tensor,
    pos: torch.Tensor,
    pos_ids: torch.Tensor,
    neg: torch.Tensor,
    neg_ids: torch.Tensor,
    log_q: torch.Tensor | None,
    in_batch: bool,
    temperature: float = 1.0,
    exclude: tuple[torch.Tensor, torch.Tensor] | None = None,
    first_row: int = 0,
) -> torch.Tensor:
    """Mean sampled-softmax cross entropy of each row's positive against the candidate set.

    query [B, D] user vectors, pos [B, D] their positive items' vectors (ids pos_ids [B]),
    neg [M, D] sampled items' vectors (ids neg_ids [M]); log_q [B + M] (positives, then negatives)
    or None for no correction. Candidates: the B positives (in_batch) or just each row's own, then the M.
    first_row: the query rows are the users of pos[first_row : first_row + Q] among more positives
    (one rank's rows of a batch whose positives were gathered from every rank; in_batch only).
    logits = query . candidate / temperature - log_q[candidate]; accidental hits masked to -inf, and
    with exclude = (rows [K], item ids [K]) every candidate of row r equal to an excluded id of r too
    (never row r's own positive). With in-batch negatives it runs fused (`_InBatchSoftmax`; no second
    backward through it) over the distinct candidate ids: a candidate set with k copies of an item is a
    softmax with that item once and its weight times k (its logit + log k), except in the rows whose
    positive it is, where the other copies are accidental hits and it counts once. Candidates with the
    same id must therefore have the same vector and log_q (true wherever both are functions of the id:
    the towers, item tables and NegativeSampler.log_q here); popular items repeat many times among a batch's positives.
    """
    _check_shapes(query, pos, pos_ids, neg, neg_ids, first_row if in_batch else None)
    if in_batch:
        ids = torch.cat([pos_ids, neg_ids])  # [C]
        uniq, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)  # [U], [C], [U]
        first = torch.full_like(uniq, ids.numel()).scatter_reduce_(0, inverse, torch.arange(ids.numel()), "amin")
        cand = torch.cat([pos, neg])[first]  # [U, D]: each distinct item's vector once
        log_count = counts.to(query.dtype).log()
        bias = -log_count if log_q is None else log_q.to(query.dtype)[first] - log_count  # subtracted from the logits
        target = inverse[first_row : first_row + query.shape[0]]  # [Q]: each query row's positive column
        masked = None
        if exclude is not None and exclude[0].numel():
            rows, cols = matching_columns(uniq, *exclude)
            keep = cols != target[rows]  # a row's own positive stays the target
            masked = (rows[keep], cols[keep])
        return _InBatchSoftmax.apply(query, cand, bias, target, log_count, masked, 1.0 / temperature)
    return sampled_softmax_plain(query, pos, pos_ids, neg, neg_ids, log_q, in_batch, temperature, exclude)


def _check_shapes(
    query: torch.Tensor,
    pos: torch.Tensor,
    pos_ids: torch.Tensor,
    neg: torch.Tensor,
    neg_ids: torch.Tensor,
    first_row: int | None = None,
) -> None:
    """first_row None: pos holds exactly the query rows' positives; else at least rows first_row..+Q."""
    b = query.shape[0]
    fits = pos.shape[0] == b if first_row is None else first_row >= 0 and first_row + b <= pos.shape[0]
    if not fits or pos_ids.shape != (pos.shape[0],) or neg.shape[0] != neg_ids.shape[0]:
        raise ValueError(
            f"sampled_softmax: shapes query {tuple(query.shape)}, pos {tuple(pos.shape)}, pos_ids {tuple(pos_ids.shape)}, "
            f"neg {tuple(neg.shape)}, neg_ids {tuple(neg_ids.shape)} do not fit (first_row {first_row})"
        )


def matching_columns(cand_ids: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (rows[k], j) with cand_ids[j] == ids[k], found by sorting the [C] candidate ids (no
    [B, C] comparison): as many pairs as matches. rows, ids [K] int64 -> (rows, columns)."""
    sorted_ids, order = torch.sort(cand_ids, stable=True)
    lo = torch.searchsorted(sorted_ids, ids, side="left")
    n = torch.searchsorted(sorted_ids, ids, side="right") - lo  # [K] candidates equal to ids[k]
    out_rows = torch.repeat_interleave(rows, n)
    starts = torch.cumsum(n, 0) - n  # where the k-th id's pairs begin
    cols = order[torch.repeat_interleave(lo - starts, n) + torch.arange(out_rows.numel())]
    return out_rows, cols


class _InBatchSoftmax(torch.autograd.Function):
    """The in-batch (and mixed) sampled softmax over U distinct candidates with few passes over [B, U].

    Forward: one addmm writes logits = scale * query @ cand^T - bias (bias = log_q - log multiplicity),
    each row's target column t_i gets its multiplicity back (the other copies of a row's positive are
    accidental hits), masked pairs are set to -inf by index, and torch's row softmax turns the logits into
    probabilities P in place (one pass: each row's max, exp and sum stay in cache). Row i's loss is
    -log P[i, t_i]; a row whose P[i, t_i] underflows fp32 gets its exact logsumexp - target from its
    logits recomputed. Backward: d loss / d logits = (P - onehot(t)) * g / B, so grad_query = (P @ cand
    - cand[t]) * g / B and grad_cand = (P^T @ query - sum of query over the rows targeting it) * g / B:
    two matmuls and [B, D] work, no pass over [B, U]. The plain formulation (`sampled_softmax_plain`:
    every copy a column, separate matmuls, cat, subtract, a [B, C] comparison, masked_fill,
    cross_entropy and their autograd copies) makes about six times as many passes over a wider matrix;
    the tests compare the two.
    """

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        cand: torch.Tensor,
        bias: torch.Tensor,
        target: torch.Tensor,
        log_count: torch.Tensor,
        masked: tuple[torch.Tensor, torch.Tensor] | None,
        scale: float,
    ) -> torch.Tensor:
        b = query.shape[0]
        rows = torch.arange(b)
        logits = _logits(query, cand, bias, scale, target, log_count, masked)  # [B, U]
        prob = torch.ops.aten._softmax.out(logits, 1, False, out=logits)  # in place: [B, U] probabilities
        p_target = prob[rows, target]  # [B]
        loss = -torch.log(p_target)
        tiny = p_target < 1e-30  # -log underflows or loses digits: exact logsumexp - target for these rows
        if bool(tiny.any()):
            idx = tiny.nonzero().squeeze(1)
            sub_masked = None
            if masked is not None:  # the masked pairs of these rows, renumbered 0..len(idx)-1
                where = torch.full((b,), -1, dtype=torch.int64)
                where[idx] = torch.arange(idx.numel())
                sel = where[masked[0]] >= 0
                sub_masked = (where[masked[0][sel]], masked[1][sel])
            exact = _logits(query[idx], cand, bias, scale, target[idx], log_count, sub_masked)
            loss[idx] = torch.logsumexp(exact, dim=1) - exact[torch.arange(idx.numel()), target[idx]]
        ctx.save_for_backward(query, cand, prob, target)
        ctx.scale = scale
        return loss.mean()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, cand, prob, target = ctx.saved_tensors
        b = prob.shape[0]
        coef = grad * (ctx.scale / b)
        grad_query = grad_cand = None
        if ctx.needs_input_grad[0]:
            grad_query = torch.mm(prob, cand).sub_(cand[target]).mul_(coef)
        if ctx.needs_input_grad[1]:
            # (query^T @ P)^T: BLAS runs this layout faster than P^T @ query (a transposed [U, B] operand)
            grad_cand = torch.mm(query.T, prob).T.contiguous()
            grad_cand.index_add_(0, target, query, alpha=-1.0)
            grad_cand.mul_(coef)
        return grad_query, grad_cand, None, None, None, None, None


def _logits(
    query: torch.Tensor,
    cand: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    target: torch.Tensor,
    log_count: torch.Tensor,
    masked: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """[B, U]: scale * query @ cand^T - bias in one addmm, each row's target column counted once, the
    masked pairs -inf."""
    logits = torch.addmm(bias[None, :], query, cand.T, beta=-1.0, alpha=scale)
    rows = torch.arange(query.shape[0])
    logits[rows, target] -= log_count[target]
    if masked is not None:
        logits.index_put_(masked, torch.tensor(float("-inf"), dtype=logits.dtype))
    return logits


def sampled_softmax_plain(
    query: torch.Tensor,
    pos: torch.Tensor,
    pos_ids: torch.Tensor,
    neg: torch.Tensor,
    neg_ids: torch.Tensor,
    log_q: torch.Tensor | None,
    in_batch: bool,
    temperature: float = 1.0,
    exclude: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`sampled_softmax` written with plain torch ops and autograd (the non-in-batch path, the reference
    the fused in-batch path is tested against, and what the plain-PyTorch benchmark baseline runs)."""
    _check_shapes(query, pos, pos_ids, neg, neg_ids)
    b = query.shape[0]
    neg_logits = query @ neg.T / temperature  # [B, M]
    if in_batch:
        pos_logits = query @ pos.T / temperature  # [B, B]; row i's positive on the diagonal
        cand_ids = torch.cat([pos_ids, neg_ids])  # [B + M]
        logits = torch.cat([pos_logits, neg_logits], dim=1)  # [B, B + M]
        if log_q is not None:
            logits = logits - log_q[None, :]
        target = torch.arange(b)
        hits = cand_ids[None, :] == pos_ids[:, None]  # [B, B + M]
        hits[target, target] = False  # the row's own positive is not an accidental hit
    else:
        pos_logit = (query * pos).sum(dim=1, keepdim=True) / temperature  # [B, 1]
        logits = torch.cat([pos_logit, neg_logits], dim=1)  # [B, 1 + M]
        if log_q is not None:
            logits = logits - torch.cat([log_q[:b, None], log_q[None, b:].expand(b, -1)], dim=1)
        target = torch.zeros(b, dtype=torch.int64)
        hits = torch.cat([torch.zeros(b, 1, dtype=torch.bool), neg_ids[None, :] == pos_ids[:, None]], dim=1)  # [B, 1 + M]
    if exclude is not None:  # [B, I'] dense: which ids each row excludes, then compared with every candidate
        all_ids = torch.cat([pos_ids, neg_ids])  # [B + M]
        per_row = torch.zeros(b, int(all_ids.max()) + 1, dtype=torch.bool)
        keep_ids = exclude[1] < per_row.shape[1]
        per_row[exclude[0][keep_ids], exclude[1][keep_ids]] = True
        excluded = per_row.gather(1, all_ids[None, :].expand(b, -1))  # [B, B + M]
        if not in_batch:  # candidates: the row's own positive, then the M
            excluded = torch.cat([torch.zeros(b, 1, dtype=torch.bool), excluded[:, b:]], dim=1)
        excluded[torch.arange(b), target] = False  # the row's own positive stays the target
        hits = hits | excluded
    logits = logits.masked_fill(hits, float("-inf"))
    return F.cross_entropy(logits, target)


def bpr(
    query: torch.Tensor,
    pos: torch.Tensor,
    pos_ids: torch.Tensor,
    neg: torch.Tensor,
    neg_ids: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Mean -log sigmoid((q . pos - q . neg) / temperature) over the rows whose negative is not their positive.

    query/pos/neg [B, D], one negative per row (ids pos_ids, neg_ids [B]); accidental hits are left out.
    """
    if not query.shape == pos.shape == neg.shape or not pos_ids.shape == neg_ids.shape == (query.shape[0],):
        raise ValueError(f"bpr: query {tuple(query.shape)}, pos {tuple(pos.shape)} and neg {tuple(neg.shape)} must match")
    diff = ((query * pos).sum(1) - (query * neg).sum(1)) / temperature  # [B]
    keep = (neg_ids != pos_ids).to(diff.dtype)
    return -(F.logsigmoid(diff) * keep).sum() / keep.sum().clamp_min(1.0)



class _BlockedFullSoftmax(torch.autograd.Function):
    """Mean cross entropy of query rows [N, D] over every item row [I, D], one block of rows at a time.

    F.cross_entropy(query @ items^T, target) writes [N, I] logits, reads them for the log-softmax, writes
    the log-probabilities, and its backward makes three more passes over [N, I] plus two matmuls that
    stream it from memory. Here a block of `block` rows goes through all of that while its logits stay
    in cache: logits by one mm, softmax in place, the block's loss from its target probabilities, then
    (when a gradient is wanted) d loss / d logits = P - onehot(t) in place and the block's gradients of
    the query rows (P @ items) and of the item rows (accumulated P^T @ query), all scaled by 1 / N in the
    backward. The forward thus does the backward's work too; the backward only scales what it stored.
    A row whose target probability underflows fp32 gets its exact logsumexp - target logit instead.
    """

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, items: torch.Tensor, target: torch.Tensor, block: int) -> torch.Tensor:
        n = query.shape[0]
        want = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_query = torch.empty_like(query) if want else None
        grad_items = torch.zeros_like(items) if want else None
        total = query.new_zeros((), dtype=torch.float64)
        for r0 in range(0, n, block):
            q = query[r0 : r0 + block]  # [b, D]
            t = target[r0 : r0 + block]
            rows = torch.arange(len(q))
            logits = q @ items.T  # [b, I]
            prob = torch.ops.aten._softmax.out(logits, 1, False, out=logits)  # in place: [b, I] probabilities
            p_t = prob[rows, t]
            loss = -torch.log(p_t)
            tiny = p_t < 1e-30  # -log underflows or loses digits: exact logsumexp - target for these rows
            if bool(tiny.any()):
                idx = tiny.nonzero().squeeze(1)
                exact = q[idx] @ items.T
                loss[idx] = torch.logsumexp(exact, dim=1) - exact[torch.arange(idx.numel()), t[idx]]
            total += loss.sum(dtype=torch.float64)
            if want:
                assert grad_query is not None and grad_items is not None
                prob[rows, t] -= 1.0  # d loss / d logits (before the 1 / N)
                torch.mm(prob, items, out=grad_query[r0 : r0 + block])
                grad_items.addmm_(prob.T, q)
        ctx.save_for_backward(*(() if grad_query is None or grad_items is None else (grad_query, grad_items)))
        return (total / max(n, 1)).to(query.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_query, grad_items = ctx.saved_tensors
        coef = grad / max(grad_query.shape[0], 1)
        return grad_query * coef, grad_items * coef, None, None


def full_softmax(query: torch.Tensor, items: torch.Tensor, target: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Mean cross entropy of query [N, D] against all items [I, D], target [N] item rows (0..I-1):
    F.cross_entropy(query @ items.T, target), computed `block` rows at a time (`_BlockedFullSoftmax`)."""
    if query.dim() != 2 or items.dim() != 2 or query.shape[1] != items.shape[1]:
        raise ValueError(f"full_softmax: query [N, D] and items [I, D] must share D, got {tuple(query.shape)} and {tuple(items.shape)}")
    if target.shape != (query.shape[0],):
        raise ValueError(f"full_softmax: target must be [{query.shape[0]}], got {tuple(target.shape)}")
    if block < 1:
        raise ValueError(f"full_softmax: block must be >= 1, got {block}")
    if query.device.type != "cpu":
        return F.cross_entropy(query @ items.T, target)
    out: torch.Tensor = _BlockedFullSoftmax.apply(query, items, target, block)
    return out
