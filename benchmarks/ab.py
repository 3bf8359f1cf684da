"""A/B of two checkouts on one benchmark script, interleaved: is the code of this checkout slower than another's?

Runs a benchmark script (a path relative to the checkout, with its arguments) several rounds in each checkout,
with that checkout's script and hugerec, alternating (old, new / new, old / ...) so that both sides see the
same drift of a shared machine's load. `--old-args` gives the old side other arguments where its script
lacks a newer option; `--same-script` runs this checkout's script on both sides (only the package differs)
where the old package has the APIs it calls. A baseline's ratio (the script's own naive server, the same
code on both sides) shows the noise of the run. Each side's interpreter must import hugerec from its
checkout; the harness checks this before it starts.

    git worktree add ../old <commit>      # and a venv there whose hugerec is that checkout
    python benchmarks/ab.py --old ../old --old-args=--quick -- benchmarks/serving.py --quick --parts dlrm,tiers,gbm

Per (config, method) of the script's --json records: the median of each side, the ratio of the medians
(new / old when higher is better, old / new for latencies: above 1 the new code is better) and the range of
the per-round ratios (round i of the old side against round i of the new), and the 1-minute load before
every run. `--json PATH` writes a record per (config, method) for the new side (the script's method name,
with `ratio`, `ratio_min`, `ratio_max`) and one for the old side (the method prefixed with `old-`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def package_root(python: str, checkout: Path) -> Path:
    """Where `python` with PYTHONPATH=checkout imports hugerec from (exits unless it is that checkout)."""
    out = subprocess.run(
        [python, "-c", "import hugerec, pathlib; print(pathlib.Path(hugerec.__file__).resolve().parent.parent)"],
        env={**os.environ, "PYTHONPATH": str(checkout)},
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    )
    root = Path(out.stdout.strip()) if out.returncode == 0 else None
    if root != checkout.resolve():
        sys.exit(f"{python} imports hugerec from {root or out.stderr.strip()!r}, not from {checkout}")
    return root


def run_side(python: str, checkout: Path, script: Path, args: list[str]) -> tuple[list[dict[str, Any]], float]:
    """One run of `script` with this side's hugerec -> (its records, the 1-minute load before it)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="hugerec-ab-") as tmp:
        out = Path(tmp) / "records.json"
        cmd = [python, str(script), *args, "--json", str(out)]
        subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(checkout)}, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text()), load


def _better(new: float, old: float, higher: bool) -> float:
    """How much better the new value is (> 1: better): new / old when higher is better, else old / new."""
    return (new / old if higher else old / new) if new > 0 and old > 0 else float("nan")


def summarise(runs: dict[str, list[list[dict[str, Any]]]], fields: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Per (config, method) present in every run: medians, ratio of medians and the per-round ratio range.
    Each of `fields` that a record carries (a number beside its value, lower is better: the server's CPU per
    request) is summarised as one more config, "<config> <field>", taken once per (config, method)."""
    values: dict[str, dict[tuple[str, str], list[float]]] = {"old": {}, "new": {}}
    meta: dict[tuple[str, str], dict[str, Any]] = {}
    for side, side_runs in runs.items():
        for records in side_runs:
            seen: set[tuple[str, str]] = set()
            for r in records:
                key = (r["config"], r["method"])
                values[side].setdefault(key, []).append(float(r["value"]))
                meta[key] = r
                for name in fields:
                    base = (" ".join(r["config"].split(" ")[1:]) or r["config"], r["method"])
                    if isinstance(r.get(name), int | float) and base not in seen:
                        seen.add(base)
                        extra = (f"{base[0]} {name}", r["method"])
                        values[side].setdefault(extra, []).append(float(r[name]))
                        meta[extra] = {"unit": name, "higher_is_better": False}
    rounds = len(runs["new"])
    rows = []
    for key, new in values["new"].items():
        old = values["old"].get(key, [])
        if len(new) != rounds or len(old) != rounds:
            continue  # a record that some run did not write (e.g. a part skipped): no pairs to compare
        higher = bool(meta[key]["higher_is_better"])
        paired = [_better(n, o, higher) for n, o in zip(new, old, strict=True)]
        m_new, m_old = statistics.median(new), statistics.median(old)
        rows.append(
            {
                "config": key[0],
                "method": key[1],
                "unit": meta[key]["unit"],
                "higher_is_better": higher,
                "old": m_old,
                "new": m_new,
                "ratio": _better(m_new, m_old, higher),
                "ratio_min": min(paired),
                "ratio_max": max(paired),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the other checkout (the A side)")
    parser.add_argument("--old-python", help="its interpreter (default: OLD/.venv/bin/python)")
    parser.add_argument("--new-python", default=sys.executable, help="this checkout's interpreter (default: this one)")
    parser.add_argument("--old-args", help="the old side's script arguments, if not the same (one string)")
    parser.add_argument("--same-script", action="store_true", help="run this checkout's script on both sides")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each side, interleaved")
    parser.add_argument("--json", type=Path, help="write the summary records to this JSON file")
    parser.add_argument(
        "--field",
        action="append",
        default=[],
        help="a numeric field of the records to compare too, lower is better (e.g. server_cpu_ms_per_request)",
    )
    parser.add_argument(
        "script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS]: a path in this checkout and its arguments"
    )
    args = parser.parse_args()
    script = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not script:
        parser.error("no script given (-- benchmarks/serving.py --quick ...)")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    old_python = args.old_python or str(args.old / ".venv" / "bin" / "python")
    old = args.old.resolve()
    old_args = shlex.split(args.old_args) if args.old_args is not None else script[1:]
    sides = {
        "old": (old_python, old, (REPO if args.same_script else old) / script[0], old_args),
        "new": (args.new_python, REPO, REPO / script[0], script[1:]),
    }
    for python, checkout, path, _ in sides.values():
        package_root(python, checkout)
        if not path.is_file():
            sys.exit(f"no script {path}")

    runs: dict[str, list[list[dict[str, Any]]]] = {"old": [], "new": []}
    loads: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(args.rounds):
        for side in ("old", "new") if i % 2 == 0 else ("new", "old"):
            records, load = run_side(*sides[side])
            runs[side].append(records)
            loads[side].append(round(load, 1))
            print(f"round {i + 1}/{args.rounds} {side}: load {load:.1f}", flush=True)

    rows = summarise(runs, args.field)
    print(f"\n{'config':32s} {'method':26s} {'old':>11s} {'new':>11s} {'unit':11s} {'ratio':>6s}  per round")
    for r in rows:
        print(
            f"{r['config']:32s} {r['method']:26s} {r['old']:11.2f} {r['new']:11.2f} {r['unit']:11s} "
            f"{r['ratio']:5.2f}x  {r['ratio_min']:.2f}-{r['ratio_max']:.2f}"
        )
    print(f"(ratio > 1: the new code is better; loads old {loads['old']}, new {loads['new']})")
    if args.json is not None:
        out = []
        for r in rows:
            common = {
                "config": r["config"],
                "unit": r["unit"],
                "higher_is_better": r["higher_is_better"],
                "rounds": args.rounds,
            }
            out.append(
                {
                    **common,
                    "method": r["method"],
                    "value": r["new"],
                    "ratio": r["ratio"],
                    "ratio_min": r["ratio_min"],
                    "ratio_max": r["ratio_max"],
                    "loads": loads["new"],
                }
            )
            out.append({**common, "method": f"old-{r['method']}", "value": r["old"], "loads": loads["old"]})
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
