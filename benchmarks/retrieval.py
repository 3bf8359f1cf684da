"""Retrieval: quality (MovieLens-1M, synthetic), two-tower training throughput, ANN index vs exact.

    python benchmarks/retrieval.py [--quick] [--json PATH] [--only quality|train|ann] [--seeds N] [--split test|valid]

Quality: leave-last-out per user by timestamp, full ranking over the catalogue, the user's training
items excluded, exact blocked top-K (`hugerec.training.ranking_metrics`). Methods: hugerec-two-tower,
hugerec-mf and the same-run baselines `popular` (training counts), `item-knn` (cosine co-occurrence,
scored from the user's last few items) and `ease` (closed form, Steck 2019); on synthetic data also
`oracle` (ranking by the generator's true logits). Targets: two-tower >= 0.95x the best of ease and
item-knn on recall@10 and ndcg@10 (MovieLens-1M); >= 0.90x the oracle's recall@50 (synthetic).
`--split valid` scores each user's second-to-last event instead, the last one removed from the data
(baselines and oracle recomputed on that split): the split the defaults below were chosen on.

Train: samples/s of the two-tower (1M users x 1M items, dim 64, history 50) trained by `fit` (the one
trainer, its pipeline on) against the same model in plain PyTorch (nn.EmbeddingBag(sparse=True) +
SparseAdam for the tables, Adam for the MLP, the same mixed sampled-softmax loss), target >= 2x, and
against the loop `fit_retrieval` ran before the trainers were merged (`main-fit-retrieval`: a copy of
its step, negatives drawn and the loss computed in the main thread), target >= 0.95x. The three run in
rounds of 10 steps, one after the other, so load changes on the shared VM hit them alike.

ANN: 1M items x dim 64 (clustered Gaussian vectors like trained embeddings): HNSW recall@100 of the
exact top-100 and queries/s at batch 1 of both. Targets: recall >= 0.95, qps >= 10x exact.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

import hugerec as hr
from hugerec.data.interactions import (
    Interactions,
    categorify,
    held_out_csr,
    histories,
    iter_examples,
    last_items,
    leave_last_out,
    read_interactions,
)
from hugerec.data.synthetic_interactions import InteractionConfig, generate_interactions
from hugerec.index import IndexConfig, IndexKind, build_index
from hugerec.index.topk import ScoreBlock
from hugerec.models.mf import MatrixFactorization
from hugerec.models.two_tower import Similarity, TwoTower, TwoTowerConfig, recent_tail
from hugerec.sparse.jagged import JaggedTensor
from hugerec.training.epoch_batches import EpochBatches
from hugerec.training.losses import NegativeSampler, SampledSoftmax, sampled_softmax, sampled_softmax_plain
from hugerec.training.ranking_metrics import full_ranking_metrics
from hugerec.training.retrieval import RetrievalFamily, RetrievalModel, user_vectors
from hugerec.training.trainer import TrainConfig, fit

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HUGEREC_DATA", REPO / ".." / "shared" / "data"))
KS = (10, 50)
Record = dict[str, Any]


def record(config: str, method: str, value: float, unit: str, higher: bool = True) -> Record:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


# -- baselines -----------------------------------------------------------------------------------


def _matrix(train: Interactions) -> sp.csr_matrix:
    x = sp.csr_matrix(
        (np.ones(train.num_events, dtype=np.float32), (train.users(), train.items())), shape=(train.num_users, train.num_items)
    )
    x.data[:] = 1.0  # repeated (user, item) pairs count once
    return x


def popular_scores(train: Interactions) -> ScoreBlock:
    pop = torch.from_numpy(train.item_counts().astype(np.float32))
    return lambda u0, u1, i0, i1: pop[i0:i1].expand(u1 - u0, -1)


def item_knn_scores(train: Interactions, last: int) -> ScoreBlock:
    """score(u, j) = sum over u's last `last` items i of cos(i, j), cos from the item co-occurrence."""
    x = _matrix(train)
    co = (x.T @ x).toarray().astype(np.float32)  # [I, I]
    norms = np.sqrt(np.diag(co)).clip(min=1e-6)
    sim = torch.from_numpy(co / norms[:, None] / norms[None, :])
    sim.fill_diagonal_(0.0)
    hist = last_items(*histories(train), np.arange(train.num_users), last)
    ends = np.concatenate([[0], np.cumsum(hist.lengths.numpy())])

    def score(u0: int, u1: int, i0: int, i1: int) -> torch.Tensor:
        lengths = hist.lengths[u0:u1]
        rows = torch.repeat_interleave(torch.arange(u1 - u0), lengths)
        out = torch.zeros(u1 - u0, i1 - i0)
        out.index_add_(0, rows, sim[hist.values[ends[u0] : ends[u1]], i0:i1])
        return out

    return score


def ease_scores(train: Interactions, lam: float) -> ScoreBlock:
    x = _matrix(train)
    g = (x.T @ x).toarray().astype(np.float64)
    g[np.diag_indices_from(g)] += lam
    p = np.linalg.inv(g)
    b = -p / np.diag(p)[None, :]
    b[np.diag_indices_from(b)] = 0.0
    bt = torch.from_numpy(b.astype(np.float32))
    xt = x.tocsr()

    def score(u0: int, u1: int, i0: int, i1: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(xt[u0:u1] @ bt[:, i0:i1].numpy(), dtype=np.float32))

    return score


# -- quality -------------------------------------------------------------------------------------


def _model_scores(model: RetrievalModel, train: Interactions, max_history: int) -> ScoreBlock:
    hist = last_items(*histories(train), np.arange(train.num_users), max_history)
    q = user_vectors(model, torch.arange(train.num_users), hist)
    from hugerec.training.retrieval import all_item_vectors

    v = all_item_vectors(model)
    return lambda u0, u1, i0, i1: q[u0:u1] @ v[i0:i1].T


def train_model(
    kind: str, train: Interactions, params: dict[str, Any], seed: int, log: Callable[[str], None]
) -> tuple[RetrievalModel, float]:
    torch.manual_seed(seed)
    model: RetrievalModel
    if kind == "two_tower":
        model = TwoTower(params["config"], train.num_users, train.num_items, hr.Adam(lr=params["sparse_lr"]))
    else:
        model = MatrixFactorization(train.num_users, train.num_items, params["dim"], hr.Adam(lr=params["sparse_lr"]))
    hist_len = params["config"].max_history if kind == "two_tower" else 0
    batch = params["batch_size"]
    batches = EpochBatches(
        lambda e: iter_examples(train, batch, hist_len, seed=seed * 1000 + e, drop_last=True), length=train.num_events // batch
    )
    cfg = TrainConfig(epochs=params["epochs"], lr=params["lr"], seed=seed, progress=False, tensorboard=False, plot=False)
    start = time.perf_counter()
    history = fit(model, batches, None, cfg, family=RetrievalFamily(train.item_counts(), params["loss"]))
    log(f"    {kind}: {history.steps} steps, loss {history.train[0]['loss']:.4f} -> {history.train[-1]['loss']:.4f}")
    return model, time.perf_counter() - start


def quality(
    name: str,
    data: Interactions,
    params: dict[str, dict[str, Any]],
    seeds: int,
    knn_last: int,
    ease_lambda: float,
    oracle: ScoreBlock | None,
    log: Callable[[str], None],
    split: str = "test",
) -> list[Record]:
    train, test = leave_last_out(data)
    if split == "valid":  # the last event is dropped, the second-to-last held out; records say "<name>-valid"
        train, test = leave_last_out(train)
        name = f"{name}-valid"
    held = held_out_csr(test)
    excl = histories(train)
    log(f"  {name}: {data.num_users} users, {data.num_items} items, {train.num_events} train / {test.num_events} test events")
    results: dict[str, dict[str, float]] = {}

    def run(method: str, score: ScoreBlock) -> None:
        m = full_ranking_metrics(score, held, excl, train.num_items, KS)
        results[method] = m
        log(f"    {method:18s} " + "  ".join(f"{k} {m[k]:.4f}" for k in ("recall@10", "ndcg@10", "recall@50")))

    if oracle is not None:
        run("oracle", oracle)
    run("popular", popular_scores(train))
    run("item-knn", item_knn_scores(train, knn_last))
    run("ease", ease_scores(train, ease_lambda))
    for kind, method in (("two_tower", "hugerec-two-tower"), ("mf", "hugerec-mf")):
        per_seed = []
        for seed in range(seeds):
            model, sec = train_model(kind, train, params[kind], seed, log)
            hist_len = params[kind]["config"].max_history if kind == "two_tower" else 0
            per_seed.append(full_ranking_metrics(_model_scores(model, train, hist_len), held, excl, train.num_items, KS))
            log(f"    {method} seed {seed}: trained in {sec:.0f}s, recall@10 {per_seed[-1]['recall@10']:.4f}")
        results[method] = {k: float(np.mean([m[k] for m in per_seed])) for k in per_seed[0]}
        spread = "  ".join(f"{k} {min(m[k] for m in per_seed):.4f}..{max(m[k] for m in per_seed):.4f}" for k in ("recall@10", "recall@50"))
        log(f"    {method:18s} " + "  ".join(f"{k} {results[method][k]:.4f}" for k in ("recall@10", "ndcg@10", "recall@50")) + f"  (mean of {seeds} seeds; range {spread})")
    records = [
        record(f"quality {name} {metric}", method, m[metric], metric.split("@")[0])
        for method, m in results.items()
        for metric in ("recall@10", "ndcg@10", "recall@50")
    ]
    tt = results["hugerec-two-tower"]
    for metric in ("recall@10", "ndcg@10"):
        best = max(results["ease"][metric], results["item-knn"][metric])
        log(f"  {name} {metric}: two-tower / best(ease, item-knn) = {tt[metric] / best:.3f}x (target >= 0.95)")
        records.append(record(f"quality {name} {metric} ratio to best of ease and item-knn", "hugerec-two-tower", tt[metric] / best, "x"))
    if oracle is not None:
        ratio = tt["recall@50"] / results["oracle"]["recall@50"]
        log(f"  {name} recall@50: two-tower / oracle = {ratio:.3f} (target >= 0.90)")
        records.append(record(f"quality {name} recall@50 ratio to oracle", "hugerec-two-tower", ratio, "x"))
    return records


def movielens_params(quick: bool) -> dict[str, dict[str, Any]]:
    return {
        "two_tower": {
            "config": TwoTowerConfig(
                dim=64, embedding_dim=64, user_layers=(256,), max_history=50, recent=(1, 5), similarity=Similarity.COSINE, temperature=0.05
            ),
            "sparse_lr": 1e-2,
            "lr": 1e-3,
            "epochs": 2 if quick else 4,
            "batch_size": 1024,
            # a row's history items are not its negatives (validation recall@10 0.322 -> 0.332, benchmarks/README.md)
            "loss": SampledSoftmax(num_negatives=1024, mask_history=True),
        },
        "mf": {"dim": 64, "sparse_lr": 5e-3, "lr": 1e-3, "epochs": 2 if quick else 4, "batch_size": 1024,
               "loss": SampledSoftmax(num_negatives=1024)},
    }


def synthetic_params(quick: bool) -> dict[str, dict[str, Any]]:
    """Chosen on the validation split (`--split valid`, each user's second-to-last event; see
    benchmarks/README.md): the generator's logits are x_u . y_i + b_i, so an unbounded dot product (a
    cosine / temperature caps the item-popularity term); events are drawn without replacement, so a
    user's history items are masked out of that row's negatives (`mask_history`) and the whole history
    (up to 80 events) is pooled (max_history 100); the order of the draws carries nothing, so no
    recent-item windows; 5 epochs, the best mean of 3 seeds before the validation recall@50 falls."""
    p = movielens_params(quick)
    tt = dataclasses.replace(p["two_tower"]["config"], similarity=Similarity.DOT, temperature=1.0, max_history=100, recent=())
    p["two_tower"] = {**p["two_tower"], "config": tt, "epochs": 3 if quick else 5}
    p["mf"] = {**p["mf"], "epochs": 3 if quick else 8}
    return p


# -- training throughput ---------------------------------------------------------------------------


class TorchTwoTower(nn.Module):
    """The same two-tower in plain PyTorch: nn.EmbeddingBag(sparse=True) tables, the same MLP."""

    def __init__(self, num_users: int, num_items: int, dim: int, hidden: int) -> None:
        super().__init__()
        self.user = nn.EmbeddingBag(num_users, dim, mode="sum", sparse=True)
        self.history = nn.EmbeddingBag(num_items, dim, mode="mean", sparse=True)
        self.item = nn.EmbeddingBag(num_items, dim, mode="sum", sparse=True)
        for t in (self.user, self.history, self.item):
            nn.init.normal_(t.weight, 0.0, 0.05)
        self.mlp = nn.Sequential(nn.Linear(4 * dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def user_vectors(self, users: torch.Tensor, history: JaggedTensor) -> torch.Tensor:
        """user id, mean of the whole history, of the last item and of the last 5 (as TwoTower's recent=(1, 5))."""

        def off(lengths: torch.Tensor) -> torch.Tensor:
            return torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)[:-1]])

        pooled = [self.user(users, torch.arange(users.numel())), self.history(history.values, off(history.lengths))]
        for r in (1, 5):
            v, ln = recent_tail(history, r)
            pooled.append(self.history(v, off(ln)))
        return nn.functional.normalize(self.mlp(torch.cat(pooled, dim=1)), dim=1)

    def item_vectors(self, items: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(self.item(items, torch.arange(items.numel())), dim=1)


def _synthetic_batches(n: int, users: int, items: int, batch: int, hist: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, JaggedTensor]]:
    """Zipf-like item ids (popular items repeat as in real logs), uniform users, full histories."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        zipf = lambda size: np.minimum(rng.zipf(1.2, size=size) - 1, items - 1)  # noqa: E731
        u = torch.from_numpy(rng.integers(0, users, batch))
        it = torch.from_numpy(zipf(batch).astype(np.int64))
        h = JaggedTensor(torch.from_numpy(zipf(batch * hist).astype(np.int64)), torch.full((batch,), hist, dtype=torch.int64))
        out.append((u, it, h))
    return out


def main_fit_retrieval_step(
    model: TwoTower, batch: tuple[torch.Tensor, torch.Tensor, JaggedTensor], sampler: NegativeSampler, generator: torch.Generator
) -> torch.Tensor:
    """The step of `fit_retrieval` as it was on main before the one trainer (the baseline of the
    regression figure): negatives, both towers and the mixed sampled softmax, all in the calling thread."""
    users, items, history = batch
    b = users.numel()
    neg_ids = sampler.sample(b, generator)
    query = model.user_vectors(users, history)  # [B, D]
    cand = model.item_vectors(torch.cat([items, neg_ids]))  # [B + M, D]
    log_q = sampler.log_q(torch.cat([items, neg_ids]), b)
    return sampled_softmax(query, cand[:b], items, cand[b:], neg_ids, log_q, sampler.uses_in_batch, model.temperature)


def train_throughput(quick: bool, log: Callable[[str], None]) -> list[Record]:
    users = items = 100_000 if quick else 1_000_000
    dim, hidden, hist, batch, negs = 64, 256, 50, 1024, 1024
    shape = f"{users // 1000}k users x {items // 1000}k items d{dim}" if quick else f"1M users x 1M items d{dim}"
    rounds, per_round = (3, 10) if quick else (6, 10)
    batches = _synthetic_batches(per_round, users, items, batch, hist, 0)
    counts = np.bincount(np.concatenate([b[1].numpy() for b in batches]), minlength=items) + 1.0
    loss_cfg = SampledSoftmax(num_negatives=negs)
    sampler = NegativeSampler(loss_cfg, counts)
    torch.manual_seed(0)
    cfg = TwoTowerConfig(
        dim=dim, embedding_dim=dim, user_layers=(hidden,), max_history=hist, recent=(1, 5), similarity=Similarity.COSINE, temperature=0.05
    )
    ours = TwoTower(cfg, users, items, hr.Adam(lr=1e-3))  # trained by fit, and by main's loop in its own rounds
    family = RetrievalFamily(counts, loss_cfg)
    fit_cfg = TrainConfig(max_steps=per_round, lr=1e-3, seed=None, log_every=per_round, progress=False, tensorboard=False, plot=False)
    main_opt = torch.optim.Adam(ours.parameters(), lr=1e-3)
    ref = TorchTwoTower(users, items, dim, hidden)
    sparse_opt = torch.optim.SparseAdam([ref.user.weight, ref.history.weight, ref.item.weight], lr=1e-3)
    dense_opt = torch.optim.Adam(ref.mlp.parameters(), lr=1e-3)
    g_main, g_ref = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)

    def ours_round() -> None:
        fit(ours, EpochBatches(lambda e: iter(batches), length=per_round), None, fit_cfg, family=family)

    def main_round() -> None:
        ours.train()
        for b in batches:
            loss = main_fit_retrieval_step(ours, b, sampler, g_main)
            main_opt.zero_grad(set_to_none=True)
            loss.backward()
            main_opt.step()

    def ref_round() -> None:
        for u, it, h in batches:
            neg = sampler.sample(batch, g_ref)
            q = ref.user_vectors(u, h)
            cand = ref.item_vectors(torch.cat([it, neg]))
            log_q = sampler.log_q(torch.cat([it, neg]), batch)
            loss = sampled_softmax_plain(q, cand[:batch], it, cand[batch:], neg, log_q, True, cfg.temperature)
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            dense_opt.step()

    methods = {"hugerec-two-tower": ours_round, "main-fit-retrieval": main_round, "torch-two-tower": ref_round}
    seconds = dict.fromkeys(methods, 0.0)
    for r in range(rounds + 1):  # round 0 warms up (JIT, allocator, page faults) and is not counted
        for method, run in methods.items():
            start = time.perf_counter()
            run()
            if r:
                seconds[method] += time.perf_counter() - start
    rate = {m: rounds * per_round * batch / s for m, s in seconds.items()}
    vs_torch = rate["hugerec-two-tower"] / rate["torch-two-tower"]
    vs_main = rate["hugerec-two-tower"] / rate["main-fit-retrieval"]
    log(
        f"  train {shape}, batch {batch}, {negs} negatives, history {hist}: fit {rate['hugerec-two-tower']:,.0f} samples/s, "
        f"main's fit_retrieval loop {rate['main-fit-retrieval']:,.0f}, torch {rate['torch-two-tower']:,.0f} -> "
        f"{vs_torch:.2f}x torch (target >= 2), {vs_main:.2f}x main's loop (target >= 0.95); load {os.getloadavg()[0]:.1f}"
    )
    recs = [record(f"train {shape}", m, v, "samples/s") for m, v in rate.items()]
    recs.append(record(f"train {shape} ratio to torch-two-tower", "hugerec-two-tower", vs_torch, "x"))
    recs.append(record(f"train {shape} ratio to main-fit-retrieval", "hugerec-two-tower", vs_main, "x"))
    return recs


# -- ANN -------------------------------------------------------------------------------------------


def ann(quick: bool, log: Callable[[str], None]) -> list[Record]:
    n, dim, k = (50_000 if quick else 1_000_000), 64, 100
    size = f"{n // 1000}k d{dim}" if quick else f"1M d{dim}"
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(1000, dim, generator=g)
    vectors = centers[torch.randint(0, 1000, (n,), generator=g)] + 0.5 * torch.randn(n, dim, generator=g)
    queries = torch.randn(200, dim, generator=g) @ torch.eye(dim) * 0.5 + centers[torch.randint(0, 1000, (200,), generator=g)]
    exact = build_index(vectors, config=IndexConfig(IndexKind.EXACT))
    start = time.perf_counter()
    approx = build_index(vectors, config=IndexConfig(IndexKind.HNSW))
    build_s = time.perf_counter() - start
    _, e_ids = exact.query(queries, k)
    _, a_ids = approx.query(queries, k)
    recall = float(np.mean([len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(e_ids, a_ids, strict=True)]))

    def qps(index: Any, n_q: int) -> float:
        start = time.perf_counter()
        for i in range(n_q):
            index.query(queries[i : i + 1], k)
        return n_q / (time.perf_counter() - start)

    exact_qps, approx_qps = qps(exact, 20 if quick else 50), qps(approx, 200)
    log(
        f"  ann {size}: HNSW built in {build_s:.0f}s, recall@{k} {recall:.4f} (target >= 0.95); batch-1 qps "
        f"hnsw {approx_qps:,.0f} vs exact {exact_qps:,.1f} -> {approx_qps / exact_qps:.1f}x (target >= 10)"
    )
    return [
        record(f"ann {size} recall@{k}", "hugerec-ann", recall, "recall"),
        record(f"ann {size} recall@{k}", "exact", 1.0, "recall"),
        record(f"ann {size} queries/s batch 1", "hugerec-ann", approx_qps, "queries/s"),
        record(f"ann {size} queries/s batch 1", "exact", exact_qps, "queries/s"),
        record(f"ann {size} queries/s batch 1 ratio to exact", "hugerec-ann", approx_qps / exact_qps, "x"),
        record(f"ann {size} build", "hugerec-ann", build_s, "s", higher=False),
    ]


# -- main ------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer epochs (1-2 minutes on an idle 2-core VM)")
    parser.add_argument("--json", help="write every figure to this JSON file")
    parser.add_argument("--only", choices=("quality", "train", "ann"), help="run one part")
    parser.add_argument("--seeds", type=int, default=1, help="training seeds per hugerec model in the quality part (mean reported)")
    parser.add_argument(
        "--split", choices=("test", "valid"), default="test",
        help="quality: score the last event (test) or the second-to-last with the last removed (valid, for choosing settings)",
    )
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"retrieval benchmark ({'quick' if args.quick else 'full'}), load {os.getloadavg()[0]:.1f}")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    records: list[Record] = []
    if args.only in (None, "quality"):
        synth_cfg = (
            InteractionConfig(num_users=1000, num_items=300, rank=8, min_events=30, max_events=60, seed=0)
            if args.quick
            else InteractionConfig(num_users=3000, num_items=1000, rank=8, min_events=40, max_events=80, seed=0)
        )
        synth = generate_interactions(synth_cfg)
        oracle: ScoreBlock = lambda u0, u1, i0, i1: torch.from_numpy(synth.true_scores(np.arange(u0, u1))[:, i0:i1])  # noqa: E731
        records += quality("synthetic", synth.data, synthetic_params(args.quick), args.seeds, 3, 100.0, oracle, log, args.split)
        ml = DATA / "movielens" / "ml-1m" / "ratings.dat.gz"
        if ml.exists():
            raw = read_interactions(ml, ("user", "item", "rating", "timestamp"), separator="::")
            if args.quick:  # the first 1000 users
                import polars as pl

                raw = raw.filter(pl.col("user") <= 1000)
            data, _ = categorify(raw)
            records += quality("movielens", data, movielens_params(args.quick), args.seeds, 3, 500.0, None, log, args.split)
        else:
            log(f"  movielens: {ml} not found, skipped (set HUGEREC_DATA)")
    if args.only in (None, "train"):
        records += train_throughput(args.quick, log)
    if args.only in (None, "ann"):
        records += ann(args.quick, log)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
        log(f"wrote {len(records)} records to {args.json}")


if __name__ == "__main__":
    main()
