"""Publishing a candidate to a running server: a version delta on the stable version vs a whole bundle.

    python benchmarks/publish.py [--quick] [--json PATH] [--rows-per-day N] [--vocabulary N] [--history-days H] [--repeats R]

Setup: hugerec.data.synthetic_stream (6 sparse features, 4 dense; ids churn daily). The stable model is a
DLRM (dim 16, dynamic tables of 2 x vocabulary rows each) trained one epoch on each of days 0..H-1 in turn
(H = --history-days, 3: its tables hold the ids of several days, as a model serving for a while does);
the candidate is warm-started from it and trained one epoch on day H (what the loop's iteration does). A server in this
process (HTTP on loopback) serves the stable model's bundle as version w0. Then, R times each, measured
from the two models in memory to the candidate answering as the canary:
    hugerec-delta  continuous.model_diff.write_model_delta (changed / new rows, evicted ids, default rows,
                   dense weights) + Publisher.publish_delta: the server copies w0's rows (a RocksDB
                   checkpoint), applies the delta and loads w0's program with the new dense weights
    whole-bundle   serving.export (torch.export of the dense program, every row into RocksDB) +
                   Publisher.publish: the server copies the bundle's rows into its state and loads them
`publish size`: bytes of the files handed to the server (the delta folder, the bundle folder; each record
says how many rows they hold: `rows_sent`, for the delta changed + new rows + evicted keys); `publish
time`: seconds, median of R. Both versions are checked to answer the same 2,000 rows of day H + 1 bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hugerec.continuous.loop import ModelSpec
from hugerec.continuous.model_diff import write_model_delta
from hugerec.continuous.publish import Publisher, ServerTarget
from hugerec.continuous.traffic import instances
from hugerec.data.synthetic_stream import Stream, StreamConfig
from hugerec.data.windows import table_batches
from hugerec.embedding.optimizers import Adagrad
from hugerec.models.model import RecModel
from hugerec.models.model_config import DLRMConfig
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.model_bundle import Bundle
from hugerec.serving.http.server import BackgroundServer, InferenceServer, ServerConfig
from hugerec.serving.runtime.served_model import ServedModel
from hugerec.training.trainer import TrainConfig, fit


def _record(config: str, method: str, value: float, unit: str, **extra: Any) -> dict[str, Any]:
    return {"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": False, **extra}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.relative_to(path).parts[0].startswith("state"))


def _train(model: RecModel, stream: Stream, day: int, batch: int) -> RecModel:
    config = TrainConfig(epochs=1, lr=3e-3, progress=False, tensorboard=False, plot=False, device="cpu", pipeline=False, seed=day)
    fit(model.train(), table_batches(stream.day(day).table, stream.config.schema, batch, shuffle=True, seed=day), config=config)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50k rows a day, vocabulary 50k, 1 repeat")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--rows-per-day", type=int, default=None)
    ap.add_argument("--vocabulary", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--history-days", type=int, default=3)
    args = ap.parse_args()
    rows = args.rows_per_day or (50_000 if args.quick else 500_000)
    vocabulary = args.vocabulary or (50_000 if args.quick else 500_000)
    repeats = args.repeats or (1 if args.quick else 3)
    history = args.history_days
    if history < 1:
        raise SystemExit(f"--history-days must be >= 1, got {history}")
    stream = Stream(StreamConfig(days=history + 2, rows_per_day=rows, num_sparse=6, num_dense=4, vocabulary=vocabulary, seed=0))
    schema = stream.config.schema
    spec = ModelSpec(DLRMConfig(bottom=(64, 16), top=(64, 1)), dim=16, optimizer=Adagrad(lr=0.05), capacity=2 * vocabulary)
    t0 = time.perf_counter()
    stable = spec.build(schema, 0)
    for day in range(history):
        stable = _train(stable, stream, day, 1024)
    candidate = spec.build(schema, 0)
    candidate.load_state_dict(stable.state_dict())
    candidate = _train(candidate, stream, history, 1024)
    print(f"trained stable ({history} days) and candidate on {rows:,} rows a day in {time.perf_counter() - t0:.1f} s")
    probe = instances(stream.day(history + 1).table.slice(0, 2000), schema)
    token = secrets.token_hex(16)
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = InferenceServer(ServerConfig(admin_token=token))
        with BackgroundServer(server) as url:
            publisher = Publisher(ServerTarget(url, "model", token))
            base = export(stable, work / "w0", version="w0", schema=schema)
            publisher.publish(base, "w0", 0.1)
            base_id = Bundle.open(base, verify=False).id
            times: dict[str, list[float]] = {"hugerec-delta": [], "whole-bundle": []}
            sizes: dict[str, int] = {}
            rows_sent: dict[str, int] = {}  # rows (and evicted keys) in the files handed over
            answers: dict[str, np.ndarray] = {}
            for rep in range(repeats):
                for method in ("hugerec-delta", "whole-bundle"):
                    version = f"{'d' if method == 'hugerec-delta' else 'b'}{rep}"
                    start = time.perf_counter()
                    if method == "hugerec-delta":
                        path = write_model_delta(stable, candidate, work / version, "w0", base_id)
                        publisher.publish_delta(path, "w0", version, 0.1)
                    else:
                        path = export(candidate, work / version, version=version, schema=schema)
                        publisher.publish(path, version, 0.1)
                    times[method].append(time.perf_counter() - start)
                    sizes[method] = _size(path)
                    manifest = json.loads((path / "manifest.json").read_text())
                    rows_sent[method] = (
                        sum(t["rows"] + t["deleted"] for t in manifest["tables"].values())
                        if method == "hugerec-delta"
                        else sum(manifest["info"]["rows"].values())
                    )
                    served = server.model_versions("model").get(version)
                    assert isinstance(served, ServedModel)  # an exported ranking model
                    answers[method] = served.model.predict(served.preprocess(probe))
                    publisher.rollback(version)
                    server.unload("model", version)
            same = bool(np.array_equal(answers["hugerec-delta"], answers["whole-bundle"]))
        server.close()
    load = os.getloadavg()[0]
    for method in ("hugerec-delta", "whole-bundle"):
        records.append(_record("publish size", method, float(sizes[method]), "bytes", rows_per_day=rows, vocabulary=vocabulary, history_days=history, rows_sent=rows_sent[method]))
        records.append(
            _record("publish time", method, statistics.median(times[method]), "s", rows_per_day=rows, repeats=repeats, load=load)
        )
    for r in records:
        print(f"{r['config']:14s} {r['method']:14s} {r['value']:>14,.3f} {r['unit']}")
    print(
        f"delta / whole bundle: size {sizes['hugerec-delta'] / sizes['whole-bundle']:.3f}, time "
        f"{statistics.median(times['hugerec-delta']) / statistics.median(times['whole-bundle']):.3f}; rows sent "
        f"{rows_sent['hugerec-delta']:,} (changed, new, evicted) of {rows_sent['whole-bundle']:,}; "
        f"same answers: {same}; load {load:.2f}"
    )
    if not same:
        raise SystemExit("the delta canary and the whole bundle answer differently")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
