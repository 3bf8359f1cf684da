"""Pipeline benchmark: the four-stage pipeline (hugerec) vs the same pipeline written the obvious way.

Catalogue: 1M synthetic items (--quick: 50k) with 64-dim vectors shaped like a trained retrieval
model's (latent_vectors: the rank-16 user / item factors and log-Zipf popularity bias of
hugerec.data.synthetic_interactions' generating model, in a random 17-dim subspace of the 64, plus a
small isotropic residual; popular items have the larger norms), 10k users (--quick: 2k) with 20 seen
items each, item features (available, region, category, price, promoted) and user features (age,
region). The DLRM ranker keeps random weights: its work, not its quality, is measured. Request: retrieve
500, drop seen / unavailable / other-region items, score the survivors (about 150) with a DLRM (user,
item, category embeddings of dim 16 + 3 dense inputs), boost promoted items, at most 5 per category,
return 20.

    hugerec-pipeline  Pipeline: HNSW index (usearch, connectivity 32, expansion_add 128, f16 vectors),
                      feature store reads in batch, one batched call of the exported ranking bundle,
                      vectorised ordering; served by InferenceServer (POST /recommend on raw ASGI)
    naive-pipeline    exact retrieval (one [I, D] x [D] numpy product, argpartition), pandas filtering
                      (.loc on the item frame, isin, boolean masks), the eager PyTorch DLRM called per
                      batch of 64 candidates with features looked up in Python dicts, pandas ordering;
                      served by a FastAPI app

Retrieval quality first: recall@500 of the HNSW search against the exact top-500 (numpy) of the same
user vectors, over 100 users, at each expansion_search of EFS; the pipeline then runs with the smallest
expansion_search reaching recall 0.95 (the largest when none does). Then, in process, one request at a
time: p50 / p99 per request, the median time of each stage, and the share of the two sides' top-20
lists. Then through HTTP on 127.0.0.1 (each side in its own server process), 8 closed-loop keep-alive
clients for a bounded time: throughput (requests/s) and p99.

The world (vectors, features, ranker, pipeline bundle with its HNSW graph) is built once and cached in
$HUGEREC_BENCH_CACHE (default: <tmp>/hugerec-bench-cache), keyed by its sizes and parameters;
--rebuild builds it again.

    python benchmarks/pipeline.py [--quick] [--json PATH] [--rebuild]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hugerec.index.vector_index import IndexConfig, IndexKind

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import drive, free_port  # the load generator of the serving benchmark

DIM, RETRIEVE, K, PER_CATEGORY, CATEGORIES, REGIONS, SEEN, BATCH = 64, 500, 20, 5, 64, 3, 20, 64
CLIENTS = 8
RANK, AFFINITY, POPULARITY, RESIDUAL = 16, 2.0, 1.0, 0.3  # the catalogue's latent model (latent_vectors)
INDEX = IndexConfig(IndexKind.HNSW, connectivity=32, expansion_add=128, expansion_search=RETRIEVE, dtype="f16")
EFS, TARGET_RECALL, RECALL_USERS = (500, 750, 1000, 1250, 1500, 2000, 3000), 0.95, 100  # the expansion_search sweep
WORLD_VERSION = 2  # of make_world: a cached world of another version is not reused
OURS, NAIVE = "hugerec-pipeline", "naive-pipeline"


def sizes(quick: bool) -> tuple[int, int]:
    return (50_000, 2_000) if quick else (1_000_000, 10_000)


# -- the world ---------------------------------------------------------------------------------------
def latent_vectors(users: int, items: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """[U, DIM], [I, DIM] float32 vectors with a trained retrieval model's structure: the generating model of
    hugerec.data.synthetic_interactions (user / item factors x_u, y_i ~ N(0, 1 / sqrt(RANK)) in RANK dims,
    a log-Zipf popularity bias b_i, logit = AFFINITY x_u . y_i + b_i) written as u = Q [AFFINITY x_u, 1] and
    v = Q [y_i, b_i], Q a random orthonormal [DIM, RANK + 1] basis, plus an isotropic residual of norm
    RESIDUAL in all DIM dimensions (what a DIM-dim model fitted to rank-RANK data keeps besides the signal).
    So u . v is the generating logit up to the residual, and popular items have the larger norms."""
    basis, _ = np.linalg.qr(rng.standard_normal((DIM, RANK + 1)))
    scale = RANK**-0.25
    out = []
    for n, head, last in ((users, AFFINITY, None), (items, 1.0, "bias")):
        factors = rng.standard_normal((n, RANK)) * scale * head
        if last is None:
            extra = np.ones(n)
        else:
            extra = -POPULARITY * np.log(rng.permutation(n) + 1.0)
            extra -= extra.mean()
        residual = rng.standard_normal((n, DIM)) * (RESIDUAL / np.sqrt(DIM))
        out.append((np.c_[factors, extra] @ basis.T + residual).astype(np.float32))
    return out[0], out[1]


def make_world(items: int, users: int, workdir: Path) -> None:
    """Writes everything both sides load: vectors, features, seen items, the DLRM and the pipeline bundle."""
    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.optimizers import SGD
    from hugerec.embedding.table_config import TableConfig
    from hugerec.models.dlrm import DLRM
    from hugerec.models.mf import MatrixFactorization
    from hugerec.serving.bundles.export import export
    from hugerec.serving.bundles.pipeline_bundle import export_pipeline
    from hugerec.serving.pipeline import (
        Ann,
        Boost,
        Condition,
        Filter,
        Order,
        PipelineSpec,
        Retrieve,
        Score,
    )
    from hugerec.serving.pipeline.declaration import PipelineDeclaration
    from hugerec.serving.pipeline.encoder import UserEncoder
    from hugerec.serving.pipeline.feature_store import FeatureStore
    from hugerec.serving.pipeline.interaction_store import InteractionStore

    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    mf = MatrixFactorization(users, items, DIM, SGD(), init_std=0.1)
    user_vecs, item_vecs = latent_vectors(users, items, rng)
    with torch.no_grad():
        mf.user_embedding.table_weight("user_id").copy_(torch.from_numpy(user_vecs))
        mf.item_embedding.table_weight("item_id").copy_(torch.from_numpy(item_vecs))
    item_cols: dict[str, np.ndarray] = {
        "available": (rng.random(items) < 0.9).astype(np.int64),
        "region": rng.integers(0, REGIONS, items),
        "category": rng.integers(0, CATEGORIES, items),
        "price": rng.random(items).astype(np.float32),
        "promoted": (rng.random(items) < 0.05).astype(np.int64),
    }
    user_cols: dict[str, np.ndarray] = {"age": rng.integers(15, 80, users), "region": rng.integers(0, REGIONS, users)}
    seen_u = np.repeat(np.arange(users), SEEN)
    seen_i = rng.integers(0, items, users * SEEN)
    world: dict[str, Any] = {"seen_u": seen_u, "seen_i": seen_i}
    world |= {f"item_{k}": v for k, v in item_cols.items()} | {f"user_{k}": v for k, v in user_cols.items()}
    np.savez(workdir / "world.npz", **world)
    encoder = UserEncoder(mf)
    np.save(workdir / "user_vectors.npy", mf.user_embedding.table_weight("user_id").detach().numpy())
    np.save(workdir / "item_vectors.npy", encoder.item_vectors())
    tables = [TableConfig("user", users, 16), TableConfig("item", items, 16), TableConfig("category", CATEGORIES, 16)]
    ranker = DLRM(EmbeddingCollection(tables, SGD()), 3, [32, 16], [64, 1]).eval()
    torch.save(ranker.state_dict(), workdir / "ranker.pt")
    export(ranker, workdir / "ranker", name="ranker")
    store = FeatureStore.in_memory({"user": tuple(user_cols), "item": tuple(item_cols)})
    store.write("user", np.arange(users), user_cols)
    store.write("item", np.arange(items), item_cols)
    spec = PipelineSpec(
        (
            Retrieve((Ann(RETRIEVE),)),
            Filter(True, (Condition("available", "==", 1), Condition("region", "==", "user.region"))),
            Score(dense=("user.age", "item.price", "context.hour"), sparse=(("user", "user.id"), ("item", "item.id"), ("category", "item.category"))),
            Order((Boost(Condition("promoted", "==", 1), multiply=1.2),), "category", PER_CATEGORY),
        ),
        context=(("hour", 12.0),),
    )
    export_pipeline(workdir / "pipeline", PipelineDeclaration("bench", "1", spec), store, InteractionStore.from_pairs(seen_u, seen_i),
                    np.arange(items), encoder, INDEX, workdir / "ranker")
    (workdir / "complete").write_text("")  # a cached world without it was interrupted while being built


def world(items: int, users: int, rebuild: bool) -> Path:
    """The world's folder in the cache (built once: the 1M-item HNSW graph takes minutes of both cores)."""
    root = Path(os.environ.get("HUGEREC_BENCH_CACHE") or Path(tempfile.gettempdir()) / "hugerec-bench-cache")
    key = (f"pipeline-{WORLD_VERSION}-{items}-{users}-r{RANK}-a{AFFINITY}-p{POPULARITY}-res{RESIDUAL}"
           f"-M{INDEX.connectivity}-efa{INDEX.expansion_add}-{INDEX.dtype}")
    folder = root / key
    if (folder / "complete").is_file() and not rebuild:
        print(f"world: {items:,} items x dim {DIM}, {users:,} users, cached in {folder}")
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        t0 = time.perf_counter()
        make_world(items, users, tmp)
        print(f"world: {items:,} items x dim {DIM}, {users:,} users, pipeline bundle built in {time.perf_counter() - t0:.1f} s, cached in {folder}")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def sweep(index: Any, encoder: Any, item_vectors: np.ndarray, users: list[int], records: list[dict[str, Any]]) -> int:
    """Recall@RETRIEVE of the HNSW search against the exact top-RETRIEVE (numpy) of the same user vectors, and
    the search's p50, at each expansion_search of EFS; returns the smallest reaching TARGET_RECALL (else the largest)."""
    vectors = [encoder.encode(u, np.zeros(0, np.int64)) for u in users]
    exact = []
    for v in vectors:
        scores = item_vectors @ v
        exact.append(set(np.argpartition(-scores, RETRIEVE)[:RETRIEVE].tolist()))  # dense ids = item ids here
    chosen = EFS[-1]
    for ef in EFS:
        index.set_expansion_search(ef)
        recalls, times, cpu = [], [], []
        for v, truth in zip(vectors, exact, strict=True):
            t, c = time.perf_counter(), time.thread_time()
            _, ids = index.query(v[None, :], RETRIEVE)
            times.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            recalls.append(len(truth & set(ids[0].tolist())) / RETRIEVE)
        recall, p50, cpu50 = float(np.mean(recalls)), float(np.median(times)) * 1e3, float(np.median(cpu)) * 1e3
        records.append(record(f"ann recall@{RETRIEVE} vs exact, expansion_search {ef}", OURS, recall, "fraction", True))
        records.append(record(f"ann search p50, expansion_search {ef}", OURS, p50, "ms", False))
        records.append(record(f"ann search cpu p50, expansion_search {ef}", OURS, cpu50, "ms", False))
        print(f"HNSW expansion_search {ef:5d}: recall@{RETRIEVE} {recall:.3f} vs exact over {len(users)} users, search p50 {p50:.2f} ms "
              f"(cpu {cpu50:.2f} ms)")
        if recall >= TARGET_RECALL and chosen == EFS[-1] and ef != EFS[-1]:
            chosen = ef
    return chosen


# -- the naive pipeline ------------------------------------------------------------------------------
class Naive:
    """The pipeline written the obvious way (see the module's docstring)."""

    def __init__(self, workdir: Path, items: int, users: int) -> None:
        import pandas as pd

        from hugerec.embedding.collection import EmbeddingCollection
        from hugerec.embedding.optimizers import SGD
        from hugerec.embedding.table_config import TableConfig
        from hugerec.models.dlrm import DLRM

        # an NpzFile reads an array from its zip on every access: read each once (indexing world[...][i] per
        # item was quadratic, and at 1M items the naive side never finished building its dicts)
        with np.load(workdir / "world.npz") as npz:
            world = {name: npz[name] for name in npz.files}
        self.user_vectors = np.load(workdir / "user_vectors.npy")
        self.item_vectors = np.load(workdir / "item_vectors.npy")
        cols = ("available", "region", "category", "price", "promoted")
        self.items = pd.DataFrame({c: world[f"item_{c}"] for c in cols}, index=pd.RangeIndex(items, name="item"))
        columns = {c: world[f"item_{c}"].tolist() for c in cols}
        self.item_dict = {i: {c: columns[c][i] for c in cols} for i in range(items)}
        ages, regions = world["user_age"].tolist(), world["user_region"].tolist()
        self.user_dict = {u: {"age": int(ages[u]), "region": int(regions[u])} for u in range(users)}
        self.seen: dict[int, set[int]] = {}
        for u, i in zip(world["seen_u"].tolist(), world["seen_i"].tolist(), strict=True):
            self.seen.setdefault(u, set()).add(i)
        tables = [TableConfig("user", users, 16), TableConfig("item", items, 16), TableConfig("category", CATEGORIES, 16)]
        self.model = DLRM(EmbeddingCollection(tables, SGD()), 3, [32, 16], [64, 1])
        self.model.load_state_dict(torch.load(workdir / "ranker.pt", weights_only=True))
        self.model.eval()

    def recommend(self, user: int, k: int = K, hour: float = 12.0) -> list[int]:
        from hugerec.sparse.batch import Batch
        from hugerec.sparse.features import SparseFeatures

        scores = self.item_vectors @ self.user_vectors[user]
        top = np.argpartition(-scores, RETRIEVE)[:RETRIEVE]
        top = top[np.argsort(-scores[top], kind="stable")]
        df = self.items.loc[top].reset_index()
        u = self.user_dict[user]
        df = df[~df["item"].isin(self.seen.get(user, set())) & (df["available"] == 1) & (df["region"] == u["region"])]
        candidates = df["item"].tolist()
        out = []
        with torch.no_grad():
            for lo in range(0, len(candidates), BATCH):
                chunk = candidates[lo : lo + BATCH]
                feats = [self.item_dict[i] for i in chunk]
                dense = torch.tensor([[u["age"], f["price"], hour] for f in feats], dtype=torch.float32)
                sparse = SparseFeatures.from_lists({"user": [[user]] * len(chunk), "item": [[i] for i in chunk], "category": [[int(f["category"])] for f in feats]})
                out.append(torch.sigmoid(self.model(Batch(dense, sparse, torch.zeros(len(chunk))))))
        df = df.assign(score=torch.cat(out).numpy() if out else [])
        df.loc[df["promoted"] == 1, "score"] *= 1.2
        df = df.sort_values(["score", "item"], ascending=[False, True])
        df = df[df.groupby("category").cumcount() < PER_CATEGORY]
        return [int(i) for i in df["item"].head(k)]


# -- servers -----------------------------------------------------------------------------------------
def serve(side: str, workdir: Path, port: int, items: int, users: int, expansion_search: int) -> None:
    import uvicorn

    torch.set_num_threads(1)
    if side == OURS:
        from hugerec.serving.http.server import InferenceServer, ServerConfig

        server = InferenceServer(ServerConfig(port=port))
        server.pipeline_options = replace(server.pipeline_options, expansion_search=expansion_search)
        server.add_bundle(workdir / "pipeline")
        server.run()
        return
    from fastapi import FastAPI

    naive = Naive(workdir, items, users)
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/recommend")
    def recommend(body: dict[str, Any]) -> dict[str, list[int]]:
        return {"items": naive.recommend(int(body["user"]), int(body.get("k", K)))}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start_server(side: str, workdir: Path, items: int, users: int, ef: int) -> tuple[subprocess.Popen[bytes], int]:
    import httpx

    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", side, "--workdir", str(workdir), "--port", str(port), "--items", str(items),
                             "--users", str(users), "--ef", str(ef)])
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{side} server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{side} server did not become ready")


def http_run(side: str, workdir: Path, items: int, users: int, seconds: float, ef: int) -> tuple[float, float, int]:
    """(requests/s, p99 seconds, requests) of `side` under CLIENTS closed-loop clients."""
    proc, port = start_server(side, workdir, items, users, ef)
    try:
        rng = np.random.default_rng(1)
        bodies = [(json.dumps({"user": int(u), "k": K}).encode(), {"content-type": "application/json"}) for u in rng.integers(0, users, 512)]
        latencies, _ = asyncio.run(drive(f"http://127.0.0.1:{port}/recommend", bodies, CLIENTS, seconds))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return len(latencies) / seconds, float(np.percentile(latencies, 99)), len(latencies)


def record(config: str, method: str, value: float, unit: str, higher: bool) -> dict[str, Any]:
    return {"config": config, "method": method, "value": float(value), "unit": unit, "higher_is_better": higher}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50k items, short runs (about a minute or two)")
    parser.add_argument("--json", type=Path, help="write the records to this JSON file")
    parser.add_argument("--rebuild", action="store_true", help="build the world and its bundle again even when a cached one exists")
    parser.add_argument("--serve", choices=(OURS, NAIVE), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--items", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--users", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ef", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.workdir, args.port, args.items, args.users, args.ef)
        return
    torch.set_num_threads(1)
    items, users = sizes(args.quick)
    requests, naive_requests, seconds = (300, 40, 6.0) if args.quick else (1000, 100, 20.0)
    workdir = world(items, users, args.rebuild)
    records: list[dict[str, Any]] = []
    from hugerec.index.vector_index import HnswIndex
    from hugerec.serving import load
    from hugerec.serving.pipeline import Query
    from hugerec.serving.pipeline.served_pipeline import ServedPipeline

    loaded = load(workdir / "pipeline")
    assert isinstance(loaded, ServedPipeline)
    res = loaded.pipeline.res
    assert isinstance(res.index, HnswIndex) and res.encoder is not None and res.item_vectors is not None
    rng = np.random.default_rng(2)
    stream = rng.integers(0, users, requests).tolist()
    ef = sweep(res.index, res.encoder, res.item_vectors, stream[:RECALL_USERS], records)
    res.index.set_expansion_search(ef)
    naive = Naive(workdir, items, users)
    for u in stream[:20]:  # warm-up
        loaded.pipeline.recommend(Query(u, K))
        naive.recommend(u)
    stages: dict[str, list[float]] = {}
    ours_lat, ours_cpu, overlap = [], [], []
    for u in stream:
        t, c = time.perf_counter(), time.thread_time()
        rec = loaded.pipeline.recommend(Query(u, K))
        ours_lat.append(time.perf_counter() - t)
        ours_cpu.append(time.thread_time() - c)
        for name, sec in rec.seconds.items():
            stages.setdefault(name, []).append(sec)
    naive_lat, naive_cpu = [], []
    for u in stream[:naive_requests]:
        t, c = time.perf_counter(), time.thread_time()
        got = naive.recommend(u)
        naive_lat.append(time.perf_counter() - t)
        naive_cpu.append(time.thread_time() - c)
        overlap.append(len(set(got) & set(loaded.pipeline.recommend(Query(u, K)).items.tolist())) / K)
    loaded.close()
    del naive
    for method, lat in ((OURS, ours_lat), (NAIVE, naive_lat)):
        records.append(record("pipeline in-process p50", method, np.percentile(lat, 50) * 1e3, "ms", False))
        records.append(record("pipeline in-process p99", method, np.percentile(lat, 99) * 1e3, "ms", False))
    for method, lat in ((OURS, ours_cpu), (NAIVE, naive_cpu)):  # CPU time of the thread: what a loaded machine inflates least
        records.append(record("pipeline in-process cpu p50", method, np.percentile(lat, 50) * 1e3, "ms", False))
    for name, stage_seconds in stages.items():
        records.append(record(f"pipeline in-process stage {name} p50", OURS, np.percentile(stage_seconds, 50) * 1e3, "ms", False))
    records.append(record("pipeline top-20 overlap with naive (exact retrieval)", OURS, float(np.mean(overlap)), "fraction", True))
    print(f"in process: {len(ours_lat)} requests ({OURS}, expansion_search {ef}), {len(naive_lat)} ({NAIVE}); the two top-20 lists "
          f"share {np.mean(overlap):.0%} of their items (HNSW vs exact retrieval)")
    for side in (OURS, NAIVE):
        rate, p99, n = http_run(side, workdir, items, users, seconds, ef)
        records.append(record("pipeline http throughput", side, rate, "req/s", True))
        records.append(record("pipeline http p99", side, p99 * 1e3, "ms", False))
        print(f"http {side}: {n} requests in {seconds:.0f} s from {CLIENTS} clients")
    base = {r["config"]: r["value"] for r in records if r["method"] == NAIVE}
    print(f"\n{'config':40s} {'method':18s} {'value':>10s} {'unit':6s} {'vs naive':>9s}")
    for r in records:
        b = base.get(r["config"])
        ratio = "" if b is None or r["method"] == NAIVE else f"{(r['value'] / b) if r['higher_is_better'] else (b / r['value']):.1f}x"
        print(f"{r['config']:40s} {r['method']:18s} {r['value']:10.2f} {r['unit']:6s} {ratio:>9s}")
    print("(vs naive > 1: ours better; for latencies it is naive / ours)   load:", os.getloadavg())
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    main()
