"""Our DLRM server from two checkouts side by side, driven in alternating short slices: server CPU per request.

`ab.py` runs a whole benchmark script in one checkout, then in the other: on cores shared with other work, the
two sides see different minutes of load (the CPU a request costs moves 20-30% with the load here), which is
larger than the differences this is meant to find. This script starts both servers at once (the same bundle,
the same `serving.py --serve ours` arguments, each side's hugerec on its PYTHONPATH) and alternates 0.4 s
slices between them (old, new / new, old ...), each slice opening 16 fresh keep-alive connections as
`serving.py` does, so that both sides see the same seconds of load.

    git worktree add ../old <commit>
    python benchmarks/serving_ab.py --old ../old --quick --json ab.json

Per config (b=1, b=64 with 16 clients, b=1024 with 4, b=1 with one client; binary and JSON bodies): each side's
server CPU per request over all its slices (/proc: user + system), throughput, and the requests merged per
model call (the server's hugerec_batch_* metrics); the ratio old / new of the CPU (above 1: the new code costs
less) and the range of the per-round ratios. Records: method `hugerec` / `hugerec-json` for this checkout, the
same prefixed with `old-` for the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import _cpu_seconds, drive, free_port, kserve_binary, kserve_json, make_requests, wait_ready

REPO = Path(__file__).resolve().parent.parent
SERVING = Path(__file__).resolve().parent / "serving.py"
RUNS = [(1, 16, ""), (64, 16, ""), (1024, 4, ""), (1, 1, " clients=1")]  # batch, clients, config suffix
ENCODERS = {"hugerec": kserve_binary, "hugerec-json": kserve_json}
_BATCH_METRIC = re.compile(r"hugerec_batch_(rows|requests)_(sum|count)\{.*\} ([0-9.e+]+)")


def export_bundle(out: str, rows: int) -> None:
    """Write the quick DLRM bundle with whichever hugerec this interpreter imports (the old side's: both read it)."""
    from serving import build_model

    import hugerec.serving.bundles.export as bundles

    export = getattr(bundles, "export", None) or cast(Any, bundles).export_bundle  # older checkouts: export_bundle
    export(build_model(rows), out, name="dlrm")


def batch_metrics(port: int) -> tuple[float, float]:
    """(model calls, requests merged into them) so far, from the server's Prometheus metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    got: dict[str, float] = {}
    for line in text.splitlines():
        m = _BATCH_METRIC.match(line)
        if m:
            key = f"{m[1]}_{m[2]}"
            got[key] = got.get(key, 0.0) + float(m[3])
    return got.get("rows_count", 0.0), got.get("requests_sum", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, help="the other checkout (the A side)")
    parser.add_argument("--old-python", default=sys.executable, help="its interpreter (default: this one)")
    parser.add_argument("--new", type=Path, default=REPO, help="the B side's checkout (default: this one)")
    parser.add_argument("--quick", action="store_true", help="8 rounds of 0.4 s slices per config (else 24)")
    parser.add_argument("--rounds", type=int, help="rounds per config (each: one slice per side and method)")
    parser.add_argument("--slice", type=float, default=0.4, help="seconds of one slice (default 0.4, as serving.py)")
    parser.add_argument("--json", type=Path, help="write the records to this JSON file")
    parser.add_argument("--export", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = 5_000
    if args.export:
        return export_bundle(args.export, rows)
    if args.old is None:
        parser.error("--old is required")
    rounds = args.rounds or (8 if args.quick else 24)
    sides = {"old": (args.old_python, args.old.resolve()), "new": (sys.executable, args.new.resolve())}
    tmp = Path(tempfile.mkdtemp(prefix="hugerec-serving-ab-"))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ports: dict[str, int] = {}
    try:
        env_old = {**os.environ, "PYTHONPATH": str(sides["old"][1]), "OMP_NUM_THREADS": "1"}
        subprocess.run([args.old_python, __file__, "--export", str(tmp / "bundle")], env=env_old, check=True, cwd=tmp)
        for side, (python, checkout) in sides.items():
            ports[side] = free_port()
            env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
            cmd = [python, str(SERVING), "--serve", "ours", "--path", str(tmp / "bundle"), "--state", str(tmp / f"state-{side}")]
            procs[side] = subprocess.Popen([*cmd, "--port", str(ports[side])], env=env, cwd=tmp)
        for side in sides:
            wait_ready(procs[side], ports[side])
        records = run(procs, ports, rounds, args.slice)
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


def run(procs: dict[str, subprocess.Popen[bytes]], ports: dict[str, int], rounds: int, slice_s: float) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    print(f"{'config':24s} {'method':13s} {'CPU ms/request old':>18s} {'new':>7s} {'old/new':>8s} {'rounds':>11s}  "
          f"{'req/call old':>12s} {'new':>5s}  {'examples/s old':>14s} {'new':>8s}  load")
    for batch, clients, suffix in RUNS:
        requests = make_requests(batch, 16 if batch < 1024 else 4, 5_000, seed=batch)
        for method, encode in ENCODERS.items():
            bodies = [encode(d, i) for d, i in requests]
            urls = {side: f"http://127.0.0.1:{port}/v2/models/dlrm/infer" for side, port in ports.items()}
            for side in procs:  # warm-up: the first requests of a size compile and allocate
                asyncio.run(drive(urls[side], bodies, clients, slice_s))
            cpu = {side: [0.0] * rounds for side in procs}
            sent = {side: [0] * rounds for side in procs}
            calls = {side: [0.0, 0.0] for side in procs}
            loads = []
            for r in range(rounds):
                loads.append(os.getloadavg()[0])
                for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    c0, (k0, q0) = _cpu_seconds(procs[side].pid), batch_metrics(ports[side])
                    got, warm = asyncio.run(drive(urls[side], bodies, clients, slice_s))
                    c1, (k1, q1) = _cpu_seconds(procs[side].pid), batch_metrics(ports[side])
                    cpu[side][r], sent[side][r] = c1 - c0, len(got) + warm
                    calls[side][0] += k1 - k0
                    calls[side][1] += q1 - q0
            config = f"b={batch}{suffix}"
            per = {side: 1000 * sum(cpu[side]) / sum(sent[side]) for side in procs}
            per_round = [
                (cpu["old"][r] / sent["old"][r]) / (cpu["new"][r] / sent["new"][r])
                for r in range(rounds)
                if cpu["new"][r] > 0 and sent["old"][r] and sent["new"][r]
            ]
            merged = {side: calls[side][1] / max(calls[side][0], 1.0) for side in procs}
            rate = {side: batch * sum(sent[side]) / (rounds * (slice_s + min(0.3, slice_s / 4))) for side in procs}
            for side in procs:
                name = method if side == "new" else f"old-{method}"
                extra = {"clients": clients, "rounds": rounds, "slice_s": slice_s, "requests_per_model_call": merged[side],
                         "examples_per_s": rate[side], "load": [min(loads), max(loads)]}
                records.append({"config": f"server cpu {config}", "method": name, "value": per[side], "unit": "ms/request",
                                "higher_is_better": False, **extra})
            ratio = per["old"] / per["new"]
            records[-1]["ratio"] = ratio
            lo, hi = (min(per_round), max(per_round)) if per_round else (float("nan"), float("nan"))
            print(f"{config:24s} {method:13s} {per['old']:18.3f} {per['new']:7.3f} {ratio:7.2f}x {lo:5.2f}-{hi:4.2f}  "
                  f"{merged['old']:12.2f} {merged['new']:5.2f}  {rate['old']:14.0f} {rate['new']:8.0f}  "
                  f"{min(loads):.1f}-{max(loads):.1f}", flush=True)
    return records


if __name__ == "__main__":
    main()
