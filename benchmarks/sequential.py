"""Sequential recommendation: next-item quality on MovieLens-1M and YOOCHOOSE, and SASRec training throughput.

All baselines run in the same process on the same splits; every score is a full ranking of the catalogue
(hugerec.training.next_item). Protocols:

  quality movielens  the shared MovieLens-1M sample (users 1-2999, all ratings as implicit events, in
                     time order). Leave-last-out: each user's last item is the target, the rest is the
                     history (models see its last max_len items); the user's history items are excluded
                     from the ranking. Metrics Recall@10 (= HR@10), NDCG@10.
  quality yoochoose  the shared YOOCHOOSE 100k sample as prepared for GRU4Rec (train_full / test files;
                     repeats kept). Test items unseen in training are removed, then sessions shorter than
                     2 dropped; every prefix s_1..s_k predicts s_{k+1}. Nothing is excluded. Recall@20, MRR@20.
  train <shape>      SASRec training samples/s (sequences of length 50, dim 64, 2 blocks) on a synthetic
                     1M-item catalogue: hugerec (sampled softmax with logQ, in-batch + popularity negatives,
                     lazy sparse Adam on the touched item rows) against plain PyTorch (nn.Embedding +
                     nn.TransformerEncoder + full softmax over 1M items, dense Adam; its batch is what fits
                     in memory). Both then train for the same wall-clock time and are scored by Recall@10
                     (full ranking) on held-out sequences of the same synthetic source.

Baselines: popular (training counts), item-knn (cosine item-item similarity over user histories, summed
over the last 5 history items), item-transitions (counts of i followed by j in training sequences, scored
from the last item; popularity breaks ties), vsknn (V-SKNN, Ludewig & Jannach 2018: the prefix weighted by
linear position decay, dot product with every training session's item set, the k = 100 most similar
sessions vote for their items with their similarity).

Choices (epochs, windows, max_len, lr, dropout) are made on a validation split, never on test:
`--split valid` scores each user's second-to-last MovieLens item with the last one removed from the data,
and `--eval-every N` prints the validation curve during training.

    python benchmarks/sequential.py --quick              # a few minutes on 2 shared cores
    python benchmarks/sequential.py --json seq.json      # the table in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
)
from hugerec.embedding.optimizers import Adam
from hugerec.models.gru4rec import GRU4Rec
from hugerec.models.masked import MaskedTransformer
from hugerec.models.sasrec import SASRec
from hugerec.models.sequence import SequenceConfig
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.losses import Negatives, SampledSoftmax
from hugerec.training.next_item import CSR, rank_metrics, target_ranks
from hugerec.training.sequential import (
    FullSoftmax,
    SequentialFamily,
    all_item_vectors,
    query_vectors,
    window_batches,
    window_width,
)
from hugerec.training.trainer import TrainConfig, fit

DATA = Path(os.environ.get("HUGEREC_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
Records = list[dict[str, Any]]
MODELS: dict[str, type[SASRec] | type[MaskedTransformer] | type[GRU4Rec]] = {
    "hugerec-sasrec": SASRec,
    "hugerec-mlm": MaskedTransformer,
    "hugerec-gru4rec": GRU4Rec,
}


def record(records: Records, config: str, method: str, value: float, unit: str, higher: bool = True) -> None:
    records.append({"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": higher})


# -- baselines: each returns score_block(q0, q1) -> [q, I] over items 1..I --------------------------------
def popular(counts: np.ndarray, num_queries: int) -> Callable[[int, int], torch.Tensor]:
    row = torch.from_numpy(counts[1:].astype(np.float32))
    return lambda q0, q1: row.expand(q1 - q0, -1)


def transitions(train: Sequences, num_items: int, counts: np.ndarray, last: np.ndarray) -> Callable[[int, int], torch.Tensor]:
    same = np.diff(train.sequence_ids()) == 0
    prev, nxt = train.items[:-1][same], train.items[1:][same]
    t = sp.csr_matrix((np.ones(len(prev), np.float32), (prev, nxt)), shape=(num_items + 1, num_items + 1))
    tie = torch.from_numpy((counts[1:] / (counts.max() + 1) * 1e-3).astype(np.float32))

    def score(q0: int, q1: int) -> torch.Tensor:
        return torch.from_numpy(t[last[q0:q1]].toarray()[:, 1:]) + tie

    return score


def item_knn(train: Sequences, num_items: int, histories: np.ndarray, n_last: int = 5) -> Callable[[int, int], torch.Tensor]:
    x = sp.csr_matrix((np.ones(len(train.items), np.float32), (train.sequence_ids(), train.items)), shape=(len(train), num_items + 1))
    x.data[:] = 1.0  # binary
    co = (x.T @ x).toarray()  # [I + 1, I + 1]
    norm = np.sqrt(np.diag(co)) + 1e-9
    sim = torch.from_numpy((co / norm[:, None] / norm[None, :]).astype(np.float32))
    sim.fill_diagonal_(0.0)
    sim[0] = 0.0  # padding contributes nothing
    recent = torch.from_numpy(histories[:, -n_last:])

    def score(q0: int, q1: int) -> torch.Tensor:
        return sim[recent[q0:q1]].sum(dim=1)[:, 1:]  # [q, n_last, I + 1] -> [q, I]

    return score


def vsknn(train: Sequences, num_items: int, histories: np.ndarray, k: int = 100) -> Callable[[int, int], torch.Tensor]:
    s = sp.csr_matrix((np.ones(len(train.items), np.float32), (train.sequence_ids(), train.items)), shape=(len(train), num_items + 1))
    s.data[:] = 1.0
    st = s.T.tocsr()
    hist = histories
    length = (hist != 0).sum(axis=1, keepdims=True)
    pos = np.cumsum(hist != 0, axis=1)  # 1..n over the items
    w = np.where(hist != 0, pos / np.maximum(length, 1), 0.0).astype(np.float32)  # linear decay: the last item weighs 1

    def score(q0: int, q1: int) -> torch.Tensor:
        rows = np.repeat(np.arange(q1 - q0), hist.shape[1])
        q = sp.csr_matrix((w[q0:q1].ravel(), (rows, hist[q0:q1].ravel())), shape=(q1 - q0, num_items + 1))
        q.sum_duplicates()
        sims = torch.from_numpy((q @ st).toarray())  # [q, sessions]
        top = torch.topk(sims, min(k, sims.shape[1]), dim=1)
        keep = torch.zeros_like(sims).scatter_(1, top.indices, top.values)
        return torch.from_numpy((sp.csr_matrix(keep.numpy()) @ s).toarray()[:, 1:])  # [q, sessions] @ [sessions, I + 1]

    return score


def model_scores(model: Any, histories: np.ndarray) -> Callable[[int, int], torch.Tensor]:
    items = all_item_vectors(model)
    queries = query_vectors(model, torch.from_numpy(histories))
    return lambda q0, q1: queries[q0:q1] @ items.T


# -- quality ----------------------------------------------------------------------------------------------
def train_model(
    name: str, num_items: int, train: Sequences, max_len: int, epochs: int, seed: int, lr: float, batch: int, max_steps: int | None = None,
    windows: str = "last", dropout: float = 0.2, layers: int = 2, heads: int = 1, progress: Callable[[Any, int], None] | None = None,
) -> Any:
    torch.manual_seed(seed)
    cfg = SequenceConfig(num_items=num_items, max_len=max_len, dim=64, num_layers=layers, num_heads=heads, dropout=dropout)
    model = MODELS[name](cfg, optimizer=Adam(lr=lr))
    tc = TrainConfig(epochs=epochs, lr=lr, max_steps=max_steps, seed=seed, progress=False, tensorboard=False, plot=False)
    width = window_width(model)
    # "last": each sequence's last max_len (+ 1) items; "sliding": windows over the whole of each sequence
    data = last_n(train, width) if windows == "last" else sliding_windows(train, width)
    batches = window_batches(data, batch, seed)
    if progress is not None:  # the callback after each epoch, as the next one starts (then back to training)
        inner = batches

        def epoch(e: int) -> Any:
            if e:
                progress(model, e - 1)
                model.train()
            return inner.make(e)

        batches = EpochBatches(epoch, len(inner))
    history = fit(model, batches, None, tc, family=SequentialFamily(FullSoftmax(), mask_prob=0.2))
    if progress is not None and max_steps is None:
        progress(model, epochs - 1)
    print(f"  {name}: {history.steps} steps, loss {history.train[0]['loss']:.3f} -> {history.train[-1]['loss']:.3f}", flush=True)
    return model


def evaluate(
    records: Records, dataset: str, scores: dict[str, Callable[[int, int], torch.Tensor]], targets: np.ndarray,
    num_items: int, exclude: CSR | None, metrics: tuple[str, ...], k: int,
) -> dict[str, dict[str, float]]:
    out = {}
    for method, score in scores.items():
        m = rank_metrics(target_ranks(score, targets, num_items, exclude, block=512), ks=(k,))
        out[method] = m
        for metric in metrics:
            record(records, f"quality {dataset} {metric}", method, m[metric], "fraction")
        print(f"  {method:18s} " + "  ".join(f"{metric} {m[metric]:.4f}" for metric in metrics), flush=True)
    return out


def movielens(
    records: Records, quick: bool, seed: int, epochs_override: int | None = None, max_len: int = 50, windows: str = "sliding",
    dropout: float = 0.2, split: str = "test", lr: float = 6e-3, batch: int = 128, layers: int = 2, heads: int = 1, eval_every: int = 0,
) -> None:
    print(f"quality movielens (leave-last-out, history excluded, full ranking; scored on {split})", flush=True)
    events = read_movielens(DATA / "movielens" / "ml-1m" / "ratings.dat.gz")
    users = group_sequences(events, key="user", drop_repeats=False)
    vocab = ItemVocabulary.fit(users.items)
    seqs, _ = vocab.encode(users)
    train, targets = leave_last_out(seqs)
    if split == "valid":  # tuning: the second-to-last item is the target, the last one is never seen
        train, targets = leave_last_out(train)
    num_items = vocab.num_items
    histories = last_n(train, max_len)
    counts = np.bincount(train.items, minlength=num_items + 1)
    scores = {
        "popular": popular(counts, len(targets)),
        "item-knn": item_knn(train, num_items, histories),
        "item-transitions": transitions(train, num_items, counts, histories[:, -1]),
    }
    epochs = epochs_override or (1 if quick else 14)  # 14: chosen on --split valid (benchmarks/README.md)
    exclude = (train.offsets, train.items)

    def progress(model: Any, epoch: int) -> None:  # --eval-every: the curve the epochs are chosen from (on valid)
        if (epoch + 1) % eval_every == 0:
            m = rank_metrics(target_ranks(model_scores(model, histories), targets, num_items, exclude, block=512), ks=(10,))
            print(f"    epoch {epoch + 1}: {split} recall@10 {m['recall@10']:.4f} ndcg@10 {m['ndcg@10']:.4f}", flush=True)

    for name in MODELS:
        model = train_model(
            name, num_items, train, max_len, epochs, seed, lr=lr, batch=batch, max_steps=24 if quick else None, windows=windows, dropout=dropout,
            layers=layers, heads=heads, progress=progress if eval_every else None,
        )
        scores[name] = model_scores(model, histories)
    dataset = "movielens" if split == "test" else "movielens-valid"
    res = evaluate(records, dataset, scores, targets, num_items, exclude, ("recall@10", "ndcg@10"), 10)
    for metric in ("recall@10", "ndcg@10") if "hugerec-sasrec" in res else ():
        best = max(res[b][metric] for b in ("popular", "item-knn", "item-transitions"))
        ratio = res["hugerec-sasrec"][metric] / best
        record(records, f"quality {dataset} {metric} ratio", "hugerec-sasrec", ratio, "x best baseline")
        print(f"  SASRec / best baseline {metric}: {ratio:.2f}x (target >= 1.25x)", flush=True)


def yoochoose(records: Records, quick: bool, seed: int, epochs_override: int | None = None) -> None:
    print("quality yoochoose (every prefix, unseen test items removed, full ranking)", flush=True)
    root = DATA / "yoochoose"
    train_raw = group_sequences(read_yoochoose(root / "yoochoose-clicks-100k_train_full.txt.gz"), drop_repeats=False, min_length=2)
    test_raw = group_sequences(read_yoochoose(root / "yoochoose-clicks-100k_test.txt.gz"), drop_repeats=False, min_length=2)
    vocab = ItemVocabulary.fit(train_raw.items)
    train, _ = vocab.encode(train_raw, min_length=2)
    test, report = vocab.encode(test_raw, min_length=2)
    seq, end, targets = prefixes(test)
    max_len = 20
    histories = last_n(test, max_len, rows=seq, ends=end)
    num_items = vocab.num_items
    print(f"  {len(train)} train sessions, {len(test)} test sessions, {len(targets)} prefixes; "
          f"{report.unknown_items} unseen test clicks removed, {report.dropped_sequences} sessions left too short", flush=True)
    counts = np.bincount(train.items, minlength=num_items + 1)
    scores = {
        "popular": popular(counts, len(targets)),
        "item-transitions": transitions(train, num_items, counts, histories[:, -1]),
        "vsknn": vsknn(train, num_items, histories),
    }
    epochs = epochs_override or (1 if quick else 6)
    for name in MODELS:
        model = train_model(name, num_items, train, max_len, epochs, seed, lr=3e-3, batch=256, max_steps=40 if quick else None)
        scores[name] = model_scores(model, histories)
    res = evaluate(records, "yoochoose", scores, targets, num_items, None, ("recall@20", "mrr@20"), 20)
    best = max(MODELS, key=lambda m: res[m]["recall@20"])  # the best hugerec model of this run
    for metric in ("recall@20", "mrr@20"):
        ratio = res[best][metric] / res["vsknn"][metric]
        record(records, f"quality yoochoose {metric} ratio", best, ratio, "x vsknn")
        print(f"  {best} / vsknn {metric}: {ratio:.2f}x (target > 1)", flush=True)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer epochs and a shorter throughput run")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--only", default="movielens,yoochoose,train", help="comma-separated parts to run")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated hugerec models to train")
    parser.add_argument("--epochs", type=int, help="epochs per hugerec model (default: 1 with --quick, at most 24 MovieLens steps; 14 MovieLens, 6 YOOCHOOSE)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=50, help="MovieLens: the models' max_len (histories read)")
    parser.add_argument("--windows", choices=("last", "sliding"), default="sliding", help="MovieLens training windows: each user's last max_len + 1 items, or windows over the whole history")
    parser.add_argument("--dropout", type=float, default=0.2, help="MovieLens: the models' dropout")
    parser.add_argument("--split", choices=("test", "valid"), default="test", help="MovieLens: score the last item (test) or, for tuning, the second-to-last with the last one removed (valid)")
    parser.add_argument("--lr", type=float, default=6e-3, help="MovieLens: learning rate (dense Adam and the item table's sparse Adam)")
    parser.add_argument("--batch", type=int, default=128, help="MovieLens: sequences per step")
    parser.add_argument("--layers", type=int, default=2, help="MovieLens: transformer blocks (GRU layers)")
    parser.add_argument("--heads", type=int, default=1, help="MovieLens: attention heads")
    parser.add_argument("--train-seconds", type=float, help="train part: seconds of training per side (default 45, 15 with --quick)")
    parser.add_argument("--eval-every", type=int, default=0, help="MovieLens: print the metrics of the split every N epochs (choose epochs on --split valid only)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", min(2, os.cpu_count() or 1))))  # OMP_NUM_THREADS=1 on a shared machine
    records: Records = []
    for name in list(MODELS):
        if name not in args.models.split(","):
            del MODELS[name]
    parts = set(args.only.split(","))
    if ("movielens" in parts or "yoochoose" in parts) and not DATA.exists():
        raise SystemExit(f"benchmarks/sequential.py: data folder {DATA} not found; set HUGEREC_DATA")
    if "yoochoose" in parts:
        yoochoose(records, args.quick, args.seed, args.epochs)
    if "movielens" in parts:
        movielens(
            records, args.quick, args.seed, args.epochs, args.max_len, args.windows, args.dropout, args.split, args.lr, args.batch, args.layers, args.heads,
            args.eval_every,
        )
    if "train" in parts:
        throughput(records, args.quick, args.seed, args.train_seconds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
