"""Start-up of the `hugerec` command: `--help` and `schema FILE`, against the eager imports they replaced.

    python benchmarks/startup.py [--quick] [--json PATH] [--repeats R] [--csv-mb M]

Each measurement is the wall time of a fresh interpreter (what a user's shell starts) running one
command to its exit, median of R runs; the methods take turns within each round so that load changes
hit them alike. Configs and methods:
    help    `python -m hugerec --help`
    schema  `python -m hugerec schema FILE` on a generated M MB CSV (20-digit ids, small-range integer
            codes, text categories, "|"-separated lists, prices, a 0/1 label)
  hugerec          the command as shipped: package names load on first use (hugerec.lazy_exports), so
                   neither torch nor Numba is imported
  eager-imports    the same command after importing every public name of hugerec, hugerec.data and
                   hugerec.embedding, which is what `import hugerec` did before the names became lazy
  import-torch     `python -c "import torch"`: the reference a command pays for as soon as it touches torch
  python           `python -c pass`: the interpreter's own start, the floor of every method
Prints each method's median and the ratio eager-imports / hugerec.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Runs `hugerec ARGS...` after importing what `import hugerec` imported eagerly before the lazy names.
EAGER = """
import sys
import hugerec, hugerec.data, hugerec.embedding
for package in (hugerec, hugerec.data, hugerec.embedding):
    for name in package.__all__:
        getattr(package, name)
from hugerec.cli import main
sys.exit(main(sys.argv[1:]))
"""


def write_csv(path: Path, megabytes: float, seed: int = 0) -> int:
    """A click log of about `megabytes` MB; returns its rows."""
    rng = random.Random(seed)
    lines = ["id,user_id,site_category,device_type,tags,price,clicked"]
    size, rows = 0, 0
    while size < megabytes * (1 << 20):
        line = (
            f"{10**19 + rng.randrange(10**18)},{rng.randrange(5000)},c{rng.randrange(30)},{rng.randrange(5)},"
            f"{'|'.join(str(rng.randrange(50)) for _ in range(rng.randrange(1, 4)))},{rng.random() * 100:.2f},"
            f"{int(rng.random() < 0.2)}"
        )
        lines.append(line)
        size += len(line) + 1
        rows += 1
    path.write_text("\n".join(lines) + "\n")
    return rows


def wall(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    parser.add_argument("--json", type=Path, help="write the records to this file")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--csv-mb", type=float, default=1.0, help="size of the schema command's CSV (MB)")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 7)
    py = sys.executable
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        csv = cwd / "clicks.csv"
        rows = write_csv(csv, args.csv_mb)
        configs: dict[str, dict[str, list[str]]] = {
            "help": {
                "hugerec": [py, "-m", "hugerec", "--help"],
                "eager-imports": [py, "-c", EAGER, "--help"],
            },
            f"schema {args.csv_mb:g} MB csv": {
                "hugerec": [py, "-m", "hugerec", "schema", str(csv)],
                "eager-imports": [py, "-c", EAGER, "schema", str(csv)],
            },
        }
        references = {"import-torch": [py, "-c", "import torch"], "python": [py, "-c", "pass"]}
        for command in [*references.values(), *(c for methods in configs.values() for c in methods.values())]:
            wall(command, cwd)  # warm the file cache and the byte-code caches before timing
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            for config, methods in configs.items():
                for method, command in {**methods, **references}.items():
                    times.setdefault((config, method), []).append(wall(command, cwd))
        print(f"rows in the schema CSV: {rows}; median of {repeats} runs, seconds")
        for config, methods in configs.items():
            medians = {m: statistics.median(times[(config, m)]) for m in [*methods, *references]}
            line = "  ".join(f"{m} {v:.3f}" for m, v in medians.items())
            print(f"{config:>18}: {line}  eager-imports / hugerec = {medians['eager-imports'] / medians['hugerec']:.1f}x")
            for method, value in medians.items():
                records.append(
                    {
                        "config": config,
                        "method": method,
                        "value": value,
                        "unit": "s",
                        "higher_is_better": False,
                        "repeats": repeats,
                    }
                )
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
