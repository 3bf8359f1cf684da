"""Sequential recommendation: next-item quality on MovieLens-1M and YOOCHOOSE against strong baselines, HSTU's
jagged training and cached scoring, and SASRec training throughput.

Every score is a full ranking of the catalogue (hugerec.training.next_item); baselines and models run in
the same process on the same splits. Protocol (the same for every method, ours and the baselines):

  splits      MovieLens: the shared ML-1M sample (users 1-2999 of 6040, about half of ML-1M; all ratings
              as implicit events in time order). Leave-last-out twice: each user's last item is test, the
              second-to-last validation; a user's earlier items are excluded from the ranking.
              Recall@10 (= HR@10), NDCG@10.
              YOOCHOOSE: the 100k sample as prepared for GRU4Rec. Validation = the sessions of train_full
              ending on its last day (the earlier ones train); test = the test file. Every prefix
              s_1..s_k predicts s_{k+1}; clicks on items unseen in the split's training data are removed,
              then sessions shorter than 2 dropped; nothing is excluded. Recall@20, MRR@20.
              A validation split that is empty, or (YOOCHOOSE) ends after the test split starts, is refused.
  choosing    every setting is chosen on the validation split by the first metric (Recall@K): each
              baseline's from its grid (`baseline_grid`), each model's epochs by scoring the validation
              targets after every epoch (at most --max-epochs, stopping after --patience epochs without
              a better one; seed --valid-seed, 0 unless given; every metric of every epoch goes to --json). The models' other
              settings are MOVIELENS_SETTINGS: SASRec's chosen by earlier validation runs, HSTU's by its
              own grid on validation (benchmarks/README.md); --max-len, --lr, ... set a field for every
              model, --set MODEL.FIELD=VALUE for one (a grid point). --seeds 0 runs the validation curve
              only. --lr-decay-epochs N (field lr_decay_epochs; 0 = a constant lr): every lr, the dense
              Adam's and the item table's sparse Adam's, falls linearly to 0 over N epochs. The horizon
              is counted in epochs of the run's own data (N x its steps per epoch), so after e epochs
              the lr is (1 - e/N) x lr in the validation run and in the test refit alike, although the
              refit's data is a little longer; a run of more than N epochs is refused.
              --set hugerec-hstu.times=true (field times): HSTU's relative bias reads the items' timestamps
              (log-scale buckets of t_i - t_j): the training windows carry them, and the validation and test
              histories theirs (a query reads its history's times, never the target's).
              --set MODEL.average_epochs=K (or --average-epochs K for every model): the model scored is the
              mean of the weights at its last K epoch ends (fit's TrainConfig.average_epochs), in the test
              refit too. --average-epochs-grid 1,3,5,8: the validation run also scores, after every epoch,
              the mean of the last K epoch ends for each K (records '... valid METRIC epoch E average K'),
              all from the one raw training run (training goes on from the raw weights whatever K).
  test        read once, at the end: every method refitted on train + validation (MovieLens: each user's
              history up to the test item; YOOCHOOSE: the whole of train_full) with the chosen settings;
              models trained with seeds 0..--seeds-1 for the chosen epochs (mean, spread per seed).
              Ratios are against the strongest baseline on each test metric.

Baselines (hugerec.training.next_item_baselines): popular, item-knn, ease (order-aware decayed history),
slist (SLIS + SLIT ridge regression, Choi et al. 2021), sknn and vsknn (normalised similarity, the most
recent sampled sessions), and item-transitions (counts of i followed by j, scored from the last item).

Ranking head part (not in the default --only: about 10 CPU minutes; --only hstu-ranking):
  hstu-ranking        `movielens hstu ranking`: HSTU as shipped (MOVIELENS_SETTINGS, 2 blocks) trained by `fit` on the
                      ML-1M validation split's training data for RANKING_EPOCHS epochs, once without and once
                      with the ranking loss (--ranking-weight, model.ranking_weight); each validation user's
                      top-100 next items by the query dot product (training items excluded) in that order
                      (hstu-next-item-order; hstu-next-item-order-joint for the model trained with both
                      losses), reranked by the trained head (hugerec-hstu-ranking-head, cached candidate
                      scoring at the latest event's time) and by the untrained head of the model trained
                      without it (untrained-head: what the Score stage ranked with before); Recall@10 /
                      NDCG@10 on the second-to-last item (no test item is scored); the training samples per
                      CPU second with the ranking loss / without. --quick: 300 users, 1 epoch.

Timing parts:
  hstu train          the same HSTU (ML-1M users' last 200 items, dim 64, 2 layers, 2 heads, 128 sampled
                      negatives, batch 128) on the jagged layout (Numba attention) and the padded plain-torch
                      one, stepping in turn on the same batches: samples/s and the ratio; and the
                      jagged layout with the windows' timestamps (time buckets on), the cost of the times.
  hstu cached scoring 1,024 candidates for one 199-item history: cached (M-FALCON) against one forward per
                      candidate and one batched forward of 1,024 sequences (ms, ratios).
  hstu serving        the served next-items answer (NextItemsModel.answer: the KServe v2 JSON request decoded,
                      the query, the exact top-10 over the catalogue, the response encoded) of an HSTU bundle
                      trained with times ("items.times" in the request) against the same weights exported
                      without times, ML-1M shape (max_len 50, dim 64, 2 layers, 2 heads), B = 1 and 64
                      histories of 50 items per request, in turn: median ms per request and the ratio.
  hstu pipeline       the served four-stage pipeline (PipelineRunner.recommend: the user's stored history
                      from the interaction store, the HSTU's next 200 items and 100 popular ones, seen items
                      dropped, every candidate ranked by the HSTU's cached scoring, top 10) with the HSTU
                      trained with times (the store keeps each rating's time; the model reads them) against
                      the same weights without times (a store without times), ML-1M users' last 51 ratings,
                      one user per request, in turn: median ms per request and the ratio.
  hstu pipeline history  the same pipeline as hstu pipeline (an untrained HSTU, no times) for users with 1,000
                      stored items: every model handed the whole history, each reading its own max_len (the
                      default) against the last 50 (the fixed length of before, declared max_history = 50);
                      median ms and thread CPU ms per request, the ratio, the answers that differ. Not in the
                      default --only (--only hstu-history).
  hstu staged lookup  HSTU trained by `fit` with a disk-tier item table (a 16,384-row cache of 200,002 rows)
                      and a dynamic one, the training pipeline staging its lookup a step ahead
                      (hugerec-hstu-staged) against the lookup in the step (hstu-unstaged, pipeline off: the
                      only way before HSTU.lookup_features); synthetic chains, max_len 50, dim 64, batch 128,
                      the sides in turn: samples/s, per CPU second, ratio; the weights must be the same.
                      Not in the default --only (--only hstu-staged; ~150 MB of disk rows per run).
  softmax             the full-softmax loss of a MovieLens step and its backward: the blocked loss against
                      F.cross_entropy on the [N, I] logits (ms and CPU ms per call, ratio).
  train <shape>       SASRec training samples/s (length 50, dim 64, 2 blocks) on a synthetic 1M-item
                      catalogue against plain PyTorch (nn.TransformerEncoder, full softmax, dense Adam), then
                      Recall@10 of both after the same wall-clock time.

    python benchmarks/sequential.py --quick              # a few minutes on 2 shared cores
    python benchmarks/sequential.py --json seq.json      # the tables in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from hugerec.data.sessions import (
    ItemVocabulary,
    Sequences,
    group_sequences,
    last_n,
    leave_last_out,
    prefixes,
    read_movielens,
    read_yoochoose,
    sliding_windows,
    split_by_day,
)
from hugerec.embedding.optimizers import Adam
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.hstu import HSTU, HSTUOptions, Layout
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SequenceConfig
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.family import StepContext
from hugerec.training.losses import Negatives, SampledSoftmax, full_softmax
from hugerec.training.next_item import CSR, rank_metrics, target_ranks
from hugerec.training.next_item_baselines import (
    EASE,
    SKNN,
    SLIST,
    VSKNN,
    Baseline,
    ItemKNN,
    LinearScorer,
    MostPopular,
    Scorer,
    SlistGrams,
    TrainingSequences,
    fit_baseline,
    score_block,
    sequence_gram,
    slist_grams,
    slist_solve,
)
from hugerec.training.schedule import Schedule
from hugerec.training.sequential import (
    FullSoftmax,
    SequentialFamily,
    TimedWindows,
    all_item_vectors,
    query_vectors,
    window_batches,
    window_width,
)
from hugerec.training.trainer import TrainConfig, fit
from hugerec.training.weight_average import EpochAverage

DATA = Path(os.environ.get("HUGEREC_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
Records = list[dict[str, Any]]
MODELS: dict[str, type[SASRec] | type[MaskedTransformer] | type[GRU4Rec]] = {
    "hugerec-sasrec": SASRec,
    "hugerec-mlm": MaskedTransformer,
    "hugerec-gru4rec": GRU4Rec,
}


def record(records: Records, config: str, method: str, value: float, unit: str, higher: bool = True) -> None:
    records.append({"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": higher})


def record_medians(
    records: Records, config: str, ms: dict[str, list[float]], ours: str, base: str, label: str, sides: str = "with times / without"
) -> float:
    """Each side's median ms per request as a record, then ours / base as a record of ours (printed as `sides`);
    returns the ratio."""
    for name, values in ms.items():
        record(records, config, name, float(np.median(values)), "ms per request", higher=False)
        print(f"  {label:18s} {name:20s} {np.median(values):8.2f} ms (median)", flush=True)
    ratio = float(np.median(ms[ours]) / np.median(ms[base]))
    record(records, config, ours, ratio, f"x {base} (ms per request)", higher=False)
    print(f"  {label}: {sides}: {ratio:.2f}x the time per request", flush=True)
    return ratio


# -- item-transitions (the earlier best baseline) and the models' score blocks: (q0, q1) -> [q, I] over items 1..I --------------------------------
def transitions(train: Sequences, num_items: int, counts: np.ndarray, last: np.ndarray) -> Callable[[int, int], torch.Tensor]:
    same = np.diff(train.sequence_ids()) == 0
    prev, nxt = train.items[:-1][same], train.items[1:][same]
    t = sp.csr_matrix((np.ones(len(prev), np.float32), (prev, nxt)), shape=(num_items + 1, num_items + 1))
    tie = torch.from_numpy((counts[1:] / (counts.max() + 1) * 1e-3).astype(np.float32))

    def score(q0: int, q1: int) -> torch.Tensor:
        return torch.from_numpy(t[last[q0:q1]].toarray()[:, 1:]) + tie

    return score


def model_scores(model: Any, histories: np.ndarray, times: np.ndarray | None = None) -> Callable[[int, int], torch.Tensor]:
    items = all_item_vectors(model)
    queries = query_vectors(model, torch.from_numpy(histories), times=times)
    return lambda q0, q1: queries[q0:q1] @ items.T


# -- quality: the protocol -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """What a method is fit on and what it is scored on: one of the (train, valid) or (train + valid, test) pairs."""

    name: str  # "valid" | "test"
    train: Sequences
    histories: np.ndarray  # [Q, HISTORY] the last items before each target, left-padded
    times: np.ndarray  # [Q, HISTORY] their timestamps (seconds; 0 at padding): read by HSTU with times=True
    targets: np.ndarray  # [Q]
    exclude: CSR | None  # items ranked out per query (MovieLens: the user's training items)
    own: np.ndarray | None  # [Q] the query's own training sequence (the kNN baselines leave it out)
    num_items: int


HISTORY = 100  # history columns kept per query (models read the last max_len, baselines their n_last)


def training_sequences(train: Sequences, num_items: int) -> TrainingSequences:
    last = train.timestamps[np.maximum(train.offsets[1:] - 1, 0)] if len(train.items) else np.zeros(len(train), np.int64)
    return TrainingSequences(train.offsets, train.items, num_items, last)


def baseline_grid(quick: bool) -> dict[str, list[Baseline]]:
    """The written-down grids every baseline's settings are chosen from (on the valid split); --quick: the first point."""
    grids: dict[str, list[Baseline]] = {
        "popular": [MostPopular()],
        "item-knn": [ItemKNN(n_last=n, decay=d) for n in (1, 3, 5, 10) for d in (0.7, 1.0)],
        "ease": [EASE(lam=lam, n_last=n, decay=d) for lam in (100.0, 500.0, 2000.0) for n in (10, 50) for d in (0.8, 0.95)],
        "slist": [SLIST(alpha=a, lam=lam, n_last=n, decay=d) for n in (10, 20) for d in (0.7, 0.8, 0.9) for lam in (10.0, 100.0, 1000.0) for a in (0.0, 0.5)],
        "sknn": [SKNN(k=k, sample=s, n_last=n) for k in (50, 100) for s in (500, 2000) for n in (10, 50)],
        "vsknn": [VSKNN(k=k, sample=s, n_last=n) for k in (50, 100) for s in (500, 2000) for n in (10, 50)],
    }
    return {name: grid[:1] for name, grid in grids.items()} if quick else grids


class BaselineCache:
    """Fits shared by grid points: EASE's inverse depends on lam only, SLIST's Gram matrices on (n_last, decay)
    (and its X'X on nothing)."""

    def __init__(self, train: TrainingSequences) -> None:
        self.train = train
        self.ease: dict[float, np.ndarray] = {}
        self.grams: dict[tuple[int, float], SlistGrams] = {}
        self.xx: np.ndarray | None = None  # SLIS's X'X: the same for every SLIST setting

    def fit(self, spec: Baseline) -> Scorer:
        match spec:
            case EASE(lam=lam, n_last=n, decay=d):
                if lam not in self.ease:
                    self.ease[lam] = cast(LinearScorer, fit_baseline(spec, self.train)).weights
                return LinearScorer(self.ease[lam], n, d)
            case SLIST(alpha=a, lam=lam, n_last=n, decay=d):
                if (n, d) not in self.grams:
                    if self.xx is None:
                        self.xx = sequence_gram(self.train)
                    self.grams[(n, d)] = slist_grams(self.train, n, d, self.xx)
                return LinearScorer(slist_solve(self.grams[(n, d)], a, lam), n, d)
            case _:
                return fit_baseline(spec, self.train)


def split_metrics(split: Split, score: Callable[[int, int], torch.Tensor], k: int) -> dict[str, float]:
    return rank_metrics(target_ranks(score, split.targets, split.num_items, split.exclude, block=512), ks=(k,))


def choose_baselines(valid: Split, quick: bool, key: str, k: int) -> dict[str, tuple[Baseline, float]]:
    """Each baseline's grid point with the best validation `key` (ties: the earlier point)."""
    cache = BaselineCache(training_sequences(valid.train, valid.num_items))
    chosen: dict[str, tuple[Baseline, float]] = {}
    for name, grid in baseline_grid(quick).items():
        t0 = time.perf_counter()
        best: tuple[Baseline, float] | None = None
        for spec in grid:
            value = split_metrics(valid, score_block(cache.fit(spec), valid.histories, valid.own), k)[key]
            if best is None or value > best[1]:
                best = (spec, value)
        assert best is not None
        chosen[name] = best
        print(f"  {name:10s} valid {key} {best[1]:.4f} with {best[0]} ({len(grid)} settings, {time.perf_counter() - t0:.0f} s)", flush=True)
    return chosen


class _Stop(Exception):
    """Raised from train_model's epoch callback when validation stopped improving."""


@dataclass(frozen=True)
class DeepSettings:
    max_len: int
    lr: float
    batch: int
    windows: str  # "last" | "sliding"
    dropout: float = 0.2
    layers: int = 2
    heads: int = 1
    hstu_temperature: float = 0.0  # HSTU: 0 = dot product scores (as SASRec); > 0 cosine / temperature
    dim: int = 64
    hstu_attention_dim: int = 0  # HSTU: per-head width of queries and keys (0: dim / heads)
    lr_decay_epochs: int = 0  # 0: a constant lr; N: every lr decays linearly to 0 over N epochs (lr_schedule)
    times: bool = False  # HSTU: the items' timestamps feed its time buckets in training, validation and test
    average_epochs: int = 1  # 1: the raw weights; K: the mean of the weights at the last K epoch ends (fit's average_epochs)

    def __post_init__(self) -> None:
        for name in ("max_len", "batch", "layers", "heads", "dim", "average_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        for name in ("hstu_attention_dim", "lr_decay_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be a multiple of heads {self.heads}")
        if not isinstance(self.times, bool):
            raise ValueError(f"times must be true or false, got {self.times!r}")
        if self.windows not in ("last", "sliding"):
            raise ValueError(f"windows must be 'last' or 'sliding', got {self.windows!r}")
        for name, ok, wanted in (
            ("lr", lambda v: 0 < v < np.inf, "a finite number > 0"),
            ("dropout", lambda v: 0 <= v < 1, "a number in [0, 1)"),
            ("hstu_temperature", lambda v: 0 <= v < np.inf, "a finite number >= 0"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
                raise ValueError(f"{name} must be {wanted}, got {value!r}")


# MovieLens: each model's settings (the flags --max-len ... --hstu-attention-dim set a field for every model,
# --set MODEL.FIELD=VALUE for one). SASRec's were chosen on validation by earlier runs; HSTU's in its own grid
# on the validation split (benchmarks/README.md, "HSTU's own settings on validation"). Both keep a constant lr: a
# linear decay over 20 or 30 epochs (lr_decay_epochs) lost on the mean of two validation seeds (the third round).
# HSTU reads the timestamps (time buckets): chosen over the same point without them on two validation seeds (round 4).
# SASRec scores the mean of its last 5 epoch ends (average_epochs, round 5: +0.0077 validation Recall@10 over
# its raw weights, 30 epochs); HSTU's best averaged point was inside the tie band, so it keeps its raw weights.
# HSTU has 8 blocks (HSTU-large, round 6): chosen over 2 and 4 on two validation seeds; SASRec keeps 2 (not yet
# offered 8 on validation).
MOVIELENS_SETTINGS: dict[str, DeepSettings] = {
    "hugerec-sasrec": DeepSettings(max_len=50, lr=6e-3, batch=128, windows="sliding", average_epochs=5),  # 30 epochs
    "hugerec-hstu": DeepSettings(max_len=50, lr=6e-3, batch=128, windows="sliding", layers=8, heads=2, times=True),  # 8 blocks, 2 heads of 32, time buckets: 28 epochs
}


def build_model(name: str, num_items: int, s: DeepSettings, seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = SequenceConfig(num_items=num_items, max_len=s.max_len, dim=s.dim, num_layers=s.layers, num_heads=s.heads, dropout=s.dropout)
    if name == "hugerec-hstu":
        return HSTU(cfg, optimizer=Adam(lr=s.lr), options=HSTUOptions(attention_dim=s.hstu_attention_dim, temperature=s.hstu_temperature))
    return MODELS[name](cfg, optimizer=Adam(lr=s.lr))


def lr_schedule(s: DeepSettings) -> Schedule | None:
    """The settings' lr schedule for `fit`: None (the family's constant lr), or a linear decay to 0 over
    lr_decay_epochs epochs of the run's data, applied to the sparse item table's Adam too."""
    if not s.lr_decay_epochs:
        return None
    return Schedule(decay_epochs=float(s.lr_decay_epochs), power=1.0, sparse=True)


def train_model(
    name: str, split: Split, s: DeepSettings, epochs: int, seed: int, max_steps: int | None = None,
    on_epoch: Callable[[Any, int], None] | None = None,
) -> Any:
    """The model trained by `fit` (the sequential family, full softmax); on_epoch(model, e) after each
    epoch e (0-based) that ran to its end, with the raw weights (fit averages nothing then: the callback takes
    the means it wants, `EpochMeans`); it may raise _Stop to end training there. Without on_epoch the model
    returned is fit's mean of the last s.average_epochs epoch ends."""
    model = build_model(name, split.num_items, s, seed)
    tc = TrainConfig(
        epochs=epochs, lr=s.lr, max_steps=max_steps, seed=seed, progress=False, tensorboard=False, plot=False, schedule=lr_schedule(s),
        average_epochs=1 if on_epoch is not None else s.average_epochs,
    )
    width = window_width(model)
    # "last": each sequence's last max_len (+ 1) items; "sliding": windows over the whole of each sequence
    cut = (lambda values: last_n(split.train, width, values=values)) if s.windows == "last" else (lambda values: sliding_windows(split.train, width, values=values))
    batches: EpochBatches[Any] = (
        window_batches(cut(None), s.batch, seed, times=cut(split.train.timestamps)) if s.times else window_batches(cut(None), s.batch, seed)
    )
    if on_epoch is not None:  # the callback after each epoch, as the next one starts (then back to training)
        inner = batches

        def epoch(e: int) -> Any:
            if e:
                on_epoch(model, e - 1)
                model.train()
            return inner.make(e)

        batches = EpochBatches(epoch, len(inner))
    t0 = time.perf_counter()
    try:
        history = fit(model, batches, None, tc, family=SequentialFamily(FullSoftmax(), mask_prob=0.2, times=s.times))
        if on_epoch is not None and (max_steps is None or history.steps == epochs * len(batches)):
            on_epoch(model, epochs - 1)
        print(f"  {name}: {history.steps} steps in {time.perf_counter() - t0:.0f} s, loss {history.train[0]['loss']:.3f} -> {history.train[-1]['loss']:.3f}", flush=True)
    except _Stop:
        print(f"  {name}: stopped after {time.perf_counter() - t0:.0f} s (validation stopped improving)", flush=True)
    return model.train(False)
    return model


def checkpoint_path(folder: Path, name: str, seed: int, epoch: int) -> Path:
    return folder / f"{name}-seed{seed}-epoch{epoch}.pt"


class EpochMeans:
    """Several epoch-tail means from one training run: the ring of the last max(ks) epoch-end weights
    (weight_average.EpochAverage, as `fit` keeps it) and, for each K in ks, the model with the mean of the
    last K of them loaded for a while. The raw trajectory is the same for every K (training goes on from the
    raw weights), so one run gives every K's validation curve."""

    def __init__(self, ks: tuple[int, ...]) -> None:
        self.ks = ks
        self.ring: EpochAverage | None = None

    def each(self, model: Any, epoch: int) -> Iterator[int]:
        """After epoch `epoch` (0-based): for each K, the model holds the mean of the last K epoch ends while the
        caller's loop body runs (K = 1: the raw weights); the raw weights are back after the loop."""
        if max(self.ks) > 1:
            if self.ring is None:
                self.ring = EpochAverage(model, max(self.ks), key="average_epochs")
            self.ring.push(epoch)
        for k in self.ks:
            if k == 1:
                yield k
                continue
            assert self.ring is not None
            with self.ring.averaged(epoch, k):
                yield k


def save_test_checkpoints(name: str, test: Split, s: DeepSettings, max_epochs: int, seed: int, folder: Path) -> None:
    """--save-test-checkpoints: train on the test split's training data for max_epochs, saving the weights
    after every epoch and scoring nothing, while the validation run chooses the epoch; the test is then
    read once, from the chosen epoch's file (--checkpoints). Training is deterministic and the lr a function
    of the step alone (constant, or decayed over lr_decay_epochs whatever the run's length), so the weights
    after epoch E are those of an E-epoch run; with average_epochs K the file of epoch E holds the mean of
    epochs E - K + 1 .. E, as fit's E-epoch run returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    means = EpochMeans((s.average_epochs,))

    def save(model: Any, epoch: int) -> None:
        for _ in means.each(model, epoch):
            torch.save(model.state_dict(), checkpoint_path(folder, name, seed, epoch + 1))

    train_model(name, test, s, max_epochs, seed, None, save)


def test_model(name: str, test: Split, s: DeepSettings, epochs: int, seed: int, max_steps: int | None, checkpoints: Path | None) -> Any:
    """The model scored on test: trained here, or read from a --save-test-checkpoints file of that epoch."""
    if checkpoints is None:
        return train_model(name, test, s, epochs, seed, max_steps)
    model = build_model(name, test.num_items, s, seed)
    model.load_state_dict(torch.load(checkpoint_path(checkpoints, name, seed, epochs), weights_only=True))
    print(f"  {name}: seed {seed} read from {checkpoint_path(checkpoints, name, seed, epochs)}", flush=True)
    return model.train(False)


def model_block(model: Any, split: Split, times: bool = False) -> Callable[[int, int], torch.Tensor]:
    """The model's score blocks on the split's histories (their last max_len items; with times, their timestamps too)."""
    width = model.cfg.max_len
    return model_scores(model, split.histories[:, -width:], split.times[:, -width:] if times else None)


def choose_epochs(
    name: str, valid: Split, s: DeepSettings, max_epochs: int, patience: int, key: str, k: int, max_steps: int | None, seed: int = 0,
    average_grid: tuple[int, ...] = (),
) -> tuple[int, dict[int, list[dict[str, float]]]]:
    """Train on the valid split's training data, score the valid targets after every epoch, for every K of
    average_grid and s.average_epochs (the mean of the last K epoch ends, all from the same raw run); the
    epoch with the best `key` on s.average_epochs' curve, and each K's curve (every metric of every epoch).
    Training stops after `patience` epochs in which no K's curve found a better `key`."""
    ks = tuple(sorted({s.average_epochs, *average_grid}))
    curves: dict[int, list[dict[str, float]]] = {a: [] for a in ks}
    means = EpochMeans(ks)

    def best(a: int) -> int:
        return int(np.argmax([m[key] for m in curves[a]]))

    def evaluate_epoch(model: Any, epoch: int) -> None:
        for a in means.each(model, epoch):
            curves[a].append(split_metrics(valid, model_block(model, valid, s.times), k))
            tag = "" if len(ks) == 1 else f" (mean of the last {a})" if a > 1 else " (raw)"
            print(f"    {name} epoch {epoch + 1}{tag}: valid " + "  ".join(f"{m} {v:.4f}" for m, v in curves[a][-1].items() if "@" in m), flush=True)
        if min(epoch - best(a) for a in ks) >= patience:
            raise _Stop

    model = train_model(name, valid, s, max_epochs, seed, max_steps, evaluate_epoch)
    if not curves[ks[0]]:  # --quick's max_steps ended training inside the first epoch: one raw point for every K
        point = split_metrics(valid, model_block(model, valid, s.times), k)
        curves = {a: [point] for a in ks}
    return best(s.average_epochs) + 1, curves


def quality(
    records: Records, dataset: str, valid: Split, test: Split, quick: bool, models: list[str], settings: dict[str, DeepSettings],
    metrics: tuple[str, str], k: int, seeds: range, max_epochs: int, patience: int, epochs_override: dict[str, int], max_steps: int | None,
    baselines_on: bool = True, checkpoints: Path | None = None, valid_seed: int = 0, average_grid: tuple[int, ...] = (),
) -> None:
    """Choose every setting on `valid`, then fit on test.train (= train + valid) and read `test` once."""
    key = metrics[0]
    print(f"  settings chosen on the valid split by {key}; {len(valid.targets)} valid and {len(test.targets)} test queries", flush=True)
    chosen = choose_baselines(valid, quick, key, k) if baselines_on else {}
    cache = BaselineCache(training_sequences(test.train, test.num_items))
    results: dict[str, dict[str, float]] = {}
    for name, (spec, _) in chosen.items():
        results[name] = split_metrics(test, score_block(cache.fit(spec), test.histories, test.own), k)
    transitions_counts = np.bincount(test.train.items, minlength=test.num_items + 1)
    if baselines_on:
        results["item-transitions"] = split_metrics(test, transitions(test.train, test.num_items, transitions_counts, test.histories[:, -1]), k)
    for name in models:
        epochs = epochs_override.get(name, 0)
        if not epochs:
            t0 = time.process_time()
            epochs, curves = choose_epochs(name, valid, settings[name], max_epochs, patience, key, k, max_steps, valid_seed, average_grid)
            curve = curves[settings[name].average_epochs]
            for average, each in curves.items():  # K = 1 (the raw weights) under the names of the earlier rounds
                tag = "" if average == 1 else f" average {average}"
                for e, got in enumerate(each, start=1):
                    for metric in metrics:
                        record(records, f"quality {dataset} valid {metric} epoch {e}{tag}", name, got[metric], "fraction")
            for metric in metrics:  # every metric at the epoch chosen by `key`
                record(records, f"quality {dataset} valid {metric}", name, curve[epochs - 1][metric], f"fraction (epoch {epochs} of {len(curve)}, chosen by {key})")
            record(records, f"quality {dataset} valid cpu", name, time.process_time() - t0, "CPU seconds (validation run)", higher=False)
        if not seeds:  # --seeds 0: the validation run only
            print(f"  {name}: {epochs} epochs chosen on valid; no test run (--seeds 0)", flush=True)
            continue
        print(f"  {name}: {epochs} epochs (chosen on valid), test with seeds {list(seeds)}", flush=True)
        runs = [
            split_metrics(test, model_block(test_model(name, test, settings[name], epochs, seed, max_steps, checkpoints), test, settings[name].times), k)
            for seed in seeds
        ]
        results[name] = {metric: float(np.mean([r[metric] for r in runs])) for metric in metrics}
        for metric in metrics:
            values = [r[metric] for r in runs]
            record(records, f"quality {dataset} {metric} spread", name, float(np.std(values)), "std over seeds")
            for seed, v in zip(seeds, values, strict=True):
                record(records, f"quality {dataset} {metric} seed {seed}", name, v, "fraction")
        record(records, f"quality {dataset} epochs", name, float(epochs), "epochs (chosen on valid)", higher=False)
        record(records, f"quality {dataset} average epochs", name, float(settings[name].average_epochs), "epoch ends averaged (setting)", higher=False)
    for method, got in results.items():
        for metric in metrics:
            record(records, f"quality {dataset} {metric}", method, got[metric], "fraction")
        print(f"  {method:18s} test " + "  ".join(f"{metric} {got[metric]:.4f}" for metric in metrics), flush=True)
    baselines = [b for b in results if not b.startswith("hugerec")]
    for name in [m for m in models if m in results and baselines]:
        short = name.removeprefix("hugerec-")
        for metric in metrics:
            strongest = max(baselines, key=lambda b: results[b][metric])
            ratio = results[name][metric] / max(results[strongest][metric], 1e-12)
            record(records, f"{dataset} {short}", name, ratio, f"{metric} x {strongest} (strongest baseline)")
            print(f"  {name} / strongest baseline ({strongest}) {metric}: {ratio:.3f}x", flush=True)
            if name == "hugerec-hstu" and "hugerec-sasrec" in results:
                ratio = results[name][metric] / max(results["hugerec-sasrec"][metric], 1e-12)
                record(records, f"{dataset} {short}", name, ratio, f"{metric} x hugerec-sasrec")
                print(f"  {name} / hugerec-sasrec {metric}: {ratio:.3f}x", flush=True)


def movielens_splits() -> tuple[Split, Split]:
    """Leave-last-out, twice: each user's last item is test, the second-to-last validation."""
    events = read_movielens(DATA / "movielens" / "ml-1m" / "ratings.dat.gz")
    users = group_sequences(events, key="user", drop_repeats=False)
    vocab = ItemVocabulary.fit(users.items)
    seqs, _ = vocab.encode(users)
    short = int((seqs.lengths < 3).sum())
    if short:
        raise SystemExit(f"benchmarks/sequential.py: {short} MovieLens users have fewer than 3 items: no training item would be left beside a validation and a test item")
    train_full, test_targets = leave_last_out(seqs)
    train, valid_targets = leave_last_out(train_full)
    num_items = vocab.num_items
    users_idx = np.arange(len(seqs))

    def split(name: str, tr: Sequences, targets: np.ndarray) -> Split:
        return Split(name, tr, last_n(tr, HISTORY), last_n(tr, HISTORY, values=tr.timestamps), targets, (tr.offsets, tr.items), users_idx, num_items)

    print(f"  {len(seqs)} users, {len(seqs.items)} events, {num_items} items (users 1-2999 of ML-1M: about half of it)", flush=True)
    return split("valid", train, valid_targets), split("test", train_full, test_targets)


def yoochoose_splits() -> tuple[Split, Split]:
    """Sessions of train_full ending on its last day are validation (every prefix), the earlier ones train;
    the test file is test, scored after training on the whole of train_full."""
    root = DATA / "yoochoose"
    full_raw = group_sequences(read_yoochoose(root / "yoochoose-clicks-100k_train_full.txt.gz"), drop_repeats=False, min_length=2)
    test_raw = group_sequences(read_yoochoose(root / "yoochoose-clicks-100k_test.txt.gz"), drop_repeats=False, min_length=2)
    tr_raw, valid_raw = split_by_day(full_raw, test_days=1)
    if not len(valid_raw) or not len(tr_raw):
        raise SystemExit(f"benchmarks/sequential.py: the YOOCHOOSE validation split is empty ({len(valid_raw)} validation, {len(tr_raw)} training sessions)")
    valid_end, test_start = int(valid_raw.timestamps.max()), int(test_raw.timestamps.min())
    if valid_end >= test_start:
        raise SystemExit(
            f"benchmarks/sequential.py: the YOOCHOOSE validation split overlaps the test split: validation ends "
            f"{datetime.fromtimestamp(valid_end, UTC):%Y-%m-%d %H:%M:%S}, test starts {datetime.fromtimestamp(test_start, UTC):%Y-%m-%d %H:%M:%S} UTC"
        )

    def split(name: str, train_raw: Sequences, eval_raw: Sequences) -> Split:
        vocab = ItemVocabulary.fit(train_raw.items)
        train, _ = vocab.encode(train_raw, min_length=2)
        evaluated, report = vocab.encode(eval_raw, min_length=2)
        seq, end, targets = prefixes(evaluated)
        print(f"  {name}: {len(train)} training sessions, {len(evaluated)} {name} sessions, {len(targets)} prefixes; "
              f"{report.unknown_items} clicks on items unseen in training removed, {report.dropped_sequences} sessions left too short", flush=True)
        histories, times = (last_n(evaluated, HISTORY, rows=seq, ends=end, values=v) for v in (None, evaluated.timestamps))
        return Split(name, train, histories, times, targets, None, None, vocab.num_items)

    print(f"  validation: sessions ending on the last day of train_full, "
          f"{datetime.fromtimestamp(int(valid_raw.timestamps.min()), UTC):%Y-%m-%d %H:%M} to {datetime.fromtimestamp(valid_end, UTC):%Y-%m-%d %H:%M} UTC; "
          f"test from {datetime.fromtimestamp(test_start, UTC):%Y-%m-%d %H:%M} UTC", flush=True)
    return split("valid", tr_raw, valid_raw), split("test", full_raw, test_raw)


def average_grid(text: str | None) -> tuple[int, ...]:
    """--average-epochs-grid 1,3,5,8 -> (1, 3, 5, 8); exits naming the flag on anything but integers >= 1."""
    if not text:
        return ()
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise SystemExit(f"benchmarks/sequential.py: --average-epochs-grid {text!r}: expected integers >= 1, e.g. 1,3,5,8") from None
    if any(v < 1 for v in values):
        raise SystemExit(f"benchmarks/sequential.py: --average-epochs-grid {text!r}: every K must be >= 1")
    return values


def model_list(args: argparse.Namespace) -> list[str]:
    return [] if args.models == "none" else args.models.split(",")


def seed_range(args: argparse.Namespace) -> range:
    return range(args.first_seed, args.first_seed + args.seeds)


def epochs_by_model(text: str | None) -> dict[str, int]:
    """--epochs N (every model) or NAME=N,NAME=N."""
    if not text:
        return {}
    if "=" not in text:
        return dict.fromkeys([*MODELS, "hugerec-hstu"], int(text))
    return {name: int(n) for name, n in (part.split("=", 1) for part in text.split(","))}


SETTING_FLAGS = (
    "max_len", "lr", "batch", "windows", "dropout", "layers", "heads", "hstu_temperature", "dim", "hstu_attention_dim", "lr_decay_epochs",
    "average_epochs",
)


FIELD_TYPES = {f.name: str(f.type) for f in fields(DeepSettings)}  # "int" | "float" | "str" (annotations are strings here)


def setting_value(field: str, text: str) -> object:
    """The text of a --set value as the type of DeepSettings' field."""
    match FIELD_TYPES[field]:
        case "int":
            return int(text)
        case "float":
            return float(text)
        case "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        case _:
            return text


def movielens_settings(args: argparse.Namespace, models: list[str]) -> dict[str, DeepSettings]:
    """Each model's settings: MOVIELENS_SETTINGS (SASRec's for models without their own), then the flags
    given for every model, then --set MODEL.FIELD=VALUE. A bad item exits naming it."""
    common = {name: getattr(args, name) for name in SETTING_FLAGS if getattr(args, name) is not None}
    per_model: dict[str, dict[str, Any]] = {}  # field -> a value of its type (setting_value)
    for item in args.set or []:
        target, eq, text = item.partition("=")
        model, dot, field = target.partition(".")
        if not eq or not dot:
            raise SystemExit(f"benchmarks/sequential.py: --set {item!r}: expected MODEL.FIELD=VALUE (e.g. hugerec-hstu.layers=4)")
        if model not in models:
            raise SystemExit(f"benchmarks/sequential.py: --set {item!r}: model {model!r} is not in --models {models}")
        if field not in FIELD_TYPES:
            raise SystemExit(f"benchmarks/sequential.py: --set {item!r}: unknown field {field!r}; known: {sorted(FIELD_TYPES)}")
        try:
            per_model.setdefault(model, {})[field] = setting_value(field, text)
        except ValueError:
            wanted = {"int": "an integer", "float": "a number", "bool": "true or false"}[FIELD_TYPES[field]]
            raise SystemExit(f"benchmarks/sequential.py: --set {item!r}: {field} must be {wanted}, got {text!r}") from None
    out: dict[str, DeepSettings] = {}
    for model in models:
        if per_model.get(model, {}).get("times") and model != "hugerec-hstu":
            raise SystemExit(f"benchmarks/sequential.py: --set {model}.times=true: {model} cannot use timestamps (hugerec-hstu can)")
        try:
            out[model] = replace(MOVIELENS_SETTINGS.get(model, MOVIELENS_SETTINGS["hugerec-sasrec"]), **common, **per_model.get(model, {}))
        except ValueError as e:
            given = [f"{model}.{k}={v}" for k, v in per_model.get(model, {}).items()] + [f"--{k.replace('_', '-')} {v}" for k, v in common.items()]
            raise SystemExit(f"benchmarks/sequential.py: the settings of {model} ({', '.join(given)}): {e}") from None
    return out


def check_decay_horizons(args: argparse.Namespace, settings: dict[str, DeepSettings]) -> None:
    """Exits, naming the model, when a run would train past its lr decay's horizon (the lr is 0 there)."""
    override = epochs_by_model(args.epochs)
    for name, s in settings.items():
        if not s.lr_decay_epochs:
            continue
        if override.get(name):
            longest, what = override[name], f"--epochs {name}={override[name]}"
        else:
            longest = 2 if args.quick else args.max_epochs
            what = f"--max-epochs {longest}" + (" (--quick)" if args.quick else "")
        if longest > s.lr_decay_epochs:
            raise SystemExit(
                f"benchmarks/sequential.py: {name}: {what} trains past its lr decay of {s.lr_decay_epochs} epochs; "
                "give at most as many epochs as the decay's horizon (or a longer --lr-decay-epochs)"
            )


def movielens(records: Records, args: argparse.Namespace, settings: dict[str, DeepSettings]) -> None:
    models = model_list(args)
    print("quality movielens (leave-last-out, history excluded, full ranking)", flush=True)
    for name, got in settings.items():
        print(f"  {name}: {got}", flush=True)
    valid, test = movielens_splits()
    if args.save_test_checkpoints:
        for name in models:
            for seed in seed_range(args):
                save_test_checkpoints(name, test, settings[name], args.max_epochs, seed, Path(args.save_test_checkpoints))
        return
    quality(
        records, "movielens", valid, test, args.quick, models, settings, ("recall@10", "ndcg@10"), 10, seed_range(args),
        2 if args.quick else args.max_epochs, args.patience, epochs_by_model(args.epochs), 24 if args.quick else None, not args.no_baselines,
        None if args.checkpoints is None else Path(args.checkpoints), args.valid_seed, average_grid(args.average_epochs_grid),
    )


def yoochoose(records: Records, args: argparse.Namespace) -> None:
    print("quality yoochoose (every prefix, unseen items removed, full ranking)", flush=True)
    valid, test = yoochoose_splits()
    models = [m for m in model_list(args) if m != "hugerec-hstu"]  # HSTU is measured on MovieLens
    settings = dict.fromkeys(models, DeepSettings(max_len=20, lr=3e-3, batch=256, windows="last", layers=2, heads=1))
    quality(
        records, "yoochoose", valid, test, args.quick, models, settings, ("recall@20", "mrr@20"), 20, seed_range(args),
        2 if args.quick else args.max_epochs, args.patience, epochs_by_model(args.epochs), 40 if args.quick else None, not args.no_baselines,
    )


# -- throughput -------------------------------------------------------------------------------------------
class TorchSASRec(nn.Module):
    """The plain-PyTorch reference: nn.Embedding + nn.TransformerEncoder, output tied to the embedding, full softmax."""

    def __init__(self, num_items: int, max_len: int, dim: int) -> None:
        super().__init__()
        self.items = nn.Embedding(num_items + 1, dim, padding_idx=0)
        nn.init.normal_(self.items.weight, std=dim**-0.5)
        self.positions = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, 1, 4 * dim, dropout=0.2, batch_first=True, norm_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.scale = dim**0.5

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        length = seq.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool).triu(1)  # True = masked
        x = self.items(seq) * self.scale + self.positions.weight[-length:]
        return self.norm(self.encoder(x, mask=causal, is_causal=True))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        seq, target = batch[:, :-1], batch[:, 1:]
        h = self(seq)
        valid = (seq != 0) & (target != 0)
        logits = h[valid] @ self.items.weight[1:].T  # [N, I]: the full softmax
        return F.cross_entropy(logits, target[valid] - 1)


def synthetic_sequences(num_items: int, n: int, length: int, seed: int) -> Sequences:
    """Chains over a 1M-item catalogue: 5,000 hot items (Zipf), the next item is the current one's successor
    in a fixed random order with probability 0.6, else a popularity draw."""
    rng = np.random.default_rng(seed)
    hot = rng.choice(num_items, 5000, replace=False) + 1
    succ = dict(zip(hot.tolist(), np.roll(hot, -1).tolist(), strict=True))
    pop = 1.0 / np.arange(1, 5001)
    pop /= pop.sum()
    items = np.empty((n, length), dtype=np.int64)
    items[:, 0] = rng.choice(hot, n, p=pop)
    nxt = np.vectorize(succ.__getitem__)
    for t in range(1, length):
        jump = rng.random(n) >= 0.6
        items[:, t] = np.where(jump, rng.choice(hot, n, p=pop), nxt(items[:, t - 1]))
    return Sequences(np.arange(n), np.arange(0, n * length + 1, length, dtype=np.int64), items.ravel(), np.zeros(n * length, np.int64))


def recall_at_10(score: Callable[[int, int], torch.Tensor], targets: np.ndarray, num_items: int) -> float:
    return rank_metrics(target_ranks(score, targets, num_items, None, block=32), ks=(10,))["recall@10"]


def throughput(records: Records, quick: bool, seed: int, seconds: float | None = None) -> None:
    num_items, max_len, dim = 1_000_000, 50, 64
    shape = "synthetic-1m-items len50 dim64"
    print(f"train {shape}", flush=True)
    train = synthetic_sequences(num_items, 6000, max_len + 1, seed)
    test = synthetic_sequences(num_items, 200, max_len + 1, seed)  # same source (the seed fixes the hot set)
    test_hist, test_tgt = test.items.reshape(200, -1)[:, :-1], test.items.reshape(200, -1)[:, -1]
    budget = seconds or (15.0 if quick else 45.0)
    torch.manual_seed(seed)

    # hugerec
    cfg = SequenceConfig(num_items=num_items, max_len=max_len, dim=dim, num_layers=2, num_heads=1, dropout=0.2)
    ours = SASRec(cfg, optimizer=Adam(lr=3e-3))
    loss = SampledSoftmax(negatives=Negatives.MIXED, num_negatives=1024, alpha=1.0)
    family = SequentialFamily(loss, item_counts=np.bincount(train.items, minlength=num_items + 1))
    windows = last_n(train, window_width(ours))
    batches = window_batches(windows, 128, seed)

    def for_seconds(limit: float) -> EpochBatches[torch.Tensor]:  # the windows' batches until `limit` s have passed
        def make(epoch: int) -> Any:
            end = time.perf_counter() + limit
            for e in itertools.count(epoch):
                for b in batches.make(e):
                    if time.perf_counter() >= end:
                        return
                    yield b

        return EpochBatches(make)

    # one fit, its pipeline on, over the batches the budget allows (the warm-up fit first: JIT, allocator)
    quiet = TrainConfig(lr=3e-3, seed=seed, log_every=1_000_000, progress=False, tensorboard=False, plot=False)
    fit(ours, for_seconds(3.0), None, quiet, family=family)
    t0 = time.perf_counter()
    history = fit(ours, for_seconds(budget), None, quiet, family=family)
    elapsed = time.perf_counter() - t0
    steps = history.steps
    ours_sps = steps * 128 / elapsed
    ours_recall = recall_at_10(model_scores(ours, test_hist), test_tgt, num_items)

    # plain PyTorch: dense Adam over the 1M x 64 table, full softmax; batch 8 (the [N, 1M] logits take ~1.6 GB)
    ref = TorchSASRec(num_items, max_len, dim)
    opt = torch.optim.Adam(ref.parameters(), lr=3e-3)
    windows_t = torch.from_numpy(windows)
    ref_batch = 8
    gen = torch.Generator().manual_seed(seed)

    def ref_step() -> None:
        batch = windows_t[torch.randint(0, len(windows_t), (ref_batch,), generator=gen)]
        loss_value = ref.loss(batch)
        opt.zero_grad()
        loss_value.backward()
        opt.step()

    ref.train()
    ref_step()
    t0 = time.perf_counter()
    ref_steps = 0
    while time.perf_counter() - t0 < budget:
        ref_step()
        ref_steps += 1
    ref_sps = ref_steps * ref_batch / (time.perf_counter() - t0)
    ref.eval()
    with torch.no_grad():
        q = ref(torch.from_numpy(test_hist))[:, -1]
        w = ref.items.weight[1:]
    ref_recall = recall_at_10(lambda q0, q1: q[q0:q1] @ w.T, test_tgt, num_items)
    ratio = ours_sps / ref_sps
    print(f"  hugerec-sasrec {ours_sps:8.1f} samples/s  recall@10 {ours_recall:.4f}  ({steps} steps in {elapsed:.0f} s)", flush=True)
    print(f"  torch-sasrec   {ref_sps:8.1f} samples/s  recall@10 {ref_recall:.4f}  ({ref_steps} steps of {ref_batch})", flush=True)
    print(f"  throughput ratio {ratio:.1f}x (target >= 3x at equal or better recall@10)", flush=True)
    record(records, f"train {shape}", "hugerec-sasrec", ours_sps, "samples/s")
    record(records, f"train {shape}", "torch-sasrec", ref_sps, "samples/s")
    record(records, f"train {shape} ratio", "hugerec-sasrec", ratio, "x torch-sasrec")
    record(records, f"quality synthetic-1m recall@10 after {budget:.0f} s", "hugerec-sasrec", ours_recall, "fraction")
    record(records, f"quality synthetic-1m recall@10 after {budget:.0f} s", "torch-sasrec", ref_recall, "fraction")


def merge(paths: list[str]) -> Records:
    """Records of several runs of the quality parts (seeds in parallel processes, baselines in another) -> one
    set: each model's per-seed test figures pooled (mean, spread), the baselines', and the ratios that
    `quality` prints, as if one process had run them all."""
    seeds: dict[tuple[str, str, str], dict[int, float]] = {}  # (dataset, model, metric) -> seed -> value
    base: dict[tuple[str, str], dict[str, float]] = {}  # (dataset, metric) -> baseline -> value
    out: Records = []
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                words = r["config"].split()
                if words[0] != "quality" or len(words) < 3:
                    continue
                dataset, metric = words[1], words[2]
                if len(words) == 5 and words[3] == "seed":
                    seeds.setdefault((dataset, r["method"], metric), {})[int(words[4])] = r["value"]
                elif len(words) == 3 and not r["method"].startswith("hugerec"):
                    base.setdefault((dataset, metric), {})[r["method"]] = r["value"]
                elif words[2] in ("epochs", "valid"):  # the chosen epochs, the validation curves: as they are
                    out.append(r)
    means: dict[tuple[str, str, str], float] = {}
    for (dataset, model, metric), per_seed in sorted(seeds.items()):
        values = [per_seed[s] for s in sorted(per_seed)]
        means[(dataset, model, metric)] = float(np.mean(values))
        record(out, f"quality {dataset} {metric}", model, means[(dataset, model, metric)], "fraction")
        record(out, f"quality {dataset} {metric} spread", model, float(np.std(values)), "std over seeds")
        for s in sorted(per_seed):
            record(out, f"quality {dataset} {metric} seed {s}", model, per_seed[s], "fraction")
        print(f"  {dataset} {model} {metric}: {means[(dataset, model, metric)]:.4f} +- {np.std(values):.4f} over seeds {sorted(per_seed)}")
    for (dataset, metric), by_method in sorted(base.items()):
        for method, v in by_method.items():
            record(out, f"quality {dataset} {metric}", method, v, "fraction")
    for (dataset, model, metric), mean in sorted(means.items()):
        short = model.removeprefix("hugerec-")
        if (dataset, metric) in base:
            strongest = max(base[(dataset, metric)], key=lambda b: base[(dataset, metric)][b])
            ratio = mean / base[(dataset, metric)][strongest]
            record(out, f"{dataset} {short}", model, ratio, f"{metric} x {strongest} (strongest baseline)")
            print(f"  {model} / strongest baseline ({strongest}) {dataset} {metric}: {ratio:.3f}x")
        if model == "hugerec-hstu" and (dataset, "hugerec-sasrec", metric) in means:
            ratio = mean / means[(dataset, "hugerec-sasrec", metric)]
            record(out, f"{dataset} {short}", model, ratio, f"{metric} x hugerec-sasrec")
            print(f"  {model} / hugerec-sasrec {dataset} {metric}: {ratio:.3f}x")
    return out


# -- HSTU: jagged against padded training, cached against uncached scoring --------------------------------
def movielens_windows(max_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The ML-1M training shape: each user's last max_len + 1 items (left-padded), their timestamps, and the catalogue size."""
    users = group_sequences(read_movielens(DATA / "movielens" / "ml-1m" / "ratings.dat.gz"), key="user", drop_repeats=False)
    vocab = ItemVocabulary.fit(users.items)
    seqs, _ = vocab.encode(users)
    return last_n(seqs, max_len + 1), last_n(seqs, max_len + 1, values=seqs.timestamps), vocab.num_items


def hstu_train(records: Records, quick: bool, seed: int) -> None:
    """Training samples/s of the same HSTU (max_len 200, dim 64, 2 layers, 2 heads, 128 uniform sampled
    negatives, batch 128) on the jagged layout and on the padded plain-torch one, step by step in turn on
    the same batches; and the jagged layout with the windows' timestamps (time buckets on): their cost."""
    max_len, batch = 200, 128
    windows, window_times, num_items = movielens_windows(max_len)
    lengths = (windows != 0).sum(axis=1) - 1
    print(f"hstu train (ML-1M shape: {len(windows)} users' last {max_len} items, mean length {lengths.mean():.0f}, batch {batch})", flush=True)
    cfg = SequenceConfig(num_items=num_items, max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2)
    loss = SampledSoftmax(negatives=Negatives.UNIFORM, num_negatives=128)
    counts = np.bincount(windows.ravel(), minlength=num_items + 1).astype(np.float64)
    counts[0] = 0.0
    families = {  # the step `fit` runs: prepare, then the loss
        False: SequentialFamily(loss, item_counts=counts),
        True: SequentialFamily(loss, item_counts=counts, times=True),
    }
    sides = {}
    for name, layout, timed in (
        ("hugerec-hstu-jagged", Layout.JAGGED, False), ("torch-hstu-padded", Layout.PADDED, False), ("hugerec-hstu-jagged-times", Layout.JAGGED, True),
    ):
        torch.manual_seed(seed)
        model = HSTU(cfg, optimizer=Adam(lr=1e-3), options=HSTUOptions(temperature=0.05), layout=layout)
        model.train()
        ctx = StepContext(torch.device("cpu"), torch.Generator().manual_seed(seed))
        sides[name] = (model, torch.optim.Adam(list(model.parameters()), lr=1e-3), ctx, timed)
    data, data_times = torch.from_numpy(windows), torch.from_numpy(window_times)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    steps = 2 if quick else 8
    seconds = dict.fromkeys(sides, 0.0)
    cpu = dict.fromkeys(sides, 0.0)  # this process's CPU seconds: on a loaded machine, wall time is mostly waiting
    for step in range(steps + 1):  # step 0 warms up (JIT, allocator)
        rows = order[(step * batch) % len(data) :][:batch]
        b, bt = data[rows], TimedWindows(data[rows], data_times[rows])
        for name, (model, opt, ctx, timed) in sides.items():
            family = families[timed]
            t0, c0 = time.perf_counter(), time.process_time()
            value = family.step_loss(model, family.prepare(model, bt if timed else b, ctx), ctx)
            opt.zero_grad()
            value.backward()
            opt.step()
            if step:
                seconds[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
    rates = {name: steps * batch / sec for name, sec in seconds.items()}
    cpu_rates = {name: steps * batch / sec for name, sec in cpu.items()}
    for name, rate in rates.items():
        record(records, "hstu train", name, rate, "samples/s")
        record(records, "hstu train cpu", name, cpu_rates[name], "samples per CPU second")
        print(f"  {name:20s} {rate:8.1f} samples/s, {cpu_rates[name]:8.1f} samples per CPU second ({steps} steps)", flush=True)
    ratio = rates["hugerec-hstu-jagged"] / rates["torch-hstu-padded"]
    cpu_ratio = cpu_rates["hugerec-hstu-jagged"] / cpu_rates["torch-hstu-padded"]
    record(records, "hstu train", "hugerec-hstu-jagged", ratio, "x torch-hstu-padded")
    record(records, "hstu train cpu", "hugerec-hstu-jagged", cpu_ratio, "x torch-hstu-padded")
    print(f"  jagged / padded: {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU time (target >= 3x)", flush=True)
    times_cpu = cpu_rates["hugerec-hstu-jagged-times"] / cpu_rates["hugerec-hstu-jagged"]
    record(records, "hstu train times", "hugerec-hstu-jagged-times", times_cpu, "x hugerec-hstu-jagged (samples per CPU second)")
    print(f"  jagged with times / without: {rates['hugerec-hstu-jagged-times'] / rates['hugerec-hstu-jagged']:.2f}x wall, {times_cpu:.2f}x CPU time", flush=True)


def hstu_scoring(records: Records, quick: bool, seed: int) -> None:
    """1,024 candidates for one 199-item history, ranking-head scores: cached (history once, micro-batches
    of 256 candidates) against one forward per candidate and one batched forward of 1,024 sequences."""
    max_len, num_candidates = 200, 1024
    windows, _, num_items = movielens_windows(max_len)
    full = windows[(windows != 0).sum(axis=1) == max_len + 1]  # users with a full-length history
    history = torch.from_numpy(full[0, 1:-1])[None]  # [1, 199]
    torch.manual_seed(seed)
    model = HSTU(SequenceConfig(num_items=num_items, max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2)).eval()
    candidates = torch.randint(1, num_items + 1, (1, num_candidates), generator=torch.Generator().manual_seed(seed))
    print(f"hstu cached scoring ({num_candidates} candidates, a {history.shape[1]}-item history, dim 64, 2 layers)", flush=True)
    each = 32 if quick else 256  # one-forward-each is timed on this many candidates and scaled to all of them

    def timed(fn: Callable[[], torch.Tensor], repeat: int) -> tuple[float, torch.Tensor]:
        fn()  # warm-up
        t0 = time.perf_counter()
        for _ in range(repeat):
            out = fn()
        return (time.perf_counter() - t0) / repeat, out

    with torch.no_grad():
        cached_s, cached = timed(lambda: model.candidate_scores(history, candidates, micro_batch=256), 3 if quick else 10)
        batched_s, batched = timed(lambda: model.candidate_scores_uncached(history, candidates), 1 if quick else 3)
        one_s, one = timed(lambda: torch.cat([model.candidate_scores_uncached(history, candidates[:, c : c + 1]) for c in range(each)], dim=1), 1)
    torch.testing.assert_close(cached, batched, rtol=1e-3, atol=1e-4)  # the same scores three ways
    torch.testing.assert_close(cached[:, :each], one, rtol=1e-3, atol=1e-4)
    one_s *= num_candidates / each
    for name, sec in (("hugerec-hstu-cached", cached_s), ("hstu-one-forward-each", one_s), ("hstu-batched-uncached", batched_s)):
        record(records, "hstu cached scoring", name, sec * 1000, "ms per 1,024 candidates", higher=False)
        print(f"  {name:22s} {sec * 1000:9.1f} ms", flush=True)
    for name, sec, target in (("hstu-one-forward-each", one_s, 10), ("hstu-batched-uncached", batched_s, 3)):
        record(records, "hstu cached scoring", "hugerec-hstu-cached", sec / cached_s, f"x {name}")
        print(f"  cached vs {name}: {sec / cached_s:.1f}x (target >= {target}x)", flush=True)


def hstu_serving(records: Records, quick: bool, seed: int) -> None:
    """The served next-items answer of the same HSTU weights exported with times (requests carry "items.times")
    and without: median ms per request, in turn on the same histories (ML-1M users' last 50 items)."""
    import tempfile

    from hugerec.models.hstu import HSTUConfig
    from hugerec.serving.bundles.next_items_bundle import load_next_items, write_next_items_bundle
    from hugerec.training.model_file import RawIds, save_model

    max_len = 50
    windows, window_times, num_items = movielens_windows(max_len)
    full = (windows[:, 1:] != 0).all(axis=1)
    histories, times = windows[full][:, 1:], window_times[full][:, 1:]  # users with 50 items: [U, 50] dense ids, seconds
    torch.manual_seed(seed)
    config = HSTUConfig(max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2, times=True)
    model = HSTU(config.sequence_config(num_items), Adam(lr=1e-3), config.options())
    with torch.no_grad():  # time biases that are read (a fresh model's are zeros)
        for layer in model.blocks:
            layer.time_bias.normal_(generator=torch.Generator().manual_seed(seed))
    raw = np.arange(1, num_items + 1, dtype=np.int64) * 7  # raw id of dense item d: 7 d
    counts = np.concatenate([[0], np.ones(num_items)]).astype(np.int64)
    repeats = 20 if quick else 100
    print(f"hstu serving (next-items answers of an HSTU bundle with times and without, {len(histories)} users' last {max_len} items, {repeats} requests per side)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        served = {}
        for name, timed in (("hugerec-hstu-times", True), ("hugerec-hstu", False)):
            path = Path(tmp) / f"{name}.pt"
            save_model(path, model, replace(config, times=timed), Adam(lr=1e-3), ids=RawIds(raw, counts))
            served[name] = load_next_items(write_next_items_bundle(path, Path(tmp) / name, name=name, k=10))
        rng = np.random.default_rng(seed)
        for b in (1, 64):
            bodies: dict[str, list[bytes]] = {name: [] for name in served}
            for _ in range(repeats):
                rows = rng.choice(len(histories), b, replace=False)
                inputs = [
                    {"name": "items", "datatype": "INT64", "shape": [b * max_len], "data": raw[histories[rows] - 1].ravel().tolist()},
                    {"name": "items.lengths", "datatype": "INT64", "shape": [b], "data": [max_len] * b},
                ]
                seconds = {"name": "items.times", "datatype": "INT64", "shape": [b * max_len], "data": times[rows].ravel().tolist()}
                bodies["hugerec-hstu-times"].append(json.dumps({"inputs": [*inputs, seconds]}).encode())
                bodies["hugerec-hstu"].append(json.dumps({"inputs": inputs}).encode())
            ms: dict[str, list[float]] = {name: [] for name in served}
            for i in range(repeats + 1):  # request 0 warms up
                for name, model_side in served.items():
                    t0 = time.perf_counter()
                    model_side.answer(bodies[name][max(i - 1, 0)], None)
                    if i:
                        ms[name].append((time.perf_counter() - t0) * 1000)
            record_medians(records, f"hstu serving B={b}", ms, "hugerec-hstu-times", "hugerec-hstu", f"B={b}")


def pipelines_in_turn(
    runners: dict[str, Any], user_of: Callable[[int], int], requests: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Two pipelines answering the same users in turn, request 0 a warm-up: each side's wall ms and thread CPU
    ms per request (the thread's CPU time: what load inflates least) and how many of the answers differ."""
    from hugerec.serving.pipeline import Query

    ms: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    differ = 0
    for i in range(requests + 1):
        answers = []
        for name, runner in runners.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            rec = runner.recommend(Query(user_of(i), 10))
            if i:
                ms[name].append((time.perf_counter() - t0) * 1000)
                cpu[name].append((time.thread_time() - c0) * 1000)
            answers.append(rec.items.tolist())
        differ += bool(i) and answers[0] != answers[1]
    return ms, cpu, differ


def hstu_pipeline(records: Records, quick: bool, seed: int) -> None:
    """The served pipeline (retrieve: the HSTU's next items and popular ones; filter: seen; score: the HSTU's
    cached candidate scoring; order: top 10) with the same HSTU weights trained with times (a timed store, the
    model reading each stored rating's time) and without: median ms per request, users in turn."""
    import tempfile

    from hugerec.models.hstu import HSTUConfig
    from hugerec.serving.bundles.next_items_bundle import load_next_items, write_next_items_bundle
    from hugerec.serving.pipeline import (
        Filter,
        Order,
        PipelineRunner,
        PipelineSpec,
        Popular,
        Resources,
        Retrieve,
        Score,
        Sequential,
    )
    from hugerec.serving.pipeline.feature_store import FeatureStore
    from hugerec.serving.pipeline.interaction_store import InteractionStore
    from hugerec.training.model_file import RawIds, save_model

    max_len = 50
    windows, window_times, num_items = movielens_windows(max_len)  # [U, 51] each user's last 51 ratings, seconds
    known = windows != 0
    users = np.repeat(np.arange(len(windows)), known.sum(axis=1))  # [N] events, each user's in time order
    raw = np.arange(1, num_items + 1, dtype=np.int64) * 7  # raw id of dense item d: 7 d
    items, seconds = raw[windows[known] - 1], window_times[known]
    torch.manual_seed(seed)
    # a timing of untrained weights: the config says ranking_weight 1 because the Score stage takes no bundle
    # whose ranking head was never trained; its values do not change the work
    config = HSTUConfig(max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2, times=True, ranking_weight=1.0)
    model = HSTU(config.sequence_config(num_items), Adam(lr=1e-3), config.options())
    with torch.no_grad():  # time biases that are read (a fresh model's are zeros)
        for layer in model.blocks:
            layer.time_bias.normal_(generator=torch.Generator().manual_seed(seed))
    counts = np.concatenate([[0], np.bincount(windows[known], minlength=num_items + 1)[1:]]).astype(np.int64)
    popular = raw[np.argsort(-counts[1:], kind="stable")]
    features = FeatureStore.in_memory({"user": ("age",), "item": ("count",)})
    features.write("user", np.arange(len(windows)), {"age": np.full(len(windows), 30.0)})
    features.write("item", raw, {"count": counts[1:].astype(np.float64)})
    spec = PipelineSpec((Retrieve((Sequential(200), Popular(100))), Filter(exclude_seen=True), Score(sequential=True), Order(max_k=10)))
    requests = 30 if quick else 200
    rng = np.random.default_rng(seed)
    asked = rng.choice(len(windows), requests, replace=False).tolist()
    print(f"hstu pipeline (retrieve 200 HSTU + 100 popular, drop seen, HSTU cached scoring, top 10; {len(windows)} users' last "
          f"{max_len + 1} ratings; {requests} requests per side, in turn)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        runners = {}
        for name, timed in (("hugerec-hstu-times", True), ("hstu-without-times", False)):
            path = Path(tmp) / f"{name}.pt"
            save_model(path, model, replace(config, times=timed), Adam(lr=1e-3), ids=RawIds(raw, counts))
            seq = load_next_items(write_next_items_bundle(path, Path(tmp) / name, name=name, k=10))
            store = InteractionStore.from_pairs(users, items, times=seconds if timed else None)
            runners[name] = PipelineRunner(spec, Resources(features, store, popular=popular, sequential=seq))  # the models read max_len
        assert runners["hugerec-hstu-times"].needs_times and not runners["hstu-without-times"].needs_times
        ms, cpu, differ = pipelines_in_turn(runners, lambda i: asked[max(i - 1, 0)], requests)
    for config_name, values_of in (("hstu pipeline", ms), ("hstu pipeline cpu", cpu)):
        record_medians(records, config_name, values_of, "hugerec-hstu-times", "hstu-without-times", config_name)
    print(f"  {differ} of {requests} answers differ (the times are read)", flush=True)


def hstu_history(records: Records, quick: bool, seed: int) -> None:
    """The four-stage pipeline (the HSTU's next 200 items and 100 popular ones, seen items dropped, every
    candidate ranked by the HSTU's cached scoring, top 10) for users with 1,000 stored items (the interaction
    store's default bound): each model handed the whole history and reading its own max_len of it
    (hugerec-whole-history, the default now) against every model handed the last 50 (last-50-history: the
    fixed Resources.max_history of before, here declared as max_history = 50); an untrained HSTU of ML-1M shape
    (max_len 50, dim 64, 2 layers, 2 heads) over 3,615 items, one user per request, the sides in turn: median
    ms and the thread's CPU ms per request, and how many answers differ (the source then leaves every seen
    item out of its 200, as its bundle does, instead of the last 50 only)."""
    import tempfile

    from hugerec.models.hstu import HSTUConfig
    from hugerec.serving.bundles.next_items_bundle import load_next_items, write_next_items_bundle
    from hugerec.serving.pipeline import (
        Filter,
        Order,
        PipelineRunner,
        PipelineSpec,
        Popular,
        Resources,
        Retrieve,
        Score,
        Sequential,
    )
    from hugerec.serving.pipeline.feature_store import FeatureStore
    from hugerec.serving.pipeline.interaction_store import InteractionStore
    from hugerec.training.model_file import RawIds, save_model

    num_items, max_len, stored, users = 3615, 50, 1000, 200
    torch.manual_seed(seed)
    config = HSTUConfig(max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2, ranking_weight=1.0)  # "trained": the Score stage's check
    model = HSTU(config.sequence_config(num_items), Adam(lr=1e-3), config.options())
    raw = np.arange(1, num_items + 1, dtype=np.int64)
    counts = np.r_[0, np.arange(num_items, 0, -1)].astype(np.int64)
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, num_items + 1)
    events = rng.choice(raw, (users, stored), p=pop / pop.sum())  # each user's 1,000 items, Zipf-popular
    features = FeatureStore.in_memory({"user": ("age",), "item": ("count",)})
    features.write("item", raw, {"count": counts[1:].astype(np.float64)})
    stages = (Retrieve((Sequential(200), Popular(100))), Filter(exclude_seen=True), Score(sequential=True), Order(max_k=10))
    requests = 30 if quick else 200
    print(f"hstu pipeline history ({users} users of {stored} stored items, max_len {max_len}; {requests} requests per side, in turn)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_model(Path(tmp) / "hstu.pt", model, config, Adam(lr=1e-3), ids=RawIds(raw, counts))
        seq = load_next_items(write_next_items_bundle(Path(tmp) / "hstu.pt", Path(tmp) / "bundle", k=10))
        store = InteractionStore.from_pairs(np.repeat(np.arange(users), stored), events.ravel())
        resources = Resources(features, store, popular=raw[np.argsort(-counts[1:], kind="stable")], sequential=seq)
        runners = {"hugerec-whole-history": PipelineRunner(PipelineSpec(stages), resources),
                   "last-50-history": PipelineRunner(PipelineSpec(stages, max_history=50), resources)}
        ms, cpu, differ = pipelines_in_turn(runners, lambda i: i % users, requests)
    for config_name, values_of in (("hstu pipeline history", ms), ("hstu pipeline history cpu", cpu)):
        record_medians(records, config_name, values_of, "hugerec-whole-history", "last-50-history", config_name, "whole history / last 50")
    print(f"  {differ} of {requests} answers differ (the sequential source leaves out every seen item)", flush=True)


STAGED_ITEMS = 200_000  # the catalogue of `hstu staged lookup`: a table worth a disk tier (rows + Adam state ~150 MB)


def hstu_staged(records: Records, quick: bool, seed: int) -> None:
    """HSTU trained by `fit` with its item table on the disk tier (a RAM cache of 16,384 of 200,002 rows) and
    dynamic (raw keys through the hash table), the training pipeline on (hugerec-hstu-staged: the step's lookup,
    HSTU's items without padding and its candidates, staged a step ahead in the worker thread) against off
    (hstu-unstaged: the lookup in the step, the only way these tables trained before `HSTU.lookup_features`:
    the pipeline refused a lookup it had not staged). Synthetic chains (5,000 hot items), max_len 50, dim 64,
    2 layers, 2 heads, 128 uniform sampled negatives, batch 128; the sides alternate, the same steps each, after
    a round that warms up: samples/s, samples per CPU second, the ratio, and the weights compared (the same bit
    for bit)."""
    import dataclasses
    import shutil
    import tempfile

    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.table_config import DynamicConfig, Storage
    from hugerec.models.sequence import item_table

    num_items, max_len, batch = STAGED_ITEMS, 50, 128
    steps, rounds = (6, 1) if quick else (20, 3)
    windows = last_n(synthetic_sequences(num_items, steps * batch, max_len + 1, seed), max_len + 1)
    cfg = SequenceConfig(num_items=num_items, max_len=max_len, dim=64, num_layers=2, num_heads=2, dropout=0.2)
    family = SequentialFamily(SampledSoftmax(negatives=Negatives.UNIFORM, num_negatives=128), item_counts=np.ones(num_items + 1))
    print(f"hstu staged lookup (synthetic {num_items:,}-item catalogue, max_len {max_len}, batch {batch}, {steps} steps x {rounds} "
          "rounds per side, in turn)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tables = {  # the item table of a run whose files go in folder `run_dir`
            "disk": lambda run_dir: dataclasses.replace(item_table(cfg), storage=Storage.DISK, cache_rows=16384, path=str(run_dir / "items.rows")),
            "dynamic": lambda run_dir: dataclasses.replace(item_table(cfg), dynamic=DynamicConfig()),
        }
        for kind, table in tables.items():
            wall = {"hugerec-hstu-staged": 0.0, "hstu-unstaged": 0.0}
            cpu = dict.fromkeys(wall, 0.0)
            hidden: list[float] = []
            prefetch_ms: list[float] = []  # the worker's preparation per step (decode, negatives, the staging)
            weights: dict[str, list[torch.Tensor]] = {}
            for r in range(rounds + 1):  # round 0 warms up (Numba's compilation, the allocator, the page cache)
                for name, pipeline in (("hstu-unstaged", False), ("hugerec-hstu-staged", True)):
                    torch.manual_seed(seed)
                    model = HSTU(cfg, optimizer=Adam(lr=1e-3), options=HSTUOptions(temperature=0.05))
                    run_dir = Path(tmp) / f"{kind}-{name}-{r}"  # a file per run, removed after it
                    run_dir.mkdir()
                    model.lookup.items = EmbeddingCollection([table(run_dir)], Adam(lr=1e-3))
                    train_cfg = TrainConfig(epochs=1, lr=1e-3, pipeline=pipeline, seed=seed, progress=False, tensorboard=False, plot=False, log_every=steps)
                    t0, c0 = time.perf_counter(), time.process_time()
                    history = fit(model, window_batches(windows, batch, seed=seed), None, train_cfg, family=family)
                    if r:
                        wall[name] += time.perf_counter() - t0
                        cpu[name] += time.process_time() - c0
                    if pipeline and r:
                        hidden.append(float(history.train[-1].get("prefetch_hidden", 0.0)))
                        prefetch_ms.append(float(history.train[-1].get("prefetch_ms", 0.0)))
                    weights[name] = [p.detach().clone() for p in model.parameters()]
                    weights[name] += [model.item_vectors(ids).detach() for ids in torch.arange(1, 5001).split(4096)]  # table rows too
                    del model, history
                    shutil.rmtree(run_dir)
            same = all(torch.equal(a, b) for a, b in zip(weights["hstu-unstaged"], weights["hugerec-hstu-staged"], strict=True))
            config = f"hstu staged lookup {kind}"
            samples = steps * batch * rounds
            for name in wall:
                record(records, config, name, samples / wall[name], "samples/s")
                record(records, config + " cpu", name, samples / cpu[name], "samples per CPU second")
            ratio = wall["hstu-unstaged"] / wall["hugerec-hstu-staged"]
            record(records, config, "hugerec-hstu-staged", ratio, "x hstu-unstaged")
            record(records, config + " cpu", "hugerec-hstu-staged", cpu["hstu-unstaged"] / cpu["hugerec-hstu-staged"], "x hstu-unstaged")
            print(f"  {kind:8s} staged {samples / wall['hugerec-hstu-staged']:7.1f} samples/s, unstaged {samples / wall['hstu-unstaged']:7.1f}: "
                  f"{ratio:.2f}x wall, {cpu['hstu-unstaged'] / cpu['hugerec-hstu-staged']:.2f}x CPU; prefetch {np.mean(prefetch_ms):.1f} ms "
                  f"per step, {np.mean(hidden):.2f} of it hidden; weights {'the same' if same else 'DIFFER'}", flush=True)
            if not same:
                raise SystemExit(f"benchmarks/sequential.py: hstu staged lookup {kind}: the staged run trained other weights")


def softmax_loss(records: Records, quick: bool, seed: int) -> None:
    """The full-softmax loss of a MovieLens step (N 6,400 positions, 3,615 items, dim 64) with its backward:
    hugerec's blocked loss against F.cross_entropy on the [N, I] logits, in turn, same inputs; wall and
    this process's CPU seconds per call."""
    n, num_items, dim = 6400, 3615, 64
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, dim, generator=gen).requires_grad_()
    w = torch.randn(num_items, dim, generator=gen).requires_grad_()
    t = torch.randint(0, num_items, (n,), generator=gen)
    sides: dict[str, Callable[[], torch.Tensor]] = {
        "hugerec-blocked-full-softmax": lambda: full_softmax(q, w, t),
        "torch-cross-entropy": lambda: F.cross_entropy(q @ w.T, t),
    }
    repeats = 3 if quick else 10
    wall, cpu = dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0.0)
    print(f"full softmax loss + backward (N {n}, I {num_items}, D {dim}; {repeats} calls per side, in turn)", flush=True)
    for r in range(repeats + 1):  # call 0 warms up
        for name, fn in sides.items():
            q.grad = w.grad = None
            t0, c0 = time.perf_counter(), time.process_time()
            fn().backward()
            if r:
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
    for name in sides:
        record(records, "full softmax loss", name, wall[name] / repeats * 1000, "ms per call", higher=False)
        record(records, "full softmax loss cpu", name, cpu[name] / repeats * 1000, "CPU ms per call", higher=False)
        print(f"  {name:30s} {wall[name] / repeats * 1000:8.1f} ms, {cpu[name] / repeats * 1000:8.1f} CPU ms", flush=True)
    ratio = cpu["torch-cross-entropy"] / cpu["hugerec-blocked-full-softmax"]
    record(records, "full softmax loss cpu", "hugerec-blocked-full-softmax", ratio, "x torch-cross-entropy")
    print(f"  blocked / cross_entropy: {wall['torch-cross-entropy'] / wall['hugerec-blocked-full-softmax']:.2f}x wall, {ratio:.2f}x CPU time", flush=True)


# -- movielens hstu ranking: the ranking head trained by the one trainer, reranking the next-item top-100 ------
RANKING_EPOCHS = 10  # full run: 10 epochs per side, about 10 CPU minutes in all (the shipped 27 would be about 20)
RANKING_LAYERS = 2  # its figures were measured on the 2-block HSTU shipped before round 6 (8 blocks: twice the cost)
RANKING_WEIGHT = 0.1  # the ranking loss's weight beside the next-item loss (HSTUConfig.ranking_weight): of 0.1 and 1, the better head and next-item order
RERANK_DEPTH = 100  # each user's top-100 next items by the query dot product are reranked


def _ranking_split(quick: bool) -> Split:
    """The ML-1M validation split (each user's second-to-last item; the test split is built but never
    scored); --quick: its first 300 users."""
    valid, _ = movielens_splits()
    if not quick:
        return valid
    rows = np.arange(300)
    tr = valid.train.select(rows)
    return Split("valid", tr, valid.histories[rows], valid.times[rows], valid.targets[rows], (tr.offsets, tr.items), rows, valid.num_items)


def _fit_ranked(split: Split, s: DeepSettings, epochs: int, seed: int, weight: float) -> tuple[HSTU, float]:
    """HSTU of settings s trained by `fit` (full softmax, times as s says) with the ranking loss of `weight`;
    returns it and its training samples (windows) per CPU second of this process."""
    model = cast(HSTU, build_model("hugerec-hstu", split.num_items, s, seed))
    width = window_width(model)
    windows = sliding_windows(split.train, width)
    batches: EpochBatches[Any] = (
        window_batches(windows, s.batch, seed, times=sliding_windows(split.train, width, values=split.train.timestamps))
        if s.times else window_batches(windows, s.batch, seed)
    )
    tc = TrainConfig(epochs=epochs, lr=s.lr, seed=seed, progress=False, tensorboard=False, plot=False, schedule=lr_schedule(s))
    family = SequentialFamily(FullSoftmax(), mask_prob=0.2, times=s.times, ranking_weight=weight)
    t0 = time.process_time()
    history = fit(model, batches, None, tc, family=family)
    cpu = time.process_time() - t0
    samples = sum(len(b.windows) if isinstance(b, TimedWindows) else len(b) for e in range(epochs) for b in batches.make(e))
    print(f"  ranking_weight {weight}: {history.steps} steps, {cpu:.0f} CPU s, loss {history.train[0]['loss']:.3f} -> {history.train[-1]['loss']:.3f}", flush=True)
    return model.train(False), samples / cpu


def _reranked_metrics(model: HSTU, split: Split, times: bool, k: int) -> dict[str, dict[str, float]]:
    """Recall@k / NDCG@k over every query of the split: the query dot product's top RERANK_DEPTH (training
    items excluded, as the full-ranking protocol) in its own order and reranked by the ranking head
    (cached candidate scoring, candidates at the time of the history's latest event); a target outside
    the top RERANK_DEPTH is a miss for both."""
    max_len = model.cfg.max_len
    hist, hist_t = split.histories[:, -max_len:], split.times[:, -max_len:]
    score = model_scores(model, hist, hist_t if times else None)
    head_hist, head_t = torch.from_numpy(hist[:, 1:]), torch.from_numpy(hist_t[:, 1:])  # the candidate takes the last slot
    ranks: dict[str, list[np.ndarray]] = {"order": [], "head": []}
    offsets, items = split.exclude if split.exclude is not None else (np.zeros(len(hist) + 1, np.int64), np.zeros(0, np.int64))
    for q0 in range(0, len(hist), 256):
        q1 = min(q0 + 256, len(hist))
        s = score(q0, q1).clone()  # [q, I]
        for i in range(q0, q1):  # the query's training items are never ranked
            s[i - q0, torch.from_numpy(items[offsets[i] : offsets[i + 1]] - 1)] = float("-inf")
        top = torch.topk(s, RERANK_DEPTH, dim=1).indices + 1  # [q, 100] item ids, best first
        now = head_t[q0:q1, -1] if times else None
        with torch.no_grad():
            head = model.candidate_scores(head_hist[q0:q1], top, head_t[q0:q1] if times else None, now)  # [q, 100]
        target = torch.from_numpy(split.targets[q0:q1])[:, None]
        for name, order in (("order", top), ("head", torch.gather(top, 1, torch.argsort(head, dim=1, descending=True, stable=True)))):
            hit = order == target  # [q, 100]
            ranks[name].append(np.where(hit.any(1).numpy(), hit.float().argmax(1).numpy(), RERANK_DEPTH))
    out = {}
    for name, parts in ranks.items():
        r = np.concatenate(parts)
        inside = r < k
        out[name] = {f"recall@{k}": float(inside.mean()), f"ndcg@{k}": float(np.where(inside, 1 / np.log2(r + 2), 0).mean())}
    return out


def hstu_ranking(records: Records, quick: bool, seed: int, weight: float = RANKING_WEIGHT) -> None:
    """`movielens hstu ranking`: HSTU as shipped (MOVIELENS_SETTINGS, with RANKING_LAYERS blocks) trained without and with the ranking
    loss for the same epochs on the validation split's training data; each user's next-item top-100 in the
    dot product's order, reranked by the trained head, and reranked by the untrained head of the model
    trained without the ranking loss (what the Score stage ranked with before); the training cost ratio."""
    if not DATA.exists():
        raise SystemExit(f"benchmarks/sequential.py: data folder {DATA} not found; set HUGEREC_DATA")
    s = replace(MOVIELENS_SETTINGS["hugerec-hstu"], layers=RANKING_LAYERS)
    split = _ranking_split(quick)
    epochs = 1 if quick else RANKING_EPOCHS
    print(f"movielens hstu ranking ({len(split.targets)} validation users, {epochs} epochs per side, weight {weight}, "
          f"rerank depth {RERANK_DEPTH})", flush=True)
    plain, plain_rate = _fit_ranked(split, s, epochs, seed, 0.0)
    ranked, ranked_rate = _fit_ranked(split, s, epochs, seed, weight)
    before, after = _reranked_metrics(plain, split, s.times, 10), _reranked_metrics(ranked, split, s.times, 10)
    rows = {
        "hstu-next-item-order": before["order"],  # the dot product's order, trained without the ranking loss
        "untrained-head": before["head"],  # the same top-100 by that model's untrained head: the defect
        "hstu-next-item-order-joint": after["order"],  # the dot product's order of the model trained with both losses
        "hugerec-hstu-ranking-head": after["head"],
    }
    for method, got in rows.items():
        for metric, value in got.items():
            record(records, "movielens hstu ranking", method, value, f"{metric} (validation, top-{RERANK_DEPTH} reranked, {epochs} epochs, ranking_weight {weight})")
        print(f"  {method:28s} " + "  ".join(f"{m} {v:.4f}" for m, v in got.items()), flush=True)
    for metric in ("recall@10", "ndcg@10"):
        for base in ("hstu-next-item-order", "hstu-next-item-order-joint", "untrained-head"):
            ratio = rows["hugerec-hstu-ranking-head"][metric] / max(rows[base][metric], 1e-12)
            record(records, "movielens hstu ranking", "hugerec-hstu-ranking-head", ratio, f"{metric} x {base}")
            print(f"  ranking head / {base} {metric}: {ratio:.3f}x", flush=True)
    record(records, "movielens hstu ranking cpu", "hugerec-hstu-with-ranking-loss", ranked_rate, "samples per CPU second")
    record(records, "movielens hstu ranking cpu", "hugerec-hstu-without-ranking-loss", plain_rate, "samples per CPU second")
    record(records, "movielens hstu ranking cpu", "hugerec-hstu-with-ranking-loss", ranked_rate / plain_rate, "x without the ranking loss (samples per CPU second)")
    print(f"  training cost: {plain_rate:.0f} -> {ranked_rate:.0f} samples per CPU second with the ranking loss ({ranked_rate / plain_rate:.2f}x)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="first grid point of each baseline, 2 epochs of at most 24 (40) steps, short timings")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--only", default="movielens,yoochoose,train,hstu-train,hstu-scoring,hstu-serving,hstu-pipeline,softmax", help="comma-separated parts to run")
    parser.add_argument("--models", default="hugerec-sasrec,hugerec-hstu", help="comma-separated hugerec models to train (also hugerec-mlm, hugerec-gru4rec; none: the baselines only)")
    parser.add_argument("--epochs", help="N or MODEL=N,...: skip the model's validation run and train N epochs (default: chosen on the valid split)")
    parser.add_argument("--max-epochs", type=int, default=30, help="validation run: at most this many epochs")
    parser.add_argument("--patience", type=int, default=4, help="validation run: stop after this many epochs without a better valid score")
    parser.add_argument("--seeds", type=int, default=3, help="test runs of each hugerec model (seeds 0..N-1; mean and spread reported; 0: choose epochs on valid only)")
    parser.add_argument("--no-baselines", action="store_true", help="quality parts: train and score the models only (a tuning run)")
    parser.add_argument("--save-test-checkpoints", metavar="DIR", help="MovieLens: train the test runs for --max-epochs, saving each epoch's weights to DIR (no scoring)")
    parser.add_argument("--checkpoints", metavar="DIR", help="MovieLens: read the test runs' weights of the chosen epoch from DIR instead of training")
    parser.add_argument("--valid-seed", type=int, default=0, help="MovieLens: the seed of the validation run (several seeds per grid point: one process each)")
    parser.add_argument("--first-seed", type=int, default=0, help="test runs use seeds first-seed .. first-seed + seeds - 1 (to run seeds in parallel processes)")
    parser.add_argument("--hstu-temperature", type=float, help="MovieLens HSTU: 0 = dot-product scores, > 0 = cosine / temperature (HSTU's paper: 0.05)")
    parser.add_argument("--hstu-attention-dim", type=int, help="MovieLens HSTU: per-head width of queries and keys (0: dim / heads)")
    parser.add_argument("--dim", type=int, help="MovieLens: the models' embedding width")
    parser.add_argument("--seed", type=int, default=0, help="seed of the timing parts")
    parser.add_argument("--max-len", type=int, help="MovieLens: the models' max_len (histories read)")
    parser.add_argument("--windows", choices=("last", "sliding"), help="MovieLens training windows: each user's last max_len + 1 items, or windows over the whole history")
    parser.add_argument("--dropout", type=float, help="MovieLens: the models' dropout")
    parser.add_argument("--lr", type=float, help="MovieLens: learning rate (dense Adam and the item table's sparse Adam)")
    parser.add_argument("--batch", type=int, help="MovieLens: sequences per step")
    parser.add_argument("--layers", type=int, help="MovieLens: transformer / HSTU blocks (GRU layers)")
    parser.add_argument("--heads", type=int, help="MovieLens: attention heads")
    parser.add_argument(
        "--lr-decay-epochs", type=int, metavar="N",
        help="MovieLens: every lr (dense and sparse Adam) decays linearly to 0 over N >= 1 epochs of the run's data (default: constant)",
    )
    parser.add_argument(
        "--set", action="append", metavar="MODEL.FIELD=VALUE",
        help="MovieLens: one model's setting (repeatable), e.g. hugerec-hstu.layers=4; fields: " + ", ".join(FIELD_TYPES)
        + "; hugerec-hstu.times=true feeds the MovieLens timestamps to HSTU's time buckets (training windows, validation and test histories)",
    )
    parser.add_argument(
        "--average-epochs", type=int, metavar="K",
        help="MovieLens: every model's weights are the mean of its last K epoch ends (fit's average_epochs; default 1: the raw weights)",
    )
    parser.add_argument(
        "--average-epochs-grid", metavar="K,K,...",
        help="MovieLens validation runs: also record the valid curve of the mean of the last K epoch ends for each K "
        "(all from the same raw training run; records named '... epoch E average K'), e.g. 1,3,5,8",
    )
    parser.add_argument("--train-seconds", type=float, help="train part: seconds of training per side (default 45, 15 with --quick)")
    parser.add_argument("--ranking-weight", type=float, default=RANKING_WEIGHT, help="hstu-ranking: the ranking loss's weight (model.ranking_weight)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="pool the --json records of several quality runs (seeds run in parallel) and write them with --json")
    args = parser.parse_args()
    if args.merge:
        merged = merge(args.merge)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(merged, f, indent=1)
        return
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", min(2, os.cpu_count() or 1))))  # OMP_NUM_THREADS=1 on a shared machine
    records: Records = []
    unknown = set(model_list(args)) - {*MODELS, "hugerec-hstu"}
    if unknown:
        raise SystemExit(f"benchmarks/sequential.py: --models names unknown models {sorted(unknown)}; known: {[*MODELS, 'hugerec-hstu']}")
    parts = set(args.only.split(","))
    if args.lr_decay_epochs is not None and args.lr_decay_epochs < 1:
        raise SystemExit(f"benchmarks/sequential.py: --lr-decay-epochs must be an integer >= 1, got {args.lr_decay_epochs}")
    settings = movielens_settings(args, model_list(args))  # a bad setting exits here, before any work
    average_grid(args.average_epochs_grid)  # and a bad grid
    if "movielens" in parts:
        check_decay_horizons(args, settings)
    if parts & {"movielens", "yoochoose", "hstu-train", "hstu-scoring", "hstu-serving", "hstu-pipeline"} and not DATA.exists():
        raise SystemExit(f"benchmarks/sequential.py: data folder {DATA} not found; set HUGEREC_DATA")
    if "yoochoose" in parts:
        yoochoose(records, args)
    if "movielens" in parts:
        movielens(records, args, settings)
    if "hstu-train" in parts:
        hstu_train(records, args.quick, args.seed)
    if "hstu-scoring" in parts:
        hstu_scoring(records, args.quick, args.seed)
    if "hstu-serving" in parts:
        hstu_serving(records, args.quick, args.seed)
    if "hstu-pipeline" in parts:
        hstu_pipeline(records, args.quick, args.seed)
    if "hstu-staged" in parts:
        hstu_staged(records, args.quick, args.seed)
    if "hstu-history" in parts:
        hstu_history(records, args.quick, args.seed)
    if "train" in parts:
        throughput(records, args.quick, args.seed, args.train_seconds)
    if "softmax" in parts:
        softmax_loss(records, args.quick, args.seed)
    if "hstu-ranking" in parts:  # not in the default parts: about 10 CPU minutes (--only hstu-ranking)
        hstu_ranking(records, args.quick, args.seed, args.ranking_weight)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
