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

    python benchmarks/serving.py [--quick] [--json PATH]
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
from pathlib import Path
from typing import Any

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
    from hugerec.serving.batching import BatchingConfig
    from hugerec.serving.bundle_loader import ServeOptions
    from hugerec.serving.server import InferenceServer, ServerConfig

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
            raise RuntimeError(f"server {proc.args} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server {proc.args} did not become ready")


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
    from hugerec.serving.cache import CacheConfig, RowCache
    from hugerec.serving.memory_store import MemoryStore
    from hugerec.serving.parameter_server import ParameterServer, TableSpec
    from hugerec.serving.persistent import PersistentStore

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
            from hugerec.serving.redis_store import RedisStore

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
    from hugerec.serving.batching import BatchingConfig

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small tables and short runs (< 1 minute)")
    parser.add_argument("--json", type=Path, help="write the records to this JSON file")
    parser.add_argument("--serve", choices=["ours", "baseline"], help=argparse.SUPPRESS)
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

    from hugerec.serving.export import export_bundle

    torch.set_num_threads(1)  # like the servers (OMP_NUM_THREADS=1): clients and servers share the cores
    rows = 5_000 if args.quick else 50_000
    seconds = 1.6 if args.quick else 8.0
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-serving-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    records: list[dict[str, Any]] = []
    try:
        model = build_model(rows)
        bundle = export_bundle(model, tmp / "bundle", name="dlrm")
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
                if not latencies[method]:
                    raise RuntimeError(f"{method} b={batch}: no request finished inside the measured windows")
                lat = np.array(latencies[method]) * 1000
                throughput = lat.shape[0] * batch / seconds
                p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
                per_request = 1000 * cpu[method] / sent[method]  # server CPU: what shared cores inflate least
                extra = {
                    "clients": clients,
                    "seconds": seconds,
                    "rows_per_table": rows,
                    "server_cpu_ms_per_request": per_request,
                }
                config = f"b={batch}{suffix}"
                records.append(_record(f"throughput {config}", method, throughput, "examples/s", True, **extra))
                records.append(_record(f"p50 {config}", method, p50, "ms", False, **extra))
                records.append(_record(f"p99 {config}", method, p99, "ms", False, **extra))
                print(
                    f"{config:18s} {method:13s} clients {clients:3d} {throughput:10.0f} examples/s  p50 {p50:7.2f} ms  "
                    f"p99 {p99:7.2f} ms  server CPU {per_request:6.3f} ms/request",
                    flush=True,
                )
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    records += tier_throughput(10_000 if args.quick else 200_000, args.quick)
    _print_table(records)
    if args.json is not None:
        args.json.write_text(json.dumps(records, indent=2))


def _print_table(records: list[dict[str, Any]]) -> None:
    print(f"\n{'config':34s} {'method':16s} {'value':>14s} {'unit':12s} {'ours/baseline':>14s}")
    baseline = {r["config"]: r["value"] for r in records if r["method"] in (BASELINE, "baseline-dict")}
    for r in records:
        base = baseline.get(r["config"]) or (
            baseline.get("ps lookup") if r["config"].startswith("ps lookup tier") else None
        )
        ratio = ""
        if base and r["method"] not in (BASELINE, "baseline-dict"):
            ratio = f"{(r['value'] / base) if r['higher_is_better'] else (base / r['value']):.2f}x"
        print(f"{r['config']:34s} {r['method']:16s} {r['value']:14.2f} {r['unit']:12s} {ratio:>14s}")
    print("(ratio > 1: ours better; for latencies it is baseline / ours)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
