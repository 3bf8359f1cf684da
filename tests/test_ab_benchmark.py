"""benchmarks/ab.py: two checkouts of one benchmark, interleaved; the summary of their records (medians, the ratio
of the medians with the new code's side up, the range of the per-round ratios, a numeric field compared too), and
the refusal of an interpreter that imports hugerec from elsewhere."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ab() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ab_benchmark", ROOT / "benchmarks" / "ab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _r(config: str, method: str, value: float, higher: bool, **extra: float) -> dict[str, object]:
    return {"config": config, "method": method, "value": value, "unit": "u", "higher_is_better": higher, **extra}


def test_summary_takes_medians_ratios_and_their_range_per_round() -> None:
    ab = _ab()
    old = [[_r("throughput b=1", "hugerec", v, True, cpu=c), _r("p99 b=1", "hugerec", p, False, cpu=c)]
           for v, p, c in ((100, 10, 1.0), (90, 12, 1.2), (110, 8, 0.8))]  # fmt: skip
    new = [[_r("throughput b=1", "hugerec", v, True, cpu=c), _r("p99 b=1", "hugerec", p, False, cpu=c)]
           for v, p, c in ((120, 5, 0.5), (80, 10, 1.0), (100, 20, 2.0))]  # fmt: skip
    new[0].append(_r("only new", "hugerec", 1.0, True))  # not in every run of both sides: no pair, left out
    rows = {(r["config"], r["method"]): r for r in ab.summarise({"old": old, "new": new}, ["cpu"])}
    assert set(rows) == {("throughput b=1", "hugerec"), ("p99 b=1", "hugerec"), ("b=1 cpu", "hugerec")}
    t = rows[("throughput b=1", "hugerec")]
    assert (t["old"], t["new"]) == (100, 100) and t["ratio"] == 1.0
    assert t["ratio_min"] == pytest.approx(80 / 90) and t["ratio_max"] == pytest.approx(1.2)
    p = rows[("p99 b=1", "hugerec")]  # a latency: old / new, above 1 the new code is better
    assert p["ratio"] == pytest.approx(10 / 10) and p["ratio_max"] == pytest.approx(2.0) and p["ratio_min"] == pytest.approx(0.4)
    c = rows[("b=1 cpu", "hugerec")]  # the field, once per (config, method), lower is better
    assert (c["old"], c["new"], c["higher_is_better"]) == (1.0, 1.0, False)


def test_an_interpreter_importing_another_hugerec_is_refused(tmp_path: Path) -> None:
    # tmp_path is no checkout of hugerec: this interpreter imports the one it has installed
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ab.py"), "--old", str(tmp_path), "--old-python", sys.executable,
         "--", "benchmarks/serving.py", "--quick"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "imports hugerec from" in proc.stderr and str(tmp_path) in proc.stderr
