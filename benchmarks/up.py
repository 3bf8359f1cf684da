"""`hugerec up`: seconds from the command to the first answered /recommend, and the served pipeline's hit rate.

    python benchmarks/up.py [--quick] [--json PATH] [--world-users U] [--world-items I]

Every side is a fresh `python -m hugerec ...` process (imports included), in a fresh folder; the clock
starts when the first command is started and stops when POST /recommend {"user": <a known user>, "k": 10}
first answers 200 (polled every 0.25 s from this process; nothing else runs meanwhile).

    world  hugerec-up          `hugerec up` with no argument: the synthetic interaction world generated
                               and written as a log, its columns read, the two-tower trained, the ranker
                               trained on labelled rows (interactions + sampled negatives), the pipeline
                               (retrieve -> rank) built, hit rates@20 computed, served. Its printed hit
                               rates are recorded as hugerec-up-pipeline (retrieve -> rank, served),
                               hugerec-up-retrieval (the same run's retrieval stage alone: the pipeline
                               without [score]) and oracle (the generator's true logits)
           hugerec-up-no-ranker  `hugerec up --no-ranker`: the same world without the ranking stage
                               (today's retrieval-only pipeline), for its time to the first answer
    log    hugerec-up          `hugerec up events.csv --no-ranker` on the log the world run wrote
           separate-commands   the same steps as the commands a user runs by hand, one process each, on
                               the configs `up` wrote (paths moved to their own folder): `hugerec schema
                               events.csv`, `hugerec train retriever.toml`, `hugerec pipeline build
                               pipeline.toml`, `hugerec serve pipeline` (the time to edit the schema into
                               a config by hand is not counted; the ranker's labelled rows come from no
                               command, hence --no-ranker on this side)

--quick: a 300 x 200 world, one epoch (train.epochs=1 and ranker.epochs=1 on every side). The default:
the world `hugerec up` uses (2,000 users x 500 items) and the epochs it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _record(config: str, method: str, value: float, unit: str, higher_is_better: bool = False) -> dict[str, Any]:
    return {"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": higher_is_better}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hugerec(*words: str) -> list[str]:
    return [sys.executable, "-m", "hugerec", *words]


def _answered(port: int, user: int) -> bool:
    body = json.dumps({"user": user, "k": 10}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/recommend", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status == 200 and len(json.loads(r.read())["items"]) == 10
    except (urllib.error.URLError, ConnectionError):
        return False


def _until_answered(server: subprocess.Popen[bytes], port: int, user: int, t0: float, log: Path, timeout: float = 3600) -> float:
    """Seconds since t0 until /recommend answers; the server is then stopped with Ctrl-C."""
    try:
        while not _answered(port, user):
            if server.poll() is not None:
                raise RuntimeError(f"the server ended with status {server.returncode} before answering:\n{log.read_text()[-3000:]}")
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"no answer within {timeout} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        return time.perf_counter() - t0
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=120)


def run_up(folder: Path, words: list[str], user: int) -> tuple[float, str]:
    """`hugerec up WORDS --out folder/out` from folder: (seconds to the first answer, its output)."""
    folder.mkdir(parents=True)
    port, log = _free_port(), folder / "up.log"
    with log.open("wb") as out:
        t0 = time.perf_counter()
        server = subprocess.Popen(_hugerec("up", *words, "--out", "out", "--port", str(port)), cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=ENV)
        seconds = _until_answered(server, port, user, t0, log)
    return seconds, log.read_text()


def run_separate(folder: Path, up_out: Path, log_file: Path, overrides: list[str], user: int) -> float:
    """schema, train, pipeline build, serve as separate commands on `up`'s configs moved to folder."""
    folder.mkdir(parents=True)
    for name in ("retriever.toml", "pipeline.toml"):
        text = (up_out / name).read_text().replace(str(up_out.resolve()), str(folder.resolve()))
        (folder / name).write_text(text)
    port, log = _free_port(), folder / "commands.log"
    with log.open("wb") as out:
        t0 = time.perf_counter()
        for words in (
            ("schema", str(log_file), "--out", "schema.toml"),
            ("train", "retriever.toml", *overrides),
            ("pipeline", "build", "pipeline.toml"),
        ):
            subprocess.run(_hugerec(*words), cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=ENV, check=True)
        server = subprocess.Popen(_hugerec("serve", "pipeline", "--port", str(port)), cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=ENV)
        return _until_answered(server, port, user, t0, log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 300 x 200 world, one epoch")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--world-users", type=int, help="users of the synthetic world (default: hugerec up's)")
    ap.add_argument("--world-items", type=int, help="items of the synthetic world (default: hugerec up's)")
    args = ap.parse_args()
    users, items = args.world_users or (300 if args.quick else None), args.world_items or (200 if args.quick else None)
    world = [*(["--world-users", str(users)] if users else []), *(["--world-items", str(items)] if items else [])]
    overrides = ["train.epochs=1", "ranker.epochs=1"] if args.quick else []
    records = []
    with tempfile.TemporaryDirectory(prefix="hugerec-up-bench-") as tmp:
        root = Path(tmp)
        seconds, printed = run_up(root / "world", [*world, *overrides], user=0)
        m = re.search(r"(\d[\d,]*) users x (\d[\d,]*) items", printed)
        hits = re.search(r"hit rate@20 .*: pipeline ([0-9.]+), oracle ([0-9.]+).*retrieval alone ([0-9.]+)", printed)
        ranker = re.search(r"ranker dcn_v2 .*\(([0-9.]+) s\)", printed)
        assert m is not None and hits is not None and ranker is not None, printed
        config = f"world {m.group(1)} users x {m.group(2)} items"
        pipeline, oracle, alone = float(hits.group(1)), float(hits.group(2)), float(hits.group(3))
        plain, _ = run_up(root / "world-no-ranker", [*world, *overrides, "--no-ranker"], user=0)
        print(f"{config}: hugerec up (no argument) answered /recommend after {seconds:.1f} s (the ranker's stage {float(ranker.group(1)):.1f} s); "
              f"with --no-ranker after {plain:.1f} s -> {seconds / plain:.2f}x", flush=True)
        print(f"{config}: hit rate@20 retrieve -> rank {pipeline:.4f} ({pipeline / oracle:.3f}x the oracle), retrieval alone {alone:.4f} "
              f"({alone / oracle:.3f}x), oracle {oracle:.4f}; ranked / retrieval alone {pipeline / alone:.3f}x", flush=True)
        records += [
            _record(config, "hugerec-up", seconds, "s to the first answered /recommend"),
            _record(config, "hugerec-up-no-ranker", plain, "s to the first answered /recommend"),
            _record(config, "hugerec-up-pipeline", pipeline, "hit rate@20", True),
            _record(config, "hugerec-up-retrieval", alone, "hit rate@20", True),
            _record(config, "oracle", oracle, "hit rate@20", True),
        ]
        log_file = root / "world" / "out" / "events.csv"
        log_config = f"log of {config}"
        ours, printed = run_up(root / "log", [str(log_file), *overrides, "--no-ranker"], user=0)
        theirs = run_separate(root / "commands", root / "log" / "out", log_file, [o for o in overrides if not o.startswith("ranker.")], user=0)
        print(f"{log_config}: hugerec up {ours:.1f} s, separate commands {theirs:.1f} s to the first answered /recommend "
              f"-> {theirs / ours:.2f}x (separate / up)", flush=True)
        records += [
            _record(log_config, "hugerec-up", ours, "s to the first answered /recommend"),
            _record(log_config, "separate-commands", theirs, "s to the first answered /recommend"),
        ]
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
