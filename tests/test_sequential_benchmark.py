"""benchmarks/sequential.py --merge: the quality records of runs made side by side (the validation and test
runs, seeds in parallel processes, the baselines in another) pooled as one run would have written them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _r(config: str, method: str, value: float, unit: str = "fraction", higher: bool = True) -> dict[str, object]:
    return {"config": config, "method": method, "value": value, "unit": unit, "higher_is_better": higher}


def test_merge_pools_seeds_and_takes_ratios_against_the_strongest_baseline(tmp_path: Path) -> None:
    runs = {
        "baselines.json": [
            _r("quality movielens recall@10", "slist", 0.28),
            _r("quality movielens recall@10", "popular", 0.04),
            _r("quality movielens ndcg@10", "slist", 0.16),
            _r("quality movielens ndcg@10", "sknn", 0.17),
        ],
        "seed0.json": [
            _r("quality movielens recall@10 seed 0", "hugerec-hstu", 0.33),
            _r("quality movielens ndcg@10 seed 0", "hugerec-hstu", 0.19),
            _r("quality movielens recall@10 seed 0", "hugerec-sasrec", 0.30),
            _r("quality movielens ndcg@10 seed 0", "hugerec-sasrec", 0.18),
            _r("quality movielens epochs", "hugerec-hstu", 9.0, "epochs (chosen on valid)", False),
        ],
        "seed1.json": [
            _r("quality movielens recall@10 seed 1", "hugerec-hstu", 0.35),
            _r("quality movielens ndcg@10 seed 1", "hugerec-hstu", 0.21),
        ],
    }
    for name, records in runs.items():
        (tmp_path / name).write_text(json.dumps(records))
    out = tmp_path / "merged.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "sequential.py"), "--merge", *runs, "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = {(r["config"], r["method"], r["unit"]): r["value"] for r in json.loads(out.read_text())}
    assert got[("quality movielens recall@10", "hugerec-hstu", "fraction")] == pytest.approx(0.34)
    assert got[("quality movielens recall@10 spread", "hugerec-hstu", "std over seeds")] == pytest.approx(0.01)
    assert got[("quality movielens epochs", "hugerec-hstu", "epochs (chosen on valid)")] == 9.0
    assert got[("quality movielens recall@10", "slist", "fraction")] == 0.28
    # each metric against its own strongest baseline: slist on recall, sknn on ndcg
    assert got[("movielens hstu", "hugerec-hstu", "recall@10 x slist (strongest baseline)")] == pytest.approx(0.34 / 0.28)
    assert got[("movielens hstu", "hugerec-hstu", "ndcg@10 x sknn (strongest baseline)")] == pytest.approx(0.20 / 0.17)
    assert got[("movielens hstu", "hugerec-hstu", "recall@10 x hugerec-sasrec")] == pytest.approx(0.34 / 0.30)
    assert got[("movielens sasrec", "hugerec-sasrec", "ndcg@10 x sknn (strongest baseline)")] == pytest.approx(0.18 / 0.17)
