"""The benchmark scripts keep the project's benchmark contract, read from their source (nothing is run).

- Every script (a file of benchmarks/ with a `__main__` block) takes `--quick` and `--json`, except the
  A/B harness, which passes its arguments through to the script it runs.
- No file of benchmarks/ shadows an importable top-level module: `python benchmarks/X.py` puts
  benchmarks/ first on sys.path, so a file named like an installed package (as `distributed.py` once
  did with Dask's `distributed`) would be imported in its place by any code that imports that package.
"""

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
HARNESSES = {"ab.py"}  # runs another script with that script's own arguments
SCRIPTS = sorted(BENCHMARKS.glob("*.py"))


def _is_script(tree: ast.Module) -> bool:
    """Whether the module has an `if __name__ == "__main__":` block."""
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            left = node.test.left
            if isinstance(left, ast.Name) and left.id == "__name__":
                return True
    return False


def _options(tree: ast.Module) -> set[str]:
    """Every string literal starting with "--" passed to an `add_argument` call."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    found.add(arg.value)
    return found


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) >= 10, f"found only {len(SCRIPTS)} files in {BENCHMARKS}"


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_script_takes_quick_and_json(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    if not _is_script(tree) or path.name in HARNESSES:
        return
    missing = {"--quick", "--json"} - _options(tree)
    assert not missing, f"benchmarks/{path.name} has no {', '.join(sorted(missing))} option"


def test_no_benchmark_file_shadows_an_importable_module() -> None:
    # the installed packages' paths: not the checkout's own folders (pytest puts tests/ on the path)
    outside = [p for p in sys.path if p and not Path(p).resolve().is_relative_to(BENCHMARKS.parent)]
    shadowing = []
    for path in SCRIPTS:
        name = path.stem
        if name in sys.builtin_module_names or name in sys.stdlib_module_names:
            shadowing.append(f"{path.name} (standard library)")
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, outside)
        if spec is not None:
            shadowing.append(f"{path.name} ({spec.origin})")
    assert not shadowing, f"benchmark files named like importable modules: {', '.join(shadowing)}"


def test_shadow_check_finds_a_shadowing_name() -> None:
    """The check above would see `distributed` (Dask's, a dependency) and `json` (the standard library)."""
    outside = [p for p in sys.path if p]
    assert importlib.machinery.PathFinder.find_spec("distributed", outside) is not None
    assert "json" in sys.stdlib_module_names
