"""Training, scoring and recommending with the sequential models (SASRec, MaskedTransformer, GRU4Rec).

    model = SASRec(SequenceConfig(num_items=I, max_len=50))
    batches = window_batches(last_n(train, window_width(model)), batch_size=128, seed=0)
    valid = NextItemValidation(valid_histories, valid_targets, exclude)
    fit(model, batches, valid, TrainConfig(epochs=30), family=SequentialFamily(FullSoftmax()))   # early stopping on recall@10
    metrics = next_item_metrics(model, histories, targets, exclude=None, ks=(10, 20))
    top_items = recommend_next(model, [np.array([5, 17, 3])], k=10)

With timestamps (HSTU's time buckets; models with `uses_times`), the windows' times ride beside them:

    windows = sliding_windows(train, window_width(hstu)); times = sliding_windows(train, window_width(hstu), values=train.timestamps)
    batches = window_batches(windows, 128, seed=0, times=times)           # TimedWindows batches
    valid = NextItemValidation(histories, targets, exclude, times=history_times)
    fit(hstu, batches, valid, TrainConfig(epochs=30), family=SequentialFamily(FullSoftmax(), times=True))

The input at position t carries its own item's time; the query at t reads the times of positions <= t
only (its own time, never its target's), and a validation query the times of its history alone.

HSTU's ranking head (cached candidate scoring, the pipeline's Score stage) trains beside the next-item loss
with `SequentialFamily(..., ranking_weight=0.1)` (`[model] ranking_weight`); 0, the default, leaves it untrained.

Losses (a closed union, consumed by one `match`):
  FullSoftmax     cross entropy over items 1..I: [N, I] logits for the N trained positions of a batch;
                  for catalogues small enough for that (the MovieLens and YOOCHOOSE samples)
  SampledSoftmax  (hugerec.training.losses) in-batch and/or sampled negatives with logQ correction;
                  [N, N + M] logits, never [N, I]: the loss for huge catalogues
  BCE             classic SASRec: one uniform negative per position, binary cross entropy
Next-item models (Objective.NEXT) train every position t of the last max_len + 1 items to predict
t + 1; the masked model (Objective.MASKED) trains the masked positions of the last max_len items.
Item rows are updated by the model's sparse optimizer inside the backward; the dense parameters
(positions, attention, GRU) by the trainer's dense optimizer.

A model family of the one trainer (`SequentialFamily`): `prepare` cuts inputs and targets from the windows,
draws the mask and the negatives from the family generator and builds the item lookup's features
(`ItemLookup.features`, or the model's own `lookup_features` where it looks up other tensors than its
inputs, as HSTU does: staged by the training pipeline for dynamic and disk-tier item tables);
`loss` runs the model and the loss. Sharded (torchrun), each rank trains its windows of the global
batch: in-batch candidates are gathered from every rank, the M sampled negatives are the same on
every rank, BCE's per-position negatives, the ranking head's negatives and the masked model's masks
are each rank's rows of the one global draw (every rank draws the whole global batch's, as one process
does: `window_batches` under torchrun yields RankWindows, which say where the rank's rows sit, even in
a batch that splits unevenly), and each rank's mean is weighted by its share of the batch's positions,
so W ranks take one process's step (with dropout the ranks draw their masks from their own streams).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast, overload

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hugerec.models.hstu import DEFAULT_RANKING_NEGATIVES, RankingBatch, check_ranking
from hugerec.models.masked import mask_items
from hugerec.models.sequence import PAD, ItemLookup, Objective, SequenceConfig
from hugerec.sparse.features import SparseFeatures
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.family import Prepared, StepContext, gather_rows, rank_rows, rows_of_ranks, share
from hugerec.training.losses import NegativeSampler, SampledSoftmax, full_softmax, sampled_softmax
from hugerec.training.next_item import CSR, rank_metrics, target_ranks
from hugerec.training.precision import Precision
from hugerec.training.schedule import Schedule


@dataclass(frozen=True)
class FullSoftmax:
    """Cross entropy over the whole catalogue (small catalogues only: materialises [N, I])."""


@dataclass(frozen=True)
class BCE:
    """Binary cross entropy of each position's next item against one uniformly drawn negative."""


SequenceLoss = FullSoftmax | SampledSoftmax | BCE


class SequenceModel(Protocol):
    """What SASRec, MaskedTransformer and GRU4Rec have in common (three implementations).

    A new sequential model implements these; to have its item table staged by the training pipeline
    (dynamic and disk-tier tables prepared a step ahead) it looks its items up through `ItemLookup`."""

    cfg: SequenceConfig
    objective: Objective

    def __call__(self, seq: torch.Tensor, candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...
    def query(self, history: torch.Tensor) -> torch.Tensor: ...
    def item_vectors(self, ids: torch.Tensor) -> torch.Tensor: ...
    def parameters(self) -> object: ...
    def train(self, mode: bool = True) -> nn.Module: ...


@dataclass(frozen=True)
class NextItemValidation:
    """What a sequential model is validated on: histories [Q, L] (left-padded dense ids), their next
    items targets [Q], exclude (CSR of items never to rank per query) or None, and times [Q, L] (int64
    seconds of the history's items, for models with `uses_times`) or None; `next_item_metrics`."""

    histories: np.ndarray
    targets: np.ndarray
    exclude: CSR | None = None
    times: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.times is not None and np.shape(self.times) != np.shape(self.histories):
            raise ValueError(
                f"NextItemValidation: times must have the histories' shape {np.shape(self.histories)}, got {np.shape(self.times)}"
            )


@dataclass(frozen=True)
class TimedWindows:
    """A batch of training windows with their items' timestamps (`window_batches(..., times=...)`):
    windows [B, W] int64 item ids (left-padded), times [B, W] int64 seconds (a padding column's time is
    never read)."""

    windows: torch.Tensor
    times: torch.Tensor


@dataclass(frozen=True)
class RankWindows:
    """This rank's rows of one global batch under torchrun (`window_batches(..., rank, world)`): its windows
    ([B_r, W], or TimedWindows) and their place in the global batch, rows [first, first + B_r) of `total`.
    The family draws a step's per-row negatives (BCE's, the ranking head's) for all `total` rows, the draw
    one process makes, and keeps its own rows: W ranks then train what one process trains however a batch
    splits (an epoch's last batch of 15 windows on 2 ranks: 7 and 8 rows), with no collective in `prepare`."""

    batch: torch.Tensor | TimedWindows
    first: int
    total: int


def uses_times(model: object) -> bool:
    """Whether a sequential model takes timestamps (`times` in forward and query): HSTU's time buckets."""
    return bool(getattr(model, "uses_times", False))


def _times_tensor(times: np.ndarray | torch.Tensor, shape: tuple[int, ...], where: str) -> torch.Tensor:
    """times as int64 seconds of `shape`; another shape or a non-integer dtype is refused, naming `where`."""
    t = torch.as_tensor(times)
    if tuple(t.shape) != shape:
        raise ValueError(f"{where}: times must have the shape of the items {shape}, got {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{where}: times must be integer seconds, got dtype {t.dtype}")
    return t.to(torch.int64)


@dataclass(frozen=True)
class _Step:
    seq: torch.Tensor  # [B, L] model input
    valid: torch.Tensor  # [B, L] bool: the trained positions
    targets: torch.Tensor  # [N] their items
    neg: torch.Tensor  # the sampled negatives: [M] (sampled softmax), [N] (BCE), [0] (full softmax)
    candidates: torch.Tensor  # what the item lookup returns rows for: targets then negatives, or all items
    times: torch.Tensor | None = None  # [B, L] seconds of the input positions (times=True), else None
    ranking: RankingBatch | None = None  # the ranking head's windows and negatives (ranking_weight > 0), else None


@dataclass(frozen=True, eq=False)
class SequentialFamily:
    """The sequential family (SASRec, MaskedTransformer, GRU4Rec, HSTU; see SequenceModel): batches of windows
    [B, W] (`window_batches`), next-item or masked-item loss, validation by the next item's rank
    (NextItemValidation: Recall/MRR/NDCG@K).

    loss         FullSoftmax() | SampledSoftmax(...) | BCE()
    item_counts  [I + 1] training events per item id (index 0 unused): the sampled softmax's negatives
                 and logQ (None: needed only by SampledSoftmax)
    mask_prob    the masked model's share of masked items
    ks           cutoffs of the validation metrics; early stopping watches recall@ks[0]
    times        the batches are TimedWindows and the validation carries times: the model (one with
                 `uses_times`: HSTU) reads the input positions' timestamps; kept in the checkpoint's
                 settings, so a resume cannot switch it
    ranking_weight  > 0 (an HSTU: `forward_ranked`): the loss adds ranking_weight x the ranking head's cross
                 entropy of each window's last item against ranking_negatives uniform negatives drawn from
                 the family generator (after the loss's own draws), its history the window's other items
                 (the last max_len - 1), the candidates at the time of the history's latest event (never the
                 target's own). 0: the next-item loss alone, bit for bit as before the key. Both kept in the
                 checkpoint's settings when > 0 (a resume cannot change them)
    """

    loss: SequenceLoss = field(default_factory=FullSoftmax)
    item_counts: np.ndarray | None = None
    mask_prob: float = 0.2
    ks: tuple[int, ...] = (10, 20)
    times: bool = False
    ranking_weight: float = 0.0
    ranking_negatives: int = DEFAULT_RANKING_NEGATIVES
    name: ClassVar[str] = "sequential"

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"SequentialFamily: mask_prob must be in (0, 1), got {self.mask_prob}")
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"SequentialFamily: ks must be integers >= 1, got {self.ks!r}")
        object.__setattr__(self, "ks", tuple(self.ks))
        if not isinstance(self.times, bool):
            raise ValueError(f"SequentialFamily: times must be True or False, got {self.times!r}")
        check_ranking(self.ranking_weight, self.ranking_negatives, "SequentialFamily")
        sampler = None
        if isinstance(self.loss, SampledSoftmax):
            if self.item_counts is None:
                raise ValueError("SequentialFamily: SampledSoftmax needs item_counts ([I + 1] events per item id)")
            counts = np.asarray(self.item_counts, dtype=np.float64).copy()
            counts[PAD] = 0.0
            sampler = NegativeSampler(self.loss, counts)
        object.__setattr__(self, "sampler", sampler)

    @property
    def metric(self) -> str:
        return f"recall@{self.ks[0]}"

    @property
    def schedule(self) -> Schedule:
        return Schedule()  # a constant dense lr

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"loss": self.loss, "mask_prob": self.mask_prob, "ks": list(self.ks)}
        if self.item_counts is not None:
            counts = np.ascontiguousarray(np.asarray(self.item_counts, dtype=np.float64))
            out["item_counts"] = hashlib.sha256(counts.tobytes()).hexdigest()[:16]
        if self.times:  # only when on: the settings of a run without times are those from before the key
            out["times"] = True
        if self.ranking_weight > 0:  # likewise: a run without the ranking loss keeps its settings
            out["ranking_weight"] = float(self.ranking_weight)
            out["ranking_negatives"] = self.ranking_negatives
        return out

    def _check_times(self, model: nn.Module, given: bool, what: str) -> None:
        """Refuses times the family was not told of, times missing when it was, and times for a model that cannot read them."""
        if given and not self.times:
            raise ValueError(f"SequentialFamily: the {what} carry times but the family has times=False (SequentialFamily(times=True) uses them)")
        if self.times and not given:
            raise ValueError(f"SequentialFamily(times=True): the {what} carry no times (window_batches(..., times=...), NextItemValidation(..., times=...))")
        if self.times and not uses_times(model):
            raise ValueError(f"SequentialFamily(times=True): {type(model).__name__} cannot use timestamps (HSTU does)")

    def prepare(self, model: nn.Module, batch: torch.Tensor | TimedWindows | RankWindows, ctx: StepContext) -> Prepared:
        cfg = cast(SequenceConfig, model.cfg)
        objective = cast(Objective, model.objective)
        width = cfg.max_len + (1 if objective is Objective.NEXT else 0)
        place = batch if isinstance(batch, RankWindows) else None
        batch = batch.batch if isinstance(batch, RankWindows) else batch
        timed = isinstance(batch, TimedWindows)
        self._check_times(model, timed, "batches")
        windows = torch.as_tensor(batch.windows if isinstance(batch, TimedWindows) else batch, dtype=torch.int64)
        if windows.dim() != 2 or windows.shape[1] != width:
            raise ValueError(f"SequentialFamily: batches must be windows [B, {width}], got shape {tuple(windows.shape)}")
        times = _times_tensor(batch.times, tuple(windows.shape), "SequentialFamily") if isinstance(batch, TimedWindows) else None
        if windows.numel() and (int(windows.min()) < 0 or int(windows.max()) > cfg.num_items):
            raise ValueError(
                f"SequentialFamily: item ids must be in 1..{cfg.num_items} (0 = padding), got {int(windows.min())}..{int(windows.max())}"
            )
        first, total = _rows_in_global_batch(len(windows), place, ctx)
        gen = ctx.generator
        match objective:
            case Objective.NEXT:
                seq, target = windows[:, :-1], windows[:, 1:]  # [B, L]: position t predicts t + 1
                valid = (seq != PAD) & (target != PAD)
                times = None if times is None else times[:, :-1]  # the inputs' own times: never a target's
            case Objective.MASKED:  # the mask of the global batch's rows, as one process draws it; this rank's rows
                whole = windows
                if total != len(windows):  # [B_r, W] -> [N, W], the other ranks' rows empty (a row's mask is its own)
                    whole = windows.new_zeros((total, windows.shape[1]))
                    whole[first : first + len(windows)] = windows
                seq, target = (x[first : first + len(windows)] for x in mask_items(whole, cfg.mask_id, self.mask_prob, gen))
                valid = target != PAD
        tgt = target[valid]  # [N]
        match self.loss:
            case FullSoftmax():
                neg = tgt.new_empty(0)
                cand = torch.arange(1, cfg.num_items + 1)
            case SampledSoftmax():
                assert self.sampler is not None  # type: ignore[attr-defined]  # set in __post_init__
                neg = self.sampler.sample(tgt.numel(), gen)  # type: ignore[attr-defined]  # [M]
                cand = torch.cat([tgt, neg])
            case BCE():  # one negative per position: this rank's rows of the global batch's draw [N, L]
                drawn = torch.randint(1, cfg.num_items + 1, (total, seq.shape[1]), generator=gen)[first : first + len(seq)]
                neg = drawn[valid]
                cand = torch.cat([tgt, neg])
        ranking = None
        if self.ranking_weight > 0:
            ranking = self._ranking_batch(model, windows, None if not isinstance(batch, TimedWindows) else batch.times, (first, total), ctx)
        seq, cand = seq.to(ctx.device), cand.to(ctx.device)
        lookup = next((m for m in model.modules() if isinstance(m, ItemLookup)), None)
        prepare = getattr(model, "lookup_features", None)  # a model that looks up other tensors than seq (HSTU) says which
        if callable(prepare):
            sparse: tuple[SparseFeatures, ...] = (prepare(seq, cand, ranking),)
        else:
            sparse = (lookup.features(seq, cand),) if lookup is not None else ()
        step = _Step(
            seq, valid.to(ctx.device), tgt.to(ctx.device), neg.to(ctx.device), cand, None if times is None else times.to(ctx.device), ranking
        )
        return Prepared(step, sparse, int(windows.shape[0]))

    def _ranking_batch(
        self, model: nn.Module, windows: torch.Tensor, times: torch.Tensor | None, rows: tuple[int, int], ctx: StepContext
    ) -> RankingBatch:
        """The ranking head's inputs: each window's last max_len items (a history of max_len - 1 before the
        positive) and [B, ranking_negatives] uniform negatives, this rank's rows of the global batch's draw
        (rows: this rank's first row and the global batch's rows, _rows_in_global_batch)."""
        if not callable(getattr(model, "forward_ranked", None)):
            raise ValueError(f"SequentialFamily: ranking_weight > 0 trains a ranking head, which {type(model).__name__} has not (HSTU has)")
        cfg = cast(SequenceConfig, model.cfg)
        keep = cfg.max_len  # [B, max_len + 1] -> [B, max_len]: the candidate takes the slot after max_len - 1 items
        first, total = rows
        drawn = torch.randint(1, cfg.num_items + 1, (total, self.ranking_negatives), generator=ctx.generator)  # [N, M]
        drawn = drawn[first : first + len(windows)]  # [B, M]
        seconds = None if times is None else _times_tensor(times, tuple(windows.shape), "SequentialFamily")[:, -keep:].to(ctx.device)
        return RankingBatch(windows[:, -keep:].to(ctx.device), drawn.to(ctx.device), seconds)

    def step_loss(self, model: nn.Module, prepared: Prepared, ctx: StepContext) -> torch.Tensor:
        step: _Step = prepared.inputs
        n = step.targets.numel()
        sizes = rows_of_ranks(n, ctx)
        ranking_loss = None
        if step.ranking is not None:  # ranking_weight > 0: both passes from one item lookup
            hidden, rows, ranking_loss = model(step.seq, step.candidates, step.times, step.ranking)  # forward_ranked
        elif step.times is None:
            hidden, rows = model(step.seq, step.candidates)
        else:
            hidden, rows = model(step.seq, step.candidates, step.times)
        # [B, L, D] -> [N, D] by flat index (index_select's backward adds rows; a mask's sorts them)
        h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, step.valid.reshape(-1).nonzero().squeeze(1)).float()
        rows = rows.float()
        match self.loss:
            case FullSoftmax():
                value = full_softmax(h, rows, step.targets - 1)  # over [N, I], a block of rows at a time
            case SampledSoftmax(logq=logq):
                sampler: NegativeSampler = self.sampler  # type: ignore[attr-defined]
                pos, pos_ids, first = rows[:n], step.targets, 0
                if sampler.uses_in_batch and ctx.world > 1:  # every rank's positives are candidates here too
                    first = sum(sizes[: ctx.rank])
                    pos, pos_ids = gather_rows(pos, sizes, ctx), gather_rows(pos_ids, sizes, ctx)
                ids = torch.cat([pos_ids, step.neg])
                log_q = sampler.log_q(ids, sum(sizes)) if logq else None
                value = sampled_softmax(
                    h, pos, pos_ids, rows[n:], step.neg, log_q, sampler.uses_in_batch, first_row=first
                )
            case BCE():
                pos_logit, neg_logit = (h * rows[:n]).sum(1), (h * rows[n:]).sum(1)
                keep = (step.neg != step.targets).to(h.dtype)  # a negative equal to the target is no negative
                value = -(F.logsigmoid(pos_logit) + F.logsigmoid(-neg_logit) * keep).mean()
        value = value * share(n, sizes)
        if ranking_loss is not None:  # a mean over this rank's windows: weighted by its share of the global batch's windows
            windows = len(step.ranking.windows)  # type: ignore[union-attr]  # set with ranking_loss
            value = value + self.ranking_weight * ranking_loss.float() * share(windows, rows_of_ranks(windows, ctx))
        return value

    def evaluate(
        self, model: nn.Module, data: NextItemValidation, device: torch.device | None, precision: Precision
    ) -> dict[str, float]:
        self._check_times(model, data.times is not None, "validation histories")
        return next_item_metrics(model, data.histories, data.targets, data.exclude, self.ks, times=data.times)  # type: ignore[arg-type]


def _rows_in_global_batch(n: int, place: RankWindows | None, ctx: StepContext) -> tuple[int, int]:
    """(first, total): this rank's n rows are rows [first, first + n) of a global batch of `total`. The
    batch's own place (RankWindows), else equal shares (rank * n of world * n; one process: 0 of n); a place
    that does not hold the n rows is refused."""
    if place is None:
        return n * ctx.rank, n * ctx.world
    if not 0 <= place.first <= place.total - n:
        raise ValueError(f"SequentialFamily: a batch of {n} windows at row {place.first} of a global batch of {place.total}")
    return place.first, place.total


def window_width(model: SequenceModel) -> int:
    """W, the training window: the last max_len + 1 items for next-item models (inputs and shifted targets), max_len for masked."""
    return model.cfg.max_len + (1 if model.objective is Objective.NEXT else 0)


@overload
def window_batches(
    windows: np.ndarray | torch.Tensor, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1, times: None = None
) -> EpochBatches[torch.Tensor | RankWindows]: ...
@overload
def window_batches(
    windows: np.ndarray | torch.Tensor, batch_size: int, seed: int = 0, rank: int = 0, world: int = 1, *, times: np.ndarray | torch.Tensor
) -> EpochBatches[TimedWindows | RankWindows]: ...
def window_batches(
    windows: np.ndarray | torch.Tensor,
    batch_size: int,
    seed: int = 0,
    rank: int = 0,
    world: int = 1,
    times: np.ndarray | torch.Tensor | None = None,
) -> EpochBatches[torch.Tensor | RankWindows] | EpochBatches[TimedWindows | RankWindows]:
    """Training windows [S, W] (`hugerec.data.sessions.last_n` / `sliding_windows` of the training
    sequences with W = window_width(model)) as `fit`'s data: batches of `batch_size` windows [B, W],
    reshuffled every epoch from (seed, epoch), resumable. Windows with fewer than 2 items are left out
    (a window needs an input and a target); ValueError when none is left.

    times [S, W]: the windows' timestamps (int64 seconds, the same windows cut from `Sequences.timestamps`:
    `sliding_windows(..., values=seqs.timestamps)`); the batches are then TimedWindows, the same rows of
    both (for SequentialFamily(times=True)). Another shape is refused.

    rank, world: under torchrun, this rank's contiguous rows of each global batch (every rank gives the
    same windows and seed), so that W ranks train the batches one process would; with world > 1 each batch
    is a RankWindows, which tells the family the global batch's rows and this rank's first one."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"window_batches: batch_size must be an int >= 1, got {batch_size!r}")
    w = torch.as_tensor(windows, dtype=torch.int64)
    if w.dim() != 2:
        raise ValueError(f"window_batches: windows must be [S, W], got shape {tuple(w.shape)}")
    t = None if times is None else _times_tensor(times, tuple(w.shape), "window_batches")
    keep = (w != PAD).sum(dim=1) >= 2
    w = w[keep]
    if not len(w):
        raise ValueError("window_batches: no training sequence has 2 or more items")

    if not 0 <= rank < world:
        raise ValueError(f"window_batches: rank must be in 0..world - 1, got rank {rank}, world {world}")

    def rows_of(e: int) -> Iterator[tuple[torch.Tensor, int, int]]:
        """(this rank's rows, the first one's place in the global batch, the global batch's rows)."""
        order = torch.randperm(len(w), generator=torch.Generator().manual_seed(seed * 1_000_003 + e))
        for b0 in range(0, len(order), batch_size):
            rows = order[b0 : b0 + batch_size]
            mine = rank_rows(len(rows), rank, world)
            yield rows[mine], mine.start, len(rows)

    def untimed(e: int) -> Iterator[torch.Tensor | RankWindows]:
        for rows, first, total in rows_of(e):
            yield w[rows] if world == 1 else RankWindows(w[rows], first, total)

    def timed(e: int) -> Iterator[TimedWindows | RankWindows]:
        assert tk is not None
        for rows, first, total in rows_of(e):
            batch = TimedWindows(w[rows], tk[rows])
            yield batch if world == 1 else RankWindows(batch, first, total)

    length = -(-len(w) // batch_size)
    tk = None if t is None else t[keep]
    return EpochBatches(untimed, length=length) if tk is None else EpochBatches(timed, length=length)


def all_item_vectors(model: SequenceModel, block: int = 65536) -> torch.Tensor:
    """[I, D] rows of items 1..I (row i - 1 is item i)."""
    with torch.no_grad():
        ids = torch.arange(1, model.cfg.num_items + 1)
        return torch.cat([model.item_vectors(ids[i : i + block]) for i in range(0, len(ids), block)])


def query_vectors(
    model: SequenceModel, histories: torch.Tensor, block: int = 1024, times: torch.Tensor | np.ndarray | None = None
) -> torch.Tensor:
    """[Q, L] left-padded histories -> [Q, D] next-item query vectors (eval mode, no gradient).

    times [Q, L]: the histories' timestamps (int64 seconds), for a model with `uses_times`; a query
    reads its history's times alone (the target's time is not an input)."""
    model.train(False)
    if times is None:
        with torch.no_grad():
            return torch.cat([model.query(histories[i : i + block]) for i in range(0, len(histories), block)] or [torch.empty(0)])
    if not uses_times(model):
        raise ValueError(f"query_vectors: {type(model).__name__} cannot use timestamps (HSTU does); give times=None")
    t = _times_tensor(times, tuple(histories.shape), "query_vectors")
    query = cast(Any, model).query  # HSTU.query(history, times)
    with torch.no_grad():
        return torch.cat([query(histories[i : i + block], t[i : i + block]) for i in range(0, len(histories), block)] or [torch.empty(0)])


def next_item_metrics(
    model: SequenceModel,
    histories: np.ndarray,
    targets: np.ndarray,
    exclude: CSR | None = None,
    ks: Sequence[int] = (10, 20),
    block: int = 1024,
    times: np.ndarray | None = None,
) -> dict[str, float]:
    """Full-ranking next-item metrics (see hugerec.training.next_item) of histories [Q, L] -> targets [Q];
    times [Q, L]: the histories' timestamps (`query_vectors`)."""
    items = all_item_vectors(model)
    queries = query_vectors(model, torch.from_numpy(histories), block, times)

    def score(q0: int, q1: int) -> torch.Tensor:
        return queries[q0:q1] @ items.T  # [q, I]

    return rank_metrics(target_ranks(score, targets, model.cfg.num_items, exclude, block), ks)


def recommend_next(
    model: SequenceModel,
    histories: Sequence[np.ndarray],
    k: int = 10,
    exclude_history: bool = False,
    times: Sequence[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k next items for each history (dense ids, oldest first; longer than max_len: the last max_len are used).

    times: each history's timestamps (int64 seconds, one per item), for a model with `uses_times`.
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
    padded_times = None
    if times is not None:
        if len(times) != len(histories):
            raise ValueError(f"recommend_next: {len(times)} times for {len(histories)} histories")
        padded_times = np.zeros_like(padded)  # [Q, L], the same columns as the items
        for i, (h, t) in enumerate(zip(histories, times, strict=True)):
            if len(t) != len(h):
                raise ValueError(f"recommend_next: history {i} has {len(h)} items but {len(t)} times")
            tail_t = np.asarray(t, dtype=np.int64)[-max_len:]
            padded_times[i, max_len - len(tail_t) :] = tail_t
    scores = query_vectors(model, torch.from_numpy(padded), times=padded_times) @ all_item_vectors(model).T  # [Q, I]
    if exclude_history:
        for i, h in enumerate(histories):
            scores[i, torch.as_tensor(np.asarray(h, dtype=np.int64) - 1)] = float("-inf")
    top = torch.topk(scores, min(k, num_items), dim=1)
    return (top.indices + 1).numpy(), top.values.numpy()
