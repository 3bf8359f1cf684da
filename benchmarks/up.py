"""`hugerec up`: seconds from the command to the first answered /recommend, the served pipeline's hit rate,
and the ranker's settings chosen on a validation split.

    python benchmarks/up.py [--quick] [--json PATH] [--world-users U] [--world-items I]

Every timed side is a fresh `python -m hugerec ...` process (imports included), in a fresh folder; the
clock starts when the first command is started and stops when POST /recommend {"user": <a known user>,
"k": 10} first answers 200 (polled every 0.25 s from this process; nothing else runs meanwhile).

    validation  the choice, made before the test split is read: the world `hugerec up` generates, less
                each user's last event (the test split), as a log; `up`'s steps on it in this process
                (the world's two-tower settings and epochs, the held-out event now each user's last
                training event), then each ranker variant of VARIANTS trained on that retriever
                (`up --ranker`'s stage with those ranker.KEY=VALUE settings) and the retrieval stage
                alone; hit rate@20 of each pipeline on the validation events (hugerec-up-retrieval,
                hugerec-up-ranker-<variant>) and the oracle's. The variant with the best validation hit
                rate is the one the `--ranker` side below runs with.
    world       hugerec-up          `hugerec up` with no argument: the synthetic interaction world
                                    generated and written as a log, its columns read, the two-tower
                                    trained; no ranker (ranker.enabled = "auto" and the log has no label
                                    column), the pipeline built, its hit rate@20 on each user's last
                                    event (the test split, read once here) and the oracle's (the
                                    generator's true logits), served
                hugerec-up-ranker   `hugerec up --ranker <the validation's chosen variant>`: the same
                                    world with the ranking stage (retrieve -> rank); its printed hit
                                    rates on the test split: the ranked pipeline (hugerec-up-ranker), the
                                    same run's retrieval stage alone (hugerec-up-retrieval)
    log         hugerec-up          `hugerec up events.csv` on the log the world run wrote (no ranker)
                separate-commands   the same steps as the commands a user runs by hand, one process each,
                                    on the configs `up` wrote (paths moved to their own folder): `hugerec
                                    schema events.csv`, `hugerec train retriever.toml`, `hugerec pipeline
                                    build pipeline.toml`, `hugerec serve pipeline` (the time to edit the
                                    schema into a config by hand is not counted)

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
# The ranker variants compared on the validation split: name -> up.toml [ranker] overrides (the defaults otherwise)
VARIANTS = {
    "ids-vectors-all": [],  # ids + the retriever's vectors, every training interaction a positive (the defaults)
    "ids-all": ["ranker.vectors=false"],  # the ids alone
    "ids-vectors-held-out": ["ranker.positives=held_out"],  # only the interactions the retriever held out
}


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


def select_on_validation(folder: Path, users: int | None, items: int | None, overrides: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The validation stage (the docstring's): the best ranker variant's name, and the records."""
    import dataclasses

    import numpy as np
    import polars as pl

    from hugerec.cli.pipeline_commands import build
    from hugerec.cli.run_config import load_run_config
    from hugerec.cli.task_commands import train_retrieval
    from hugerec.cli.up_command import (
        WORLD_TOWERS,
        RankerFiles,
        World,
        hit_rates,
        make_world,
        pipeline_toml,
        retriever_toml,
        world_spec,
    )
    from hugerec.cli.up_ranker import build_ranker, read_up_toml
    from hugerec.data.interactions import Interactions
    from hugerec.training.model_file import load_model

    world = World(users or World.users, items or World.items)
    synth = make_world(world, folder / "world.csv")
    frame = synth.data.frame.sort(["user", "timestamp"])
    users_ = frame["user"].to_numpy()
    last = pl.Series(np.r_[users_[1:] != users_[:-1], True])  # each user's last event: the test split, left out here
    kept = frame.filter(~last)
    valid = dataclasses.replace(synth, data=Interactions(kept, synth.data.num_users, synth.data.num_items))
    log = folder / "events.csv"
    kept.select("user", "item", "timestamp").write_csv(log)
    out = folder / "out"
    out.mkdir()
    config = out / "retriever.toml"
    config.write_text(retriever_toml(world_spec(), str(log.resolve()), out, " (validation: the world less its test events)", WORLD_TOWERS))
    cfg = load_run_config(config, [o for o in overrides if not o.startswith("ranker.")])
    train_retrieval(cfg)
    model = cfg.out_dir / "model.pt"
    num_items = len(load_model(model).items_raw)
    alone = out / "pipeline-retrieval.toml"
    alone.write_text(pipeline_toml(alone, model, out / "pipeline-retrieval", num_items))
    bundles = {"retrieval": build(str(alone), None)[0]}
    stage_s = {}
    for name, settings in VARIANTS.items():
        t0 = time.perf_counter()
        section = read_up_toml(None, [*[o for o in overrides if o.startswith("ranker.")], *settings, "ranker.enabled=true"])
        where = out / name
        where.mkdir()
        r = build_ranker(cfg, model, where, section, None)
        path = where / "pipeline.toml"
        path.write_text(pipeline_toml(path, model, where / "pipeline", num_items, RankerFiles(r.bundle, r.users, r.items, r.dense)))
        bundles[name] = build(str(path), None)[0]
        stage_s[name] = time.perf_counter() - t0
    rates = hit_rates(valid, bundles)
    config_name = f"validation: world {world.users:,} users x {world.items:,} items less each user's last event"
    records = [_record(config_name, "hugerec-up-retrieval", rates["retrieval"], "hit rate@20", True)]
    records += [_record(config_name, f"hugerec-up-ranker-{n}", rates[n], "hit rate@20", True) for n in VARIANTS]
    records.append(_record(config_name, "oracle", rates["oracle"], "hit rate@20", True))
    chosen = max(VARIANTS, key=lambda n: rates[n])
    for n in ("retrieval", *VARIANTS):
        extra = "" if n == "retrieval" else f" (the ranker's stage {stage_s[n]:.1f} s)"
        print(f"{config_name}: hit rate@20 {n} {rates[n]:.4f} = {rates[n] / rates['oracle']:.3f}x the oracle's {rates['oracle']:.4f}{extra}", flush=True)
    best = "retrieval alone" if rates["retrieval"] >= rates[chosen] else f"ranker {chosen}"
    print(f"{config_name}: the best ranker variant is {chosen} (the --ranker side runs with it); the best pipeline is {best}", flush=True)
    return chosen, records


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
        chosen, found = select_on_validation(root / "validation", users, items, overrides)
        records += found
        # the test split, read once: the default (no ranker on this implicit log), then --ranker with the chosen variant
        seconds, printed = run_up(root / "world", [*world, *overrides], user=0)
        m = re.search(r"(\d[\d,]*) users x (\d[\d,]*) items", printed)
        hits = re.search(r"hit rate@20 .*: pipeline ([0-9.]+), oracle ([0-9.]+)", printed)
        assert m is not None and hits is not None and "[3/5] no ranker: the log has no label column" in printed, printed
        config = f"world {m.group(1)} users x {m.group(2)} items"
        default, oracle = float(hits.group(1)), float(hits.group(2))
        ranked_s, printed = run_up(root / "world-ranker", [*world, *overrides, "--ranker", *VARIANTS[chosen]], user=0)
        hits = re.search(r"hit rate@20 .*: pipeline ([0-9.]+), oracle ([0-9.]+).*retrieval alone ([0-9.]+)", printed)
        ranker = re.search(r"ranker dcn_v2 .*\(([0-9.]+) s\)", printed)
        assert hits is not None and ranker is not None, printed
        ranked, alone = float(hits.group(1)), float(hits.group(3))
        print(f"{config}: hugerec up (no argument) answered /recommend after {seconds:.1f} s; with --ranker ({chosen}) after {ranked_s:.1f} s "
              f"(the ranker's stage {float(ranker.group(1)):.1f} s) -> {ranked_s / seconds:.2f}x", flush=True)
        print(f"{config}: hit rate@20 on the test split: hugerec up {default:.4f} ({default / oracle:.3f}x the oracle), --ranker {ranked:.4f} "
              f"({ranked / oracle:.3f}x; its retrieval stage alone {alone:.4f}), oracle {oracle:.4f}", flush=True)
        records += [
            _record(config, "hugerec-up", seconds, "s to the first answered /recommend"),
            _record(config, "hugerec-up-ranker", ranked_s, "s to the first answered /recommend"),
            _record(config, "hugerec-up", default, "hit rate@20", True),
            _record(config, "hugerec-up-ranker", ranked, "hit rate@20", True),
            _record(config, "hugerec-up-retrieval", alone, "hit rate@20", True),
            _record(config, "oracle", oracle, "hit rate@20", True),
        ]
        log_file = root / "world" / "out" / "events.csv"
        log_config = f"log of {config}"
        ours, printed = run_up(root / "log", [str(log_file), *overrides], user=0)
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
