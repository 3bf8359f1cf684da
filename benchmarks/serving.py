"""Serving benchmark: the hugerec server vs a naive FastAPI server, both over real HTTP on 127.0.0.1.

Model: a Criteo-shaped DLRM (13 dense features, 26 tables of dim 16, one id per feature, ids drawn
from a Zipf law so that some rows are hot), exported once. Three servers, each its own process:

    hugerec          our server: KServe v2 binary tensors (what tritonclient sends), dynamic batching,
                     parameter server (cache -> memory -> RocksDB), exported dense program
    hugerec-json     the same server, KServe v2 JSON tensors
    baseline         FastAPI + pydantic JSON body; per request: every id looked up in a Python dict of
                     rows, the eager PyTorch model on that request alone (no batching)

A load generator (asyncio streams, closed loop, keep-alive clients, bounded in time) sends
batches of 1, 64 and 1024 examples from 16, 16 and 4 concurrent clients (the same for every server;
each record and line names its count), plus batch 1 from one client (latency without queueing);
it reports throughput (examples/s) and p50/p99 latency. The parameter server's lookup throughput per tier (rows/s) is measured in process,
against a Python dict.

    python benchmarks/serving.py [--quick] [--json PATH] [--parts dlrm,tiers,gbm,status,attack]

Gradient-boosted trees (`--gbm-only` runs just this part; skipped without `pip install 'hugerec[gbm]'`):
a 500-tree LightGBM (and XGBoost) model trained on Criteo-shaped rows (13 dense, 26 categorical ids),
exported as a GBM bundle. In process: hugerec-lightgbm (GBMModel.predict: the flat forest's Numba
kernel, with Numba's threads: batches of 128 rows or more are split over them; also with one thread,
hugerec-lightgbm-1thread, when NUMBA_NUM_THREADS > 1) against naive-lightgbm (Booster.predict, raw
scores, one thread) on the same rows, us per row at batch 1 and 256. Over HTTP: our server with the GBM bundle (KServe v2 binary, dynamic batching)
against naive-lightgbm (FastAPI + pydantic, Booster.predict per request), batch 1 from 16 clients and
batch 256 from 4 clients: p50 / p99 latency and throughput, interleaved like the DLRM runs.
Loading (config "gbm load", seconds, median of 3 or 7 interleaved repeats): hugerec-lightgbm (the
server's load (hugerec.serving.load): our reader with every tree checked, then the library's parse of the same bytes
in a child process under the load deadline, its probe scores compared) against in-process-lightgbm (the
load before: the library parses the file in the server's process, the forest is flattened from its
dump), and hugerec-lightgbm-no-child (our reader and checks alone: what isolation adds is the rest).

    python benchmarks/serving.py --gbm-only [--quick] [--json PATH]

The status page (`--status-only` runs just this part; config "status page"): our server with the DLRM
bundle, an admin token and a loop's decision log of 2,000 records (so that every details request parses the
64 KiB tail), after some inference traffic. Closed-loop GET clients, interleaved in short rounds:
hugerec-status-details (GET /status/details with the token: versions, traffic from the metrics, the log's
tail), hugerec-status (GET /status) and hugerec-status-page (GET /, the HTML) against health-ready
(GET /v2/health/ready of the same server: the cheapest route it has). p50 / p99 latency in ms.

    python benchmarks/serving.py --status-only [--quick] [--json PATH]

Under attack (`--attack-only` runs just this part; also run after the rest), the server with its default limits
(serving/http/limits.py RequestLimits):

    hostile requests       the fuzzing suite (tests/serving/http/test_server_fuzz.py) run for 10,000 generated
                           bad requests (--quick: 1,000) against a live server: requests sent, 5xx answers
    pipeline under attack  p99 of normal /recommend traffic (8 closed-loop clients, the pipeline of
                           benchmarks/pipeline.py --quick: 50k items) alone, then while 6 clients send maximal legal KServe v2
                           requests (max_users users, k = the pipeline's max_k, max_history history ids each):
                           the ratio of the two p99s (target <= 3)
    slow clients           200 connections trickling their request heads a byte a second (reopened when the
                           server cuts them) while one client sends /recommend requests one after another: the
                           slowest answer (target <= 1 s)
    large body memory      the DLRM server's peak RSS growth (VmHWM after clearing it, minus VmRSS before) over
                           the body size, for the largest legal binary infer body (max_request_rows rows), four of
                           them at once, and the largest JSON infer body (target <= 3 for binary bodies)

    python benchmarks/serving.py --attack-only [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numba
import numpy as np
import torch
from pydantic import BaseModel

NUM_DENSE = 13
NUM_TABLES = 26
DIM = 16
FEATURES = tuple(f"C{i}" for i in range(1, NUM_TABLES + 1))
# closed-loop clients per request size, the same for every server: enough that dynamic batching matters
CONCURRENCY = {1: 16, 64: 16, 1024: 4}
OURS = ("hugerec", "hugerec-json")
ROUNDS = 4
BASELINE = "baseline"
PARTS = ("dlrm", "tiers", "gbm", "status", "attack")


# -- the model -------------------------------------------------------------------------------------
def build_model(rows: int) -> Any:
    from hugerec.embedding.collection import EmbeddingCollection
    from hugerec.embedding.table_config import TableConfig
    from hugerec.models.dlrm import DLRM

    torch.manual_seed(0)
    tables = [TableConfig(f, rows, DIM) for f in FEATURES]
    return DLRM(EmbeddingCollection(tables), NUM_DENSE, [64, DIM], [128, 64, 1]).eval()


def make_requests(batch: int, count: int, rows: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`count` requests of `batch` examples: (dense [B, 13] float32, ids [B, 26] int64, Zipf-distributed)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dense = rng.standard_normal((batch, NUM_DENSE)).astype(np.float32)
        ids = (rng.zipf(1.2, (batch, NUM_TABLES)) - 1) % rows
        out.append((dense, ids.astype(np.int64)))
    return out


def kserve_binary(dense: np.ndarray, ids: np.ndarray) -> tuple[bytes, dict[str, str]]:
    tensors = [("dense", "FP32", dense)] + [
        (f, "INT64", np.ascontiguousarray(ids[:, i])) for i, f in enumerate(FEATURES)
    ]
    header = {
        "inputs": [
            {"name": n, "datatype": t, "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
            for n, t, a in tensors
        ],
        "outputs": [{"name": "scores", "parameters": {"binary_data": True}}],
    }
    head = json.dumps(header).encode()
    body = head + b"".join(a.tobytes() for _, _, a in tensors)
    return body, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def kserve_json(dense: np.ndarray, ids: np.ndarray) -> tuple[bytes, dict[str, str]]:
    inputs = [{"name": "dense", "datatype": "FP32", "shape": list(dense.shape), "data": dense.ravel().tolist()}]
    inputs += [
        {"name": f, "datatype": "INT64", "shape": [ids.shape[0]], "data": ids[:, i].tolist()}
        for i, f in enumerate(FEATURES)
    ]
    body = {"inputs": inputs, "outputs": [{"name": "scores"}]}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def baseline_json(dense: np.ndarray, ids: np.ndarray) -> tuple[bytes, dict[str, str]]:
    body = {"dense": dense.tolist(), "sparse": {f: ids[:, i : i + 1].tolist() for i, f in enumerate(FEATURES)}}
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


# -- servers (each runs in its own process) --------------------------------------------------------
class BaselineRequest(BaseModel):
    dense: list[list[float]]
    sparse: dict[str, list[list[int]]]


def run_ours(bundle: str, state: str, port: int, max_delay_ms: float, offload_rows: int) -> None:
    from hugerec.serving.bundles.bundle_loader import ServeOptions
    from hugerec.serving.http.server import InferenceServer, ServerConfig
    from hugerec.serving.runtime.batching import BatchingConfig

    server = InferenceServer(
        ServerConfig(
            port=port,
            batching=BatchingConfig(max_batch_size=2048, max_delay_ms=max_delay_ms, offload_rows=offload_rows),
        ),
        ServeOptions(state_dir=state),
    )
    server.add_bundle(bundle)
    server.run()


def run_baseline(weights: str, port: int, rows: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    model = build_model(rows)
    model.load_state_dict(torch.load(weights, weights_only=True))
    tables = {f: {i: row for i, row in enumerate(model.sparse_arch.table_weight(f).detach().numpy())} for f in FEATURES}
    zeros = np.zeros(DIM, np.float32)

    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/predict")
    async def predict(request: BaselineRequest) -> dict[str, list[float]]:
        pooled = np.empty((len(request.dense), NUM_TABLES * DIM), np.float32)
        for j, f in enumerate(FEATURES):
            table = tables[f]
            for b, bag in enumerate(request.sparse[f]):
                pooled[b, j * DIM : (j + 1) * DIM] = sum((table.get(i, zeros) for i in bag), zeros)
        with torch.inference_mode():
            logits = model.dense_forward(torch.tensor(request.dense), (torch.from_numpy(pooled),))
        return {"scores": torch.sigmoid(logits).tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class GBMRequest(BaseModel):
    dense: list[list[float]]
    sparse: dict[str, list[list[int]]]


GBM_LIBRARIES = ("lightgbm", "xgboost")
GBM_TREES = 500


def gbm_train(library: str, out: Path, rows: int) -> tuple[Path, Path]:
    """A GBM_TREES-tree model of `library` on Criteo-shaped rows (no early stopping) -> (model file, bundle)."""
    from hugerec.data.schema import Schema
    from hugerec.models.gbm import FeatureMatrix, Library, LightGBMConfig, XGBoostConfig
    from hugerec.serving.bundles.gbm_bundle import write_gbm_bundle
    from hugerec.training.gbm_fit import fit_trees

    dense, ids = make_requests(rows, 1, 1000, seed=7)[0]
    x = np.hstack([dense, ids.astype(np.float32)])
    rng = np.random.default_rng(8)
    y = (dense[:, 0] + (ids[:, 0] % 3 == 0) + rng.standard_normal(rows) > 0.8).astype(np.float32)
    names = (*(f"I{i}" for i in range(1, NUM_DENSE + 1)), *FEATURES)
    data = FeatureMatrix(x, y, names, NUM_DENSE)
    lib = Library(library)
    config = (
        LightGBMConfig(num_trees=GBM_TREES, num_leaves=31, early_stopping_rounds=None, threads=2)
        if lib is Library.LIGHTGBM
        else XGBoostConfig(num_trees=GBM_TREES, max_depth=6, early_stopping_rounds=None, threads=2)
    )
    model, _ = fit_trees(config, data, None, out_dir=None, log_every=0)
    path = model.save(out / lib.model_file)
    schema = Schema.build(["label"], names[:NUM_DENSE], dict.fromkeys(FEATURES, 1000))
    return path, write_gbm_bundle(path, lib, out / "bundle", schema, name="gbm")


def gbm_in_process(library: str, path: Path, bundle: Path, seconds: float) -> list[dict[str, Any]]:
    """us per row of GBMModel.predict (hugerec-LIB) and of the library's predict (naive-LIB), same rows."""
    from hugerec import serving
    from hugerec.models.gbm import Library, TreeModel
    from hugerec.serving.runtime.model_inputs import ModelInputs
    from hugerec.serving.runtime.served_model import ServedModel

    served = serving.load(bundle)
    assert isinstance(served, ServedModel)  # a GBM bundle serves as a ranking model
    model = served.model
    served.close()  # its batcher; the model itself holds no resources
    tree = TreeModel.load(path, Library(library), threads=1)
    records = []
    for batch in (1, 256):
        dense, ids = make_requests(batch, 1, 1000, seed=batch + 100)[0]
        inputs = ModelInputs.from_one_id(dense, FEATURES, np.ascontiguousarray(ids.T))
        x = np.hstack([dense, ids.astype(np.float32)])
        np.testing.assert_allclose(model.predict(inputs), tree.margin(x), rtol=1e-4, atol=1e-4)
        # ours with Numba's threads (NUMBA_NUM_THREADS; batches >= PARALLEL_ROWS are split over them) and,
        # when there are several, with one; the naive side is the library's predict with one thread
        threads = numba.get_num_threads()
        sides = [(f"hugerec-{library}", threads)]
        if threads > 1:
            sides.append((f"hugerec-{library}-1thread", 1))
        for method, n in [*sides, (f"naive-{library}", 1)]:
            ours = method.startswith("hugerec")
            numba.set_num_threads(n)
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                if ours:
                    model.predict(inputs)
                else:
                    tree.margin(x)
                calls += 1
            us = (time.perf_counter() - t0) / calls / batch * 1e6
            numba.set_num_threads(threads)
            records.append(
                _record(f"gbm in-process b={batch}", method, us, "us/row", False, trees=GBM_TREES, threads=n)
            )
            print(f"gbm in-process b={batch:<4d} {method:26s} {us:9.2f} us/row", flush=True)
    return records


def _loaded_forest(served: Any) -> Any:
    """The forest of a served GBM bundle, its batcher closed (the load is what is timed)."""
    served.close()
    return served.model.forest


def gbm_load(library: str, path: Path, bundle: Path, repeats: int) -> list[dict[str, Any]]:
    """Seconds to load the 500-tree bundle's model (median of `repeats`), same run: hugerec-LIB (what the
    server does: checksums, our reader with every tree checked, the library's parse in a child process
    whose probe scores must match), hugerec-LIB-no-child (our reader and checks alone), and
    in-process-LIB (the load before the checks: the library parses the file in process, then the
    forest is flattened from its dump)."""
    from hugerec import serving
    from hugerec.models.gbm import Library, TreeModel
    from hugerec.serving.runtime.forest import Forest

    lib = Library(library)

    def in_process() -> Forest:
        tree = TreeModel.load(path, lib)
        if lib is Library.LIGHTGBM:
            return Forest.from_lightgbm(tree.booster.model_to_string())
        return Forest.from_xgboost_json(bytes(tree.booster.save_raw("json")))

    def no_child() -> Forest:
        raw = path.read_bytes()
        return Forest.from_lightgbm(raw.decode(), str(path)) if lib is Library.LIGHTGBM else Forest.from_xgboost_json(raw, str(path))

    sides = {
        f"hugerec-{library}": lambda: _loaded_forest(serving.load(bundle)),
        f"hugerec-{library}-no-child": no_child,
        f"in-process-{library}": in_process,
    }
    times: dict[str, list[float]] = {m: [] for m in sides}
    for _ in range(repeats):  # interleaved: each side sees the same load on the shared cores
        for method, load in sides.items():
            t0 = time.perf_counter()
            forest = load()
            times[method].append(time.perf_counter() - t0)
            assert forest.num_trees == GBM_TREES
    records = []
    base = float(np.median(times[f"in-process-{library}"]))
    for method, ts in times.items():
        median = float(np.median(ts))
        records.append(_record("gbm load", method, median, "s", False, trees=GBM_TREES, repeats=repeats))
        print(f"gbm load {GBM_TREES} trees {method:28s} {median:7.3f} s  ({median / base:4.2f}x in-process)", flush=True)
    return records


def run_naive_gbm(library: str, path: str, port: int) -> None:
    """FastAPI + pydantic + the library's predict per request (no batching): the naive GBM server."""
    import uvicorn
    from fastapi import FastAPI

    from hugerec.models.gbm import Library, TreeModel

    tree = TreeModel.load(path, Library(library), threads=1)
    app = FastAPI()

    @app.get("/v2/health/ready")
    async def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/predict")
    async def predict(request: GBMRequest) -> dict[str, list[float]]:
        ids = np.array([[bag[0] for bag in request.sparse[f]] for f in FEATURES], np.float32).T  # [B, 26]
        x = np.hstack([np.array(request.dense, np.float32), ids])
        return {"scores": (1.0 / (1.0 + np.exp(-tree.margin(x)))).tolist()}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def gbm_http(library: str, path: Path, bundle: Path, tmp: Path, seconds: float) -> list[dict[str, Any]]:
    """Our server with the GBM bundle against the naive server, over HTTP on 127.0.0.1, interleaved."""
    procs: list[subprocess.Popen[bytes]] = []
    records: list[dict[str, Any]] = []
    ours, naive = f"hugerec-{library}", f"naive-{library}"
    try:
        ours_port, naive_port = free_port(), free_port()
        procs.append(start(["--serve", "ours", "--path", str(bundle), "--state", str(tmp / "state")], ours_port))
        procs.append(start(["--serve", "naive-gbm", "--library", library, "--path", str(path)], naive_port))
        for proc, port in zip(procs, (ours_port, naive_port), strict=True):
            wait_ready(proc, port)
        urls = {ours: f"http://127.0.0.1:{ours_port}/v2/models/gbm/infer", naive: f"http://127.0.0.1:{naive_port}/predict"}
        encoders = {ours: kserve_binary, naive: baseline_json}
        for batch, clients in ((1, 16), (256, 4)):
            requests = make_requests(batch, 16, 1000, seed=batch + 200)
            bodies = {m: [encode(d, i) for d, i in requests] for m, encode in encoders.items()}
            latencies: dict[str, list[float]] = {m: [] for m in encoders}
            for _ in range(ROUNDS):
                for method in encoders:
                    got, _ = asyncio.run(drive(urls[method], bodies[method], clients, seconds / ROUNDS))
                    latencies[method] += got
            for method in encoders:
                extra = {"clients": clients, "seconds": seconds, "trees": GBM_TREES}
                config = f"gbm http b={batch}"
                throughput, p50, p99 = _http_records(records, config, method, latencies[method], batch, seconds, extra)
                print(
                    f"{config:16s} {method:18s} clients {clients:3d} {throughput:10.0f} examples/s  "
                    f"p50 {p50:7.2f} ms  p99 {p99:7.2f} ms",
                    flush=True,
                )
    finally:
        _stop(procs)
    return records


def run_gbm(quick: bool) -> list[dict[str, Any]]:
    """The GBM part: in process and over HTTP, for each library installed."""
    import importlib.util

    records: list[dict[str, Any]] = []
    for library in GBM_LIBRARIES:
        if importlib.util.find_spec(library) is None:
            print(f"gbm {library}: skipped, not installed (pip install 'hugerec[gbm]')")
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f"hugerec-gbm-bench-{library}-"))
        try:
            t0 = time.perf_counter()
            path, bundle = gbm_train(library, tmp, 5_000 if quick else 10_000)
            print(f"gbm {library}: {GBM_TREES} trees trained in {time.perf_counter() - t0:.0f} s", flush=True)
            records += gbm_load(library, path, bundle, 3 if quick else 7)
            records += gbm_in_process(library, path, bundle, 0.5 if quick else 2.0)
            records += gbm_http(library, path, bundle, tmp, 1.6 if quick else 8.0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, __file__, *args, "--port", str(port)])


def wait_ready(proc: subprocess.Popen[bytes], port: int) -> None:
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server {proc.args!r} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server {proc.args!r} did not become ready")


# -- load generation -------------------------------------------------------------------------------
async def drive(
    url: str, bodies: list[tuple[bytes, dict[str, str]]], clients: int, seconds: float
) -> tuple[list[float], int]:
    """Closed loop: `clients` keep-alive connections, each sending its next request when the last one answered.
    Returns the latencies (seconds) of the requests sent after a short warm-up, and the warm-up count.

    A minimal HTTP/1.1 client on asyncio streams: an aiohttp client costs so much CPU per request
    that on two shared cores it, not the server, would set the pace at batch 1.
    """
    host, port, path = _split_url(url)
    requests = [_http_request(host, port, path, body, headers) for body, headers in bodies]
    return await drive_raw(host, port, requests, clients, seconds)


async def drive_raw(host: str, port: int, requests: list[bytes], clients: int, seconds: float) -> tuple[list[float], int]:
    """drive() on requests already written out as bytes (any method)."""
    url = f"http://{host}:{port}"
    latencies: list[float] = []
    failures = 0
    warmup = 0
    warmup_end = time.perf_counter() + min(0.3, seconds / 4)
    end = warmup_end + seconds

    async def worker(k: int) -> None:
        nonlocal failures, warmup
        reader, writer = await asyncio.open_connection(host, port)
        i = k
        try:
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                writer.write(requests[i % len(requests)])
                i += clients
                status, _ = await _read_response(reader)
                t1 = time.perf_counter()
                if status != 200:
                    failures += 1
                elif t0 >= warmup_end:
                    latencies.append(t1 - t0)
                else:
                    warmup += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker(k) for k in range(clients)))
    if failures:
        raise RuntimeError(f"{url}: {failures} requests failed")
    return latencies, warmup


def _http_get(host: str, port: int, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _split_url(url: str) -> tuple[str, int, str]:
    rest = url.removeprefix("http://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    return host, int(port), "/" + path


def _http_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- parameter server tiers ------------------------------------------------------------------------
def tier_throughput(rows: int, quick: bool) -> list[dict[str, Any]]:
    """Rows/s of each tier on its own (batches of 16384 Zipf keys, all present), and of the whole
    parameter server with a cache holding a quarter of the rows, against a Python dict of rows."""
    from hugerec.serving.store.cache import CacheConfig, RowCache
    from hugerec.serving.store.memory_store import MemoryStore
    from hugerec.serving.store.parameter_server import ParameterServer, TableSpec
    from hugerec.serving.store.persistent import PersistentStore

    rng = np.random.default_rng(0)
    table = rng.standard_normal((rows, DIM)).astype(np.float32)
    keys = np.arange(rows, dtype=np.int64)
    queries = [((rng.zipf(1.2, 16384) - 1) % rows).astype(np.int64) for _ in range(4 if quick else 12)]
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-ps-"))
    results: list[dict[str, Any]] = []

    def rate(fn: Any) -> float:
        fn(queries[0])
        t0 = time.perf_counter()
        for q in queries:
            fn(q)
        return sum(q.shape[0] for q in queries) / (time.perf_counter() - t0)

    redis_proc = _start_redis()
    try:
        static = MemoryStore({"t": DIM}, {"t": rows})
        static.put("t", keys, table)
        dynamic = MemoryStore({"t": DIM})
        dynamic.put("t", keys, table)
        persistent = PersistentStore(tmp / "db", {"t": DIM})
        persistent.put("t", keys, table)
        cache = RowCache(DIM, CacheConfig(rows=rows), "cpu")
        cache.insert(torch.from_numpy(keys), torch.from_numpy(table))
        ps = ParameterServer(
            [TableSpec("t", DIM, num_rows=rows)], static, persistent, CacheConfig(rows=rows // 4), "cpu"
        )
        tiers = {
            "cache": lambda q: cache.get(torch.from_numpy(q)),
            "memory": lambda q: static.get("t", q),
            "memory (dynamic keys)": lambda q: dynamic.get("t", q),
            "persistent": lambda q: persistent.get("t", q),
            "all (cache of 1/4 rows)": lambda q: ps.lookup("t", q),
        }
        if redis_proc is not None:
            from hugerec.serving.store.redis_store import RedisStore

            redis_store = RedisStore(redis_proc[1], {"t": DIM}, namespace="bench")
            redis_store.put("t", keys, table)
            tiers["redis"] = lambda q: redis_store.get("t", q)
        as_dict = {int(k): table[k] for k in range(rows)}
        base = rate(lambda q: np.stack([as_dict[int(k)] for k in q]))
        for name, fn in tiers.items():
            results.append(_record(f"ps lookup tier={name}", "hugerec", rate(fn), "rows/s", True))
        results.append(_record("ps lookup", "baseline-dict", base, "rows/s", True))
        persistent.close()
        if redis_proc is not None:
            redis_store.close()
    finally:
        if redis_proc is not None:
            redis_proc[0].terminate()
            redis_proc[0].wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return results


# -- the status page -------------------------------------------------------------------------------
STATUS_TOKEN_ENV = "HUGEREC_BENCH_STATUS_TOKEN"
STATUS_ROUTES = {  # method -> (path, with the admin token)
    "hugerec-status-details": ("/status/details", True),
    "hugerec-status": ("/status", False),
    "hugerec-status-page": ("/", False),
    "health-ready": ("/v2/health/ready", False),
}


def run_status_server(bundle: str, state: str, port: int, decision_log: str) -> None:
    from hugerec.serving.bundles.bundle_loader import ServeOptions
    from hugerec.serving.http.server import InferenceServer, ServerConfig

    server = InferenceServer(ServerConfig(port=port, admin_token=os.environ[STATUS_TOKEN_ENV]), ServeOptions(state_dir=state))
    server.add_bundle(bundle)
    server.status.show_decision_log(decision_log)
    server.run()


def run_status_page(quick: bool) -> list[dict[str, Any]]:
    """p50 / p99 of the status page's routes against /v2/health/ready of the same server (see the docstring)."""
    import secrets

    import httpx

    from hugerec.continuous.decision_log import DecisionLog, Record
    from hugerec.serving.bundles.export import export

    rows, seconds, clients = (5_000, 2.0, 4) if quick else (50_000, 8.0, 4)
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-status-bench-"))
    token = secrets.token_hex(16)
    procs: list[subprocess.Popen[bytes]] = []
    records: list[dict[str, Any]] = []
    try:
        bundle = export(build_model(rows), tmp / "bundle", name="dlrm")
        log = DecisionLog(tmp / "decisions.jsonl")
        rng = np.random.default_rng(0)
        for k in range(2000):
            drift = {f"C{i}": float(rng.random() / 4) for i in range(1, 27)}
            log.append(Record(k, "retrain" if k % 7 == 0 else "wait", f"window {k}", drift, f"w{k}", time=1.7e9 + 60 * k))
        port = free_port()
        args = ["--serve", "status", "--path", str(bundle), "--state", str(tmp / "state"), "--decision-log", str(log.path)]
        procs.append(
            subprocess.Popen([sys.executable, __file__, *args, "--port", str(port)], env={**os.environ, STATUS_TOKEN_ENV: token})
        )
        wait_ready(procs[0], port)
        url = f"http://127.0.0.1:{port}"
        with httpx.Client() as client:  # traffic for the metrics the details read: infer and /predict rows
            for body, headers in [kserve_json(d, i) for d, i in make_requests(8, 20, rows, seed=3)]:
                assert client.post(f"{url}/v2/models/dlrm/infer", content=body, headers=headers).status_code == 200
            details = client.get(f"{url}/status/details", headers={"Authorization": f"Bearer {token}"}).json()
            assert len(details["loop"]["records"]) == 20 and details["loop"]["drift"] is not None, details["loop"]
        requests = {
            method: [_http_get("127.0.0.1", port, path, {"Authorization": f"Bearer {token}"} if auth else {})]
            for method, (path, auth) in STATUS_ROUTES.items()
        }
        latencies: dict[str, list[float]] = {m: [] for m in requests}
        for _ in range(ROUNDS):  # interleaved: each method sees the same load on the shared cores
            for method, raw in requests.items():
                got, _ = asyncio.run(drive_raw("127.0.0.1", port, raw, clients, seconds / ROUNDS))
                latencies[method] += got
        load = os.getloadavg()[0]
        for method, got in latencies.items():
            if not got:
                raise RuntimeError(f"status page {method}: no request finished inside the measured windows")
            lat = np.array(got) * 1000
            extra = {"clients": clients, "seconds": seconds, "requests": len(got), "load": load}
            for q in (50, 99):
                records.append(_record(f"p{q} status page", method, float(np.percentile(lat, q)), "ms", False, **extra))
        reference = {r["config"]: r["value"] for r in records if r["method"] == "health-ready"}
        for r in records:
            ratio = r["value"] / reference[r["config"]]
            print(f"{r['config']:16s} {r['method']:24s} {r['value']:8.2f} ms  {ratio:6.2f}x health-ready  (load {load:.1f})")
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return records


def _start_redis() -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    import redis

    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.terminate()
    return None


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every server process, then reap each (killed if it takes over 15 s)."""
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def _http_records(
    records: list[dict[str, Any]], config: str, method: str, latencies: list[float], batch: int, seconds: float, extra: dict[str, Any]
) -> tuple[float, float, float]:
    """Append the throughput, p50 and p99 records of one HTTP run (latencies in seconds over `seconds` of
    measured windows); returns them (examples/s, ms, ms) for the printed line."""
    lat = np.array(latencies) * 1000
    throughput = lat.shape[0] * batch / seconds
    p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
    records.append(_record(f"throughput {config}", method, throughput, "examples/s", True, **extra))
    records.append(_record(f"p50 {config}", method, p50, "ms", False, **extra))
    records.append(_record(f"p99 {config}", method, p99, "ms", False, **extra))
    return throughput, p50, p99


def _record(config: str, method: str, value: float, unit: str, higher: bool, **extra: Any) -> dict[str, Any]:
    return {
        "config": config,
        "method": method,
        "value": float(value),
        "unit": unit,
        "higher_is_better": higher,
        **extra,
    }


# -- main ------------------------------------------------------------------------------------------
def main() -> None:
    from hugerec.serving.runtime.batching import BatchingConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small tables and short runs (< 1 minute)")
    parser.add_argument("--json", type=Path, help="write the records to this JSON file")
    parser.add_argument("--serve", choices=["ours", "baseline", "naive-gbm", "status"], help=argparse.SUPPRESS)
    parser.add_argument("--decision-log", help=argparse.SUPPRESS)
    parser.add_argument("--status-only", action="store_true", help="only the status page part")
    parser.add_argument("--library", help=argparse.SUPPRESS)
    parser.add_argument("--gbm-only", action="store_true", help="only the gradient-boosted trees part")
    parser.add_argument("--attack-only", action="store_true", help="only the under-attack part (limits and deadlines)")
    parser.add_argument("--skip-attack", action="store_true", help="leave the under-attack part out")
    parser.add_argument(
        "--parts",
        help=f"comma-separated parts to run, of {','.join(PARTS)} (default: all; dlrm,gbm is the normal traffic)",
    )
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-delay-ms", type=float, default=0.0, help="dynamic batching delay of our server")
    parser.add_argument(
        "--offload-rows",
        type=int,
        default=BatchingConfig().offload_rows,
        help="our server runs batches of at least this many rows on a worker thread",
    )
    parser.add_argument("--batch-sizes", default="1,64,1024", help="comma-separated request sizes to drive")
    args = parser.parse_args()
    if args.serve == "ours":
        return run_ours(args.path, args.state, args.port, args.max_delay_ms, args.offload_rows)
    if args.serve == "baseline":
        return run_baseline(args.path, args.port, args.rows)
    if args.serve == "naive-gbm":
        return run_naive_gbm(args.library, args.path, args.port)
    if args.serve == "status":
        return run_status_server(args.path, args.state, args.port, args.decision_log)
    if args.parts is not None:
        parts = args.parts.split(",")
        if unknown := [p for p in parts if p not in PARTS]:
            parser.error(f"--parts: unknown part(s) {','.join(unknown)}; the parts are {','.join(PARTS)}")
    elif args.gbm_only or args.status_only or args.attack_only:
        parts = ["gbm" if args.gbm_only else "status" if args.status_only else "attack"]
    else:
        parts = [p for p in PARTS if not (p == "attack" and args.skip_attack)]
    records = run_dlrm(args) if "dlrm" in parts else []
    if "tiers" in parts:
        records += tier_throughput(10_000 if args.quick else 200_000, args.quick)
    if "gbm" in parts:
        records += run_gbm(args.quick)
    if "status" in parts:
        records += run_status_page(args.quick)
    if "attack" in parts:
        records += run_attack(args.quick)
    _print_table(records)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


def run_dlrm(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The DLRM servers over HTTP (ours binary and JSON, the baseline), interleaved per request size.

    This part also runs on an older hugerec (`benchmarks/ab.py --same-script`: the same clients and baseline
    against two versions of the server), whose bundle export was called export_bundle."""
    import hugerec.serving.bundles.export as bundles

    export = getattr(bundles, "export", None) or cast(Any, bundles).export_bundle  # older checkouts only

    torch.set_num_threads(1)  # like the servers (OMP_NUM_THREADS=1): clients and servers share the cores
    rows = 5_000 if args.quick else 50_000
    seconds = 1.6 if args.quick else 8.0
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-serving-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    records: list[dict[str, Any]] = []
    try:
        model = build_model(rows)
        bundle = export(model, tmp / "bundle", name="dlrm")
        torch.save(model.state_dict(), tmp / "weights.pt")
        ours_port, base_port = free_port(), free_port()
        procs.append(
            start(
                [
                    "--serve",
                    "ours",
                    "--path",
                    str(bundle),
                    "--state",
                    str(tmp / "state"),
                    "--max-delay-ms",
                    str(args.max_delay_ms),
                    "--offload-rows",
                    str(args.offload_rows),
                ],
                ours_port,
            )
        )
        procs.append(start(["--serve", "baseline", "--path", str(tmp / "weights.pt"), "--rows", str(rows)], base_port))
        for proc, port in zip(procs, (ours_port, base_port), strict=True):
            wait_ready(proc, port)
        urls = {
            "hugerec": f"http://127.0.0.1:{ours_port}/v2/models/dlrm/infer",
            "hugerec-json": f"http://127.0.0.1:{ours_port}/v2/models/dlrm/infer",
            BASELINE: f"http://127.0.0.1:{base_port}/predict",
        }
        encoders = {"hugerec": kserve_binary, "hugerec-json": kserve_json, BASELINE: baseline_json}
        pids = {"hugerec": procs[0].pid, "hugerec-json": procs[0].pid, BASELINE: procs[1].pid}
        sizes = [int(b) for b in args.batch_sizes.split(",")]
        runs = [(b, CONCURRENCY.get(b, 8), "") for b in sizes] + ([(1, 1, " clients=1")] if 1 in sizes else [])
        for batch, clients, suffix in runs:  # clients=1: latency without queueing behind other requests
            requests = make_requests(batch, 16 if batch < 1024 else 4, rows, seed=batch)
            bodies = {method: [encode(d, i) for d, i in requests] for method, encode in encoders.items()}
            latencies: dict[str, list[float]] = {m: [] for m in encoders}
            sent = dict.fromkeys(encoders, 0)
            cpu = dict.fromkeys(encoders, 0.0)
            # the cores are shared with other work whose load changes by the second: interleave
            # short slices of every method, so that each sees the same conditions
            for _ in range(ROUNDS):
                for method in encoders:
                    cpu0 = _cpu_seconds(pids[method])
                    got, warm = asyncio.run(drive(urls[method], bodies[method], clients, seconds / ROUNDS))
                    cpu[method] += _cpu_seconds(pids[method]) - cpu0
                    latencies[method] += got
                    sent[method] += len(got) + warm
            for method in encoders:
                if not latencies[method] and method == BASELINE:  # the naive server at b=1024 on busy cores
                    print(f"b={batch}{suffix} {method}: no request finished inside the measured windows; left out")
                    continue
                if not latencies[method]:
                    raise RuntimeError(f"{method} b={batch}: no request finished inside the measured windows")
                per_request = 1000 * cpu[method] / sent[method]  # server CPU: what shared cores inflate least
                extra = {
                    "clients": clients,
                    "seconds": seconds,
                    "rows_per_table": rows,
                    "server_cpu_ms_per_request": per_request,
                }
                config = f"b={batch}{suffix}"
                throughput, p50, p99 = _http_records(records, config, method, latencies[method], batch, seconds, extra)
                print(
                    f"{config:18s} {method:13s} clients {clients:3d} {throughput:10.0f} examples/s  p50 {p50:7.2f} ms  "
                    f"p99 {p99:7.2f} ms  server CPU {per_request:6.3f} ms/request",
                    flush=True,
                )
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
    return records



# -- under attack ----------------------------------------------------------------------------------
ATTACKERS, NORMAL_CLIENTS, SLOW_CONNECTIONS = 6, 8, 200
REPO = Path(__file__).resolve().parent.parent


def run_attack(quick: bool) -> list[dict[str, Any]]:
    """The four figures of #28 (see the module docstring), each beside the load of the machine."""
    load = os.getloadavg()[0]
    records = hostile_requests(quick)
    records += pipeline_attack(quick)
    records += large_body_memory(quick)
    for r in records:
        r.setdefault("load", round(load, 1))
    return records


def hostile_requests(quick: bool) -> list[dict[str, Any]]:
    examples = 1000 if quick else 10_000
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.json"
        env = {**os.environ, "HUGEREC_FUZZ_EXAMPLES": str(examples), "HUGEREC_FUZZ_SECONDS": "3000",
               "HUGEREC_FUZZ_COUNT_ONLY": "1", "HUGEREC_FUZZ_REPORT": str(report)}
        test = "tests/serving/http/test_server_fuzz.py::test_no_generated_request_gets_a_5xx_or_a_slow_answer_or_grows_the_process"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "3600", test],
                       cwd=REPO, env=env, check=False)
        seconds = time.perf_counter() - t0
        if not report.is_file():
            raise RuntimeError("hostile requests: the fuzzing suite wrote no report")
        out = json.loads(report.read_text())
    print(f"hostile requests: {out['requests']} sent in {seconds:.0f} s, {out['5xx']} answered 5xx, slowest "
          f"{out['slowest_s']:.2f} s, RSS +{out['rss_growth_bytes'] >> 20} MiB, statuses {out['by_status']}")
    return [
        _record("hostile requests", "hugerec", out["requests"], "requests", True),
        _record("hostile requests", "hugerec-5xx", out["5xx"], "answers", False),
        _record("hostile requests", "hugerec-slowest", out["slowest_s"], "s", False),
    ]


async def _attackers(url: str, body: bytes, clients: int, until: float) -> int:
    """`clients` closed-loop connections sending `body` (a maximal legal request) until `until`: answers."""
    host, port, path = _split_url(url)
    request = _http_request(host, port, path, body, {"content-type": "application/json"})
    answered = 0

    async def one() -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < until:
                writer.write(request)
                status, payload = await _read_response(reader)
                if status != 200:
                    raise RuntimeError(f"a maximal legal request was answered {status}: {payload[:200]!r}")
                answered += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return answered


async def _slow_connections(host: str, port: int, count: int, until: float) -> int:
    """`count` connections each sending a request head a byte a second, reopened when the server cuts them."""
    cut = 0
    head = b"POST /recommend HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-slow: " + b"a" * 4000

    async def one(k: int) -> None:
        nonlocal cut
        await asyncio.sleep(k / count)  # spread over a second
        while time.perf_counter() < until:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                for byte in head:
                    if time.perf_counter() >= until or reader.at_eof():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    await asyncio.sleep(1.0)
                writer.close()
            except OSError:
                pass
            if time.perf_counter() < until:  # the server cut it before the run ended
                cut += 1

    await asyncio.gather(*(one(k) for k in range(count)))
    return cut


async def _one_by_one(url: str, bodies: list[bytes], until: float) -> list[float]:
    host, port, path = _split_url(url)
    reader, writer = await asyncio.open_connection(host, port)
    latencies, i = [], 0
    try:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            writer.write(_http_request(host, port, path, bodies[i % len(bodies)], {"content-type": "application/json"}))
            status, _ = await _read_response(reader)
            if status != 200:
                raise RuntimeError(f"a normal request was answered {status}")
            latencies.append(time.perf_counter() - t0)
            i += 1
            await asyncio.sleep(0.05)
    finally:
        writer.close()
    return latencies


def pipeline_attack(quick: bool) -> list[dict[str, Any]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pipeline as bench  # benchmarks/pipeline.py: its world and its server

    from hugerec.serving.http.limits import RequestLimits

    limits = RequestLimits()
    items, users = bench.sizes(True)  # the 50k-item world of pipeline.py --quick (the 1M one takes many minutes to build)
    seconds = 6.0 if quick else 20.0
    workdir = bench.world(items, users, False)
    proc, port = bench.start_server(bench.OURS, workdir, items, users, bench.RETRIEVE)
    url = f"http://127.0.0.1:{port}"
    rng = np.random.default_rng(3)
    normal = [(json.dumps({"user": int(u), "k": bench.K}).encode(), {"content-type": "application/json"}) for u in rng.integers(0, users, 512)]
    b, history = limits.max_users, limits.max_history
    attack = json.dumps({
        "inputs": [
            {"name": "user", "datatype": "INT64", "shape": [b], "data": rng.integers(0, users, b).tolist()},
            {"name": "history", "datatype": "INT64", "shape": [b * history], "data": rng.integers(0, items, b * history).tolist()},
            {"name": "history.lengths", "datatype": "INT64", "shape": [b], "data": [history] * b},
        ],
        "parameters": {"k": 100},  # the pipeline's max_k (Order.max_k)
    }).encode()
    records: list[dict[str, Any]] = []
    try:
        alone, _ = asyncio.run(drive(f"{url}/recommend", normal, NORMAL_CLIENTS, seconds))

        async def attacked() -> tuple[list[float], int]:
            until = time.perf_counter() + seconds + 1.0
            (latencies, _), answered = await asyncio.gather(
                drive(f"{url}/recommend", normal, NORMAL_CLIENTS, seconds),
                _attackers(f"{url}/v2/models/bench/infer", attack, ATTACKERS, until),
            )
            return latencies, answered

        under, answered = asyncio.run(attacked())
        p99_alone, p99_under = float(np.percentile(alone, 99)) * 1e3, float(np.percentile(under, 99)) * 1e3
        print(f"pipeline under attack: normal p99 {p99_alone:.1f} ms alone, {p99_under:.1f} ms while {ATTACKERS} clients sent "
              f"{answered} requests of {b} users x k 100 x {history} history ids ({len(attack) >> 10} KiB): {p99_under / p99_alone:.2f}x")
        records += [
            _record("pipeline under attack", "hugerec-normal-alone-p99", p99_alone, "ms", False),
            _record("pipeline under attack", "hugerec-normal-attacked-p99", p99_under, "ms", False),
            _record("pipeline under attack", "hugerec-p99-ratio", p99_under / p99_alone, "x", False),
            _record("pipeline under attack", "hugerec-attack-requests", answered, "requests", True),
        ]

        async def slow() -> tuple[list[float], int]:
            until = time.perf_counter() + seconds + 2.0
            bodies = [body for body, _ in normal]
            cut, latencies = await asyncio.gather(
                _slow_connections("127.0.0.1", port, SLOW_CONNECTIONS, until),
                _one_by_one(f"{url}/recommend", bodies, until),
            )
            return latencies, cut

        latencies, cut = asyncio.run(slow())
        worst = max(latencies)
        print(f"slow clients: {SLOW_CONNECTIONS} connections trickling their heads ({cut} cut by the head deadline); "
              f"a normal client's {len(latencies)} requests: p50 {np.median(latencies) * 1e3:.1f} ms, slowest {worst * 1e3:.1f} ms")
        records += [
            _record("slow clients", "hugerec-slowest", worst, "s", False),
            _record("slow clients", "hugerec-p50", float(np.median(latencies)), "s", False),
        ]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return records


def _memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in bytes."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) << 10, int(fields["VmHWM"].split()[0]) << 10


def _peak_growth(pid: int, send: Any) -> int:
    """Peak RSS growth of process `pid` while `send()` runs (its peak cleared first: /proc/pid/clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    rss0, _ = _memory(pid)
    send()
    _, peak = _memory(pid)
    return peak - rss0


def large_body_memory(quick: bool) -> list[dict[str, Any]]:
    import httpx

    from hugerec.serving.bundles.export import export
    from hugerec.serving.http.limits import RequestLimits

    limits = RequestLimits()
    rows = limits.max_request_rows
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-memory-bench-"))
    records: list[dict[str, Any]] = []
    port = free_port()
    proc = None
    try:
        bundle = export(build_model(5_000), tmp / "bundle", name="dlrm")
        proc = start(["--serve", "ours", "--path", str(bundle), "--state", str(tmp / "state")], port)
        wait_ready(proc, port)
        url = f"http://127.0.0.1:{port}/v2/models/dlrm/infer"
        (dense, ids), = make_requests(rows, 1, 5_000, seed=5)
        binary, headers = kserve_binary(dense, ids)
        json_rows = 8_000
        as_json, json_headers = kserve_json(dense[:json_rows], ids[:json_rows])
        while len(as_json) > limits.max_json_bytes:
            json_rows //= 2
            as_json, json_headers = kserve_json(dense[:json_rows], ids[:json_rows])
        with httpx.Client(timeout=600) as http:
            def post(body: bytes, h: dict[str, str]) -> None:
                r = http.post(url, content=body, headers=h)
                if r.status_code != 200:
                    raise RuntimeError(f"large body memory: {r.status_code} {r.text[:200]}")

            post(binary, headers)  # warm: the first request allocates what every later one reuses
            post(as_json, json_headers)
            cases = [("binary", binary, headers, 1), ("json", as_json, json_headers, 1)]
            if not quick:
                cases.append(("binary x4", binary, headers, 4))
            for label, body, h, n in cases:
                def send(body: bytes = body, h: dict[str, str] = h, n: int = n) -> None:
                    with ThreadPoolExecutor(n) as pool:
                        list(pool.map(lambda _: post(body, h), range(n)))

                growth = _peak_growth(proc.pid, send)
                ratio = growth / (n * len(body))
                print(f"large body memory: {label}: {n} x {len(body) / 2**20:.1f} MiB body -> peak RSS +{growth / 2**20:.1f} MiB ({ratio:.2f}x)")
                records.append(_record(f"large body memory {label}", "hugerec", ratio, "x body", False, body_bytes=len(body), bodies=n))
    finally:
        if proc is not None:
            _stop([proc])
        shutil.rmtree(tmp, ignore_errors=True)
    return records

def _print_table(records: list[dict[str, Any]]) -> None:
    print(f"\n{'config':34s} {'method':16s} {'value':>14s} {'unit':12s} {'ours/baseline':>14s}")
    baseline = {r["config"]: r["value"] for r in records if r["method"] in (BASELINE, "baseline-dict")}
    # the GBM part: hugerec-LIB against naive-LIB of the same config
    naive = {(r["config"], r["method"].removeprefix("naive-")): r["value"] for r in records if r["method"].startswith("naive-")}
    # loading: hugerec-LIB(-no-child) against in-process-LIB (the load without checks or a child process)
    naive |= {(r["config"], r["method"].removeprefix("in-process-")): r["value"] for r in records if r["method"].startswith("in-process-")}
    for r in records:
        base = baseline.get(r["config"]) or (
            baseline.get("ps lookup") if r["config"].startswith("ps lookup tier") else None
        )
        if r["config"].startswith(("gbm", "throughput gbm", "p50 gbm", "p99 gbm")):
            library = r["method"].removeprefix("hugerec-").removesuffix("-1thread").removesuffix("-no-child")
            base = naive.get((r["config"], library)) if r["method"].startswith("hugerec-") else None
        ratio = ""
        if base and r["method"] not in (BASELINE, "baseline-dict"):
            ratio = f"{(r['value'] / base) if r['higher_is_better'] else (base / r['value']):.2f}x"
        print(f"{r['config']:34s} {r['method']:26s} {r['value']:14.2f} {r['unit']:12s} {ratio:>14s}")
    print("(ratio > 1: ours better; for latencies it is baseline / ours)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
