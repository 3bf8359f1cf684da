"""Fast start: `hugerec --help` and `hugerec schema FILE` import neither torch nor Numba.

Each command runs in a fresh interpreter (what a user's shell starts), then the test reads which
modules that interpreter loaded: torch alone takes seconds to import, Numba about one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "numba", "triton", "dask", "fastapi")

# runs `hugerec ARGS...` in this interpreter, then prints which HEAVY modules it loaded, as JSON
PROBE = """
import json, sys
from hugerec.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:  # argparse's --help
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY", repr(HEAVY))


def loaded_by(*args: str, cwd: Path) -> tuple[int, list[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], report["loaded"], done.stdout


@pytest.mark.parametrize("args", [["--help"], [], ["train", "--help"], ["schema", "--help"], ["pipeline", "--help"], ["serve", "--help"]])
def test_help_imports_neither_torch_nor_numba(args: list[str], tmp_path: Path) -> None:
    code, loaded, out = loaded_by(*args, cwd=tmp_path)
    assert code in (0, 2), out
    assert "usage: hugerec" in out
    assert loaded == []


def test_schema_imports_neither_torch_nor_numba(tmp_path: Path) -> None:
    lines = ["id,user_id,category,tags,price,clicked"]
    lines += [f"{10**19 + i},{i % 7},c{i % 3},a|b,{i * 0.5},{i % 2}" for i in range(500)]
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    code, loaded, out = loaded_by("schema", "clicks.csv", cwd=tmp_path)
    assert code == 0, out
    assert "[preprocess]" in out and 'name = "clicked", type = "int", role = "label"' in out
    assert loaded == []


def test_schema_of_parquet_imports_neither_torch_nor_numba(tmp_path: Path) -> None:
    import polars as pl

    pl.DataFrame({"user": [1, 2, 3], "clicked": [0, 1, 0]}).write_parquet(tmp_path / "clicks.parquet")
    code, loaded, out = loaded_by("schema", "clicks.parquet", cwd=tmp_path)
    assert code == 0, out
    assert 'format = "parquet"' in out
    assert loaded == []


def test_the_probe_sees_a_command_that_does_import_torch(tmp_path: Path) -> None:
    """The check above can fail: --print-config reads the model registry, which imports torch."""
    code, loaded, out = loaded_by("train", "--print-config", cwd=tmp_path)
    assert code == 0, out
    assert "torch" in loaded
