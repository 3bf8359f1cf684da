"""The top-level package: lazy subpackages stay typed for type checkers."""

from __future__ import annotations

from pathlib import Path

import pytest

import hugerec as hr

ROOT = Path(__file__).resolve().parents[1]


def test_subpackages_import_on_first_use() -> None:
    assert hr.models.DLRM.__name__ == "DLRM"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hr.nope  # noqa: B018


def test_lazy_subpackages_are_typed(tmp_path: Path) -> None:
    """`hr.models.DLRM` is the class for mypy, not Any: a wrong use is an error."""
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "use.py"
    snippet.write_text("import hugerec as hr\n\nx: int = hr.models.DLRM\n")
    out, _, code = api.run([str(snippet), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache")])
    assert code == 1, out
    assert 'has type "type[DLRM]"' in out, out
