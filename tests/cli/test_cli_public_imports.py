"""The CLI is argparse and printing over the public API: every name it imports from the library is in
the `__all__` of a hugerec package (never a name starting with "_", never a module's helper)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "hugerec" / "cli"


def _public(module: str, name: str) -> bool:
    parts = module.split(".")
    for i in range(2, len(parts) + 1):
        package = importlib.import_module(".".join(parts[:i]))
        if hasattr(package, "__path__") and name in getattr(package, "__all__", ()):
            return True
    return False


def test_the_cli_imports_only_public_names() -> None:
    private = set()
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hugerec."):
                if node.module.startswith("hugerec.cli"):
                    continue
                private |= {(path.name, node.module, a.name) for a in node.names if not _public(node.module, a.name)}
            elif isinstance(node, ast.Import):
                private |= {(path.name, a.name, "") for a in node.names if a.name.startswith("hugerec.")}
    assert sorted(private) == []
