"""benchmarks/gpu.py runs end to end in its dry run (tiny shapes, the Triton kernels under the interpreter on the
CPU) and writes a record for every figure the issue asks for, labelled as no GPU figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_writes_every_figure(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run", "--json", str(out)],
        cwd=tmp_path,  # any directory: the script finds the checkout itself
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = json.loads(out.read_text())
    got = {(r["config"], r["method"]) for r in records}
    want = {("dry-run copy bandwidth", "device copy")}
    for shape in ("mlperf", "heavy", "zipf"):
        for figure in ("lookup fwd", "lookup fwd+bwd+update"):
            want |= {(f"dry-run {figure} / {shape}", m) for m in ("hugerec", "pytorch EmbeddingBag")}
    for load in ("0.5", "0.9"):
        want |= {(f"dry-run hash find / load {load}", m) for m in ("hugerec", "torch searchsorted")}
        want |= {(f"dry-run hash insert / load {load}", m) for m in ("hugerec", "torch cat+sort")}
        want.add((f"dry-run hash find_or_insert / load {load}", "hugerec"))
    want |= {("dry-run dlrm step", "hugerec"), ("dry-run dlrm step", "pytorch")}
    want |= {("dry-run hbm cache / 25% of the table", m) for m in ("hugerec", "all in HBM")}
    assert want <= got, want - got
    assert all(r["device"].startswith("cpu (Triton interpreter") for r in records)
    assert all(
        r["value"] > 0 and set(r) == {"config", "method", "value", "unit", "higher_is_better", "device"}
        for r in records
    )
    assert "no GPU figure" in done.stdout


def test_every_kernel_test_the_script_names_exists() -> None:
    """The script hands its list to pytest on the GPU machine, where a stale path ends the test run with a
    usage error before any test runs; collecting them here catches a test that was moved or renamed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *module.KERNEL_TESTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
