"""The CLI is argparse and printing over the library: every name it imports from hugerec is public, and
its commands call the entry points a user would."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "hugerec" / "cli"


def _in_a_public_list(module: str, name: str) -> bool:
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        package = importlib.import_module(".".join(parts[:i]))
        if hasattr(package, "__path__") and name in getattr(package, "__all__", ()):
            return True
    return False


def documented_modules() -> set[str]:
    """The modules whose file ARCHITECTURE.md names (`decision_log.py`): module base names are unique in
    the package (tests/test_architecture.py), so a file name there names one module."""
    named = set(re.findall(r"\b(\w+)\.py\b", (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")))
    modules = set()
    for path in (ROOT / "hugerec").rglob("*.py"):
        if path.stem in named and path.name != "__init__.py":
            modules.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return modules


def _cli_imports() -> set[tuple[str, str, str]]:
    """(CLI file, module, name) for every `from hugerec.X import name` of the CLI outside hugerec.cli."""
    found = set()
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hugerec."):
                if not node.module.startswith("hugerec.cli"):
                    found |= {(path.name, node.module, a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {(path.name, a.name, "") for a in node.names if a.name.startswith("hugerec.")}
    return found


def test_the_cli_imports_only_public_names() -> None:
    """Every name the CLI imports is in the `__all__` of a hugerec package, or a public name of a module
    ARCHITECTURE.md documents. Why the second: the commands also need what a user of the library does not
    (the loop's publisher and replay, the pipeline's stores, the data views' settings, the run config's
    model helpers); listing those in `__all__` would make the public API the CLI's surface instead of the
    one a user holds in their head (issue 27: at most 180 names, tests/test_package.py). Reading them from
    documented modules keeps the CLI on parts whose place and purpose are written down; never a name
    starting with "_", never a plain `import hugerec.x`."""
    documented = documented_modules()
    bad = sorted(
        (file, module, name)
        for file, module, name in _cli_imports()
        if not name
        or name.startswith("_")
        or not (_in_a_public_list(module, name) or module in documented)
    )
    assert bad == []


def test_the_cli_calls_the_entry_points_a_user_would() -> None:
    """Training, evaluation, the model file, the export and loading a bundle go through the public entry points."""
    imported = {(module.split(".")[1], name) for _, module, name in _cli_imports()}
    for package, name in [
        ("training", "fit"),
        ("training", "evaluate"),
        ("training", "save_model"),
        ("training", "load_model"),
        ("models", "build_model"),
        ("serving", "export"),
        ("serving", "load"),
    ]:
        assert (package, name) in imported, f"the CLI never imports {name} from hugerec.{package}"
        assert name in importlib.import_module(f"hugerec.{package}").__all__
