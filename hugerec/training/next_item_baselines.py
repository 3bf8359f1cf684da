"""Strong non-neural next-item baselines, scored on the same histories, split and metrics as the deep models.

    train = TrainingSequences(offsets, items, num_items, last_times)   # CSR of the training sequences
    model = fit_baseline(SLIST(alpha=0.5, lam=100.0, n_last=10, decay=0.8), train)
    ranks = target_ranks(score_block(model, histories), targets, num_items, exclude)

`histories` are [Q, L] dense item ids (1..I), left-padded with 0, the most recent item in column L - 1
(`hugerec.data.sessions.last_n`), the same arrays the deep models read. A scorer returns [Q, I]
float32 scores of items 1..I (column j is item j + 1). The variants (a closed union, one `match`):

  MostPopular  training counts, the same row for every query.
  ItemKNN  cosine similarity of item columns of the binary sequence x item matrix (self-similarity 0),
           summed over the last n_last history items, the item a steps back weighted decay**a.
  EASE     Steck 2019: B = argmin ||X - XB||^2 + lam ||B||^2 with diag(B) = 0 on the binary sequence x
           item matrix X; closed form B = I - P diag(1 / diag(P)), P = (X'X + lam I)^-1. The query is
           the order-aware history vector (decay**a over the last n_last items) times B.
  SLIST    Choi et al. 2021: one ridge regression mixing SLIS (X -> X, the whole sequences, rows
           L2-normalised) and SLIT (S -> T: every position's last n_last items, the one a steps back
           weighted decay**a, rows L2-normalised, to the one-hot next item):
               B = argmin alpha ||X - XB||^2 + (1 - alpha) ||T - SB||^2 + lam ||B||^2
                 = (alpha X'X + (1 - alpha) S'S + lam I)^-1 (alpha X'X + (1 - alpha) S'T)
           queried like EASE (no zero-diagonal constraint: a repeat is a valid next item).
  SKNN     session-kNN (Jannach & Ludewig 2017): the query's distinct last n_last items; of the training
           sequences holding any of them, the `sample` most recent (by last_times) are candidates;
           similarity |q & s| / sqrt(|q| |s|) (cosine of binary vectors); the k most similar vote for
           each of their items with their similarity.
  VSKNN    V-SKNN (Ludewig & Jannach 2018): as SKNN, but the query item at position p of the n items
           read (1 = oldest) weighs p / n (the last item 1; a repeated item keeps its latest weight):
           similarity sum_{i in q & s} w_i / sqrt(|q| |s|).
The kNN kernels (Numba, parallel over queries) and every matrix product (scipy sparse x dense) run
outside the interpreter; a query's own training sequence can be left out of its neighbours (`own`:
leave-last-out queries are training users themselves).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import torch

from hugerec.ops.cpu.session_knn_kernels import session_knn_scores

PAD = 0  # the padding id of histories (hugerec.models.sequence.PAD)
ScoreBlock = Callable[[int, int], torch.Tensor]


@dataclass(frozen=True)
class TrainingSequences:
    """S training sequences as a CSR: sequence s is items[offsets[s]:offsets[s + 1]] in time order.

    items       [N] dense ids 1..num_items
    last_times  [S] the time of each sequence's last item (the kNN baselines sample the most recent)
    """

    offsets: np.ndarray
    items: np.ndarray
    num_items: int
    last_times: np.ndarray

    def __post_init__(self) -> None:
        off = self.offsets
        if off.ndim != 1 or len(off) < 1 or off[0] != 0 or np.any(np.diff(off) < 0) or int(off[-1]) != len(self.items):
            raise ValueError(f"TrainingSequences: offsets must run from 0 to {len(self.items)} without decreasing, got shape {off.shape}")
        if len(self.last_times) != len(off) - 1:
            raise ValueError(f"TrainingSequences: last_times has {len(self.last_times)} entries for {len(off) - 1} sequences")
        if not isinstance(self.num_items, int) or self.num_items < 1:
            raise ValueError(f"TrainingSequences: num_items must be an int >= 1, got {self.num_items!r}")
        if len(self.items) and (int(self.items.min()) < 1 or int(self.items.max()) > self.num_items):
            raise ValueError(f"TrainingSequences: item ids must be in 1..{self.num_items}, got {int(self.items.min())}..{int(self.items.max())}")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sequence_ids(self) -> np.ndarray:
        """[N] the sequence index of every item."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.offsets))


def _check_history_params(name: str, n_last: int, decay: float) -> None:
    if not isinstance(n_last, int) or n_last < 1:
        raise ValueError(f"{name}: n_last must be an int >= 1, got {n_last!r}")
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"{name}: decay must be in (0, 1], got {decay!r}")


def _check_session_knn_params(config: SKNN | VSKNN) -> None:
    """k, sample and n_last of a session-kNN config are ints >= 1 (ValueError naming the field)."""
    for field_name in ("k", "sample", "n_last"):
        v = getattr(config, field_name)
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{type(config).__name__}: {field_name} must be an int >= 1, got {v!r}")


@dataclass(frozen=True)
class MostPopular:
    """Training counts."""


@dataclass(frozen=True)
class ItemKNN:
    n_last: int = 5
    decay: float = 1.0

    def __post_init__(self) -> None:
        _check_history_params("ItemKNN", self.n_last, self.decay)


@dataclass(frozen=True)
class EASE:
    lam: float = 500.0
    n_last: int = 50
    decay: float = 0.9

    def __post_init__(self) -> None:
        _check_history_params("EASE", self.n_last, self.decay)
        if not self.lam > 0:
            raise ValueError(f"EASE: lam must be > 0, got {self.lam!r}")


@dataclass(frozen=True)
class SLIST:
    alpha: float = 0.5
    lam: float = 100.0
    n_last: int = 10
    decay: float = 0.8

    def __post_init__(self) -> None:
        _check_history_params("SLIST", self.n_last, self.decay)
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"SLIST: alpha must be in [0, 1], got {self.alpha!r}")
        if not self.lam > 0:
            raise ValueError(f"SLIST: lam must be > 0, got {self.lam!r}")


@dataclass(frozen=True)
class SKNN:
    k: int = 100
    sample: int = 500
    n_last: int = 50

    def __post_init__(self) -> None:
        _check_session_knn_params(self)


@dataclass(frozen=True)
class VSKNN:
    k: int = 100
    sample: int = 500
    n_last: int = 50

    def __post_init__(self) -> None:
        _check_session_knn_params(self)


Baseline = MostPopular | ItemKNN | EASE | SLIST | SKNN | VSKNN


# -- shared pieces ------------------------------------------------------------------------------------------
def _check_histories(histories: np.ndarray, num_items: int) -> np.ndarray:
    h = np.asarray(histories)
    if h.ndim != 2:
        raise ValueError(f"histories must be [Q, L] left-padded item ids, got shape {h.shape}")
    h = h.astype(np.int64, copy=False)
    if h.size and (int(h.min()) < 0 or int(h.max()) > num_items):
        raise ValueError(f"histories: item ids must be in 0..{num_items} (0 = padding), got {int(h.min())}..{int(h.max())}")
    return h


def history_weights(histories: np.ndarray, num_items: int, n_last: int, decay: float) -> sp.csr_matrix:
    """[Q, I] sparse: row q holds decay**a at the column of the item a steps before the end of history q
    (a < n_last; columns are item - 1; a repeated item sums its weights)."""
    tail = histories[:, -n_last:]  # [Q, n]
    age = np.arange(tail.shape[1] - 1, -1, -1)  # the last column is the most recent item: age 0
    weights = np.broadcast_to(decay**age, tail.shape)
    keep = tail != PAD
    rows = np.broadcast_to(np.arange(len(tail))[:, None], tail.shape)
    return sp.csr_matrix((weights[keep].astype(np.float64), (rows[keep], tail[keep] - 1)), shape=(len(tail), num_items))


def binary_matrix(train: TrainingSequences) -> sp.csr_matrix:
    """[S, I] 1 where sequence s holds item i (repeats counted once)."""
    x = sp.csr_matrix((np.ones(len(train.items)), (train.sequence_ids(), train.items - 1)), shape=(len(train), train.num_items))
    x.sum_duplicates()
    x.data[:] = 1.0
    return x


def _row_normalise(m: sp.csr_matrix) -> sp.csr_matrix:
    norm = np.sqrt(np.asarray(m.multiply(m).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(norm, 1e-12)) @ m)


def transition_matrices(train: TrainingSequences, n_last: int, decay: float) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """SLIT's (S [P, I], T [P, I]): one row per position p with a predecessor in its sequence; S holds the
    n_last items before p, the one a steps back (a = 0: the previous item) weighted decay**a, rows
    L2-normalised; T is the one-hot item at p."""
    seq = train.sequence_ids()
    pos = np.arange(len(train.items))
    starts = train.offsets[:-1][seq]
    targets = np.flatnonzero(pos > starts)  # [P] positions with a previous item
    row_of = np.full(len(train.items), -1, dtype=np.int64)
    row_of[targets] = np.arange(len(targets))
    rows, cols, vals = [], [], []
    for a in range(n_last):  # one vectorised pass per lag, not per event
        src = targets - 1 - a
        ok = src >= starts[targets]
        rows.append(row_of[targets[ok]])
        cols.append(train.items[src[ok]] - 1)
        vals.append(np.full(int(ok.sum()), decay**a))
    s = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(targets), train.num_items))
    t = sp.csr_matrix((np.ones(len(targets)), (np.arange(len(targets)), train.items[targets] - 1)), shape=(len(targets), train.num_items))
    return _row_normalise(s), t


# -- fitted scorers -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PopularScorer:
    counts: np.ndarray  # [I] float32

    def scores(self, histories: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        h = _check_histories(histories, len(self.counts))
        return np.broadcast_to(self.counts, (len(h), len(self.counts))).copy()


@dataclass(frozen=True)
class LinearScorer:
    """scores = history_weights(histories) @ weights: ItemKNN, EASE and SLIST."""

    weights: np.ndarray  # [I, I] float32: row i is what item i + 1 in the history adds to every item's score
    n_last: int
    decay: float

    def scores(self, histories: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        num_items = len(self.weights)
        q = history_weights(_check_histories(histories, num_items), num_items, self.n_last, self.decay).astype(np.float32)
        return np.asarray(q @ self.weights, dtype=np.float32)


@dataclass(frozen=True)
class KNNScorer:
    """SKNN / VSKNN over the training sequences' distinct items (CSR by sequence and by item)."""

    seq_offsets: np.ndarray  # [S + 1]
    seq_items: np.ndarray  # [U] distinct items of each sequence (dense ids)
    item_offsets: np.ndarray  # [I + 2]
    item_seqs: np.ndarray  # [U] sequences holding each item, most recent first
    rank: np.ndarray  # [S] 0 = the most recent sequence
    num_items: int
    k: int
    sample: int
    n_last: int
    position_decay: bool

    def scores(self, histories: np.ndarray, own: np.ndarray | None = None) -> np.ndarray:
        h = _check_histories(histories, self.num_items)
        own_arr = np.full(len(h), -1, dtype=np.int64) if own is None else np.asarray(own, dtype=np.int64)
        if own_arr.shape != (len(h),):
            raise ValueError(f"KNNScorer: own must be [{len(h)}] sequence indices (-1: none), got shape {own_arr.shape}")
        out = np.zeros((len(h), self.num_items), dtype=np.float32)
        session_knn_scores(
            np.ascontiguousarray(h[:, -self.n_last :]), own_arr, self.seq_offsets, self.seq_items, self.item_offsets, self.item_seqs,
            self.rank, self.k, self.sample, self.position_decay, out,
        )
        return out


Scorer = PopularScorer | LinearScorer | KNNScorer


def fit_baseline(spec: Baseline, train: TrainingSequences) -> Scorer:
    """Fit one baseline on the training sequences."""
    num_items = train.num_items
    match spec:
        case MostPopular():
            return PopularScorer(np.bincount(train.items - 1, minlength=num_items).astype(np.float32))
        case ItemKNN(n_last=n_last, decay=decay):
            x = binary_matrix(train)
            co = (x.T @ x).toarray()  # [I, I] co-occurrence counts
            norm = np.sqrt(np.diag(co))
            sim = co / np.maximum(norm[:, None] * norm[None, :], 1e-12)
            np.fill_diagonal(sim, 0.0)
            return LinearScorer(sim.astype(np.float32), n_last, decay)
        case EASE(lam=lam, n_last=n_last, decay=decay):
            x = binary_matrix(train)
            gram = (x.T @ x).toarray() + lam * np.eye(num_items)
            p = scipy.linalg.inv(gram)
            b = -p / np.diag(p)[None, :]  # B = I - P diag(1 / diag(P)), then diag(B) = 0
            np.fill_diagonal(b, 0.0)
            return LinearScorer(b.astype(np.float32), n_last, decay)
        case SLIST(alpha=alpha, lam=lam, n_last=n_last, decay=decay):
            return LinearScorer(slist_weights(train, alpha, lam, n_last, decay), n_last, decay)
        case SKNN(k=k, sample=sample, n_last=n_last):
            return _knn(train, k, sample, n_last, position_decay=False)
        case VSKNN(k=k, sample=sample, n_last=n_last):
            return _knn(train, k, sample, n_last, position_decay=True)


@dataclass(frozen=True)
class SlistGrams:
    """The Gram matrices SLIST's solve needs for one (n_last, decay); alpha and lam vary over them for free."""

    xx: np.ndarray  # [I, I] X'X of the L2-normalised sequence rows
    ss: np.ndarray  # [I, I] S'S
    st: np.ndarray  # [I, I] S'T


def sequence_gram(train: TrainingSequences) -> np.ndarray:
    """[I, I] X'X of the binary sequence x item matrix with L2-normalised rows (SLIS's part: no setting
    of SLIST changes it, so a grid computes it once)."""
    x = _row_normalise(binary_matrix(train))
    return np.asarray((x.T @ x).toarray())


def slist_grams(train: TrainingSequences, n_last: int, decay: float, xx: np.ndarray | None = None) -> SlistGrams:
    """The Gram matrices for one (n_last, decay); xx: `sequence_gram(train)` when already computed."""
    s, t = transition_matrices(train, n_last, decay)
    return SlistGrams(sequence_gram(train) if xx is None else xx, (s.T @ s).toarray(), (s.T @ t).toarray())


def slist_solve(grams: SlistGrams, alpha: float, lam: float) -> np.ndarray:
    """[I, I] float32 B = (alpha X'X + (1 - alpha) S'S + lam I)^-1 (alpha X'X + (1 - alpha) S'T)."""
    lhs = alpha * grams.xx + (1.0 - alpha) * grams.ss
    lhs[np.diag_indices_from(lhs)] += lam
    rhs = alpha * grams.xx + (1.0 - alpha) * grams.st
    return np.asarray(scipy.linalg.solve(lhs, rhs, assume_a="pos"), dtype=np.float32)


def slist_weights(train: TrainingSequences, alpha: float, lam: float, n_last: int, decay: float) -> np.ndarray:
    return slist_solve(slist_grams(train, n_last, decay), alpha, lam)


def _knn(train: TrainingSequences, k: int, sample: int, n_last: int, position_decay: bool) -> KNNScorer:
    x = binary_matrix(train)  # [S, I] CSR, column indices sorted per row after sum_duplicates
    x.sort_indices()
    order = np.lexsort((np.arange(len(train)), -train.last_times.astype(np.float64)))  # most recent first, ties by index
    rank = np.empty(len(train), dtype=np.int64)
    rank[order] = np.arange(len(train))
    # item -> sequences, most recent first: sort the (item, rank) pairs
    seq_of = np.repeat(np.arange(len(train), dtype=np.int64), np.diff(x.indptr))
    items = x.indices.astype(np.int64) + 1
    by = np.lexsort((rank[seq_of], items))
    item_offsets = np.zeros(train.num_items + 2, dtype=np.int64)
    np.cumsum(np.bincount(items, minlength=train.num_items + 1), out=item_offsets[1:])
    return KNNScorer(
        x.indptr.astype(np.int64), items, item_offsets, seq_of[by], rank, train.num_items, k, sample, n_last, position_decay
    )


def score_block(scorer: Scorer, histories: np.ndarray, own: np.ndarray | None = None) -> ScoreBlock:
    """The (q0, q1) -> [q, I] score function `hugerec.training.next_item.target_ranks` reads."""

    def block(q0: int, q1: int) -> torch.Tensor:
        return torch.from_numpy(scorer.scores(histories[q0:q1], None if own is None else own[q0:q1]))

    return block
