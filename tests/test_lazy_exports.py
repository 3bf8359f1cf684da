"""Lazy package names (hugerec.lazy_exports): every public name resolves, typed, and nothing heavy loads early."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

from hugerec.lazy_exports import exported_names, lazy_exports

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = ("hugerec", "hugerec.embedding", "hugerec.data", "hugerec.data.preprocess")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_public_name_resolves_to_what_its_module_defines(package: str) -> None:
    module = importlib.import_module(package)
    assert module.__file__ is not None
    table = exported_names(module.__file__)
    public = [n for n in module.__all__ if n != "__version__"]
    assert sorted(public) == sorted(table), "__all__ and the TYPE_CHECKING imports list the same names"
    for name in public:
        source, attribute = table[name]
        value = getattr(module, name)
        if source == package:
            assert isinstance(value, types.ModuleType) and value.__name__ == f"{package}.{attribute}"
        else:
            assert value is getattr(importlib.import_module(source), attribute)
    assert set(public) <= set(dir(module))


def test_an_unknown_name_is_an_attribute_error() -> None:
    import hugerec.data

    with pytest.raises(AttributeError, match=r"module 'hugerec\.data' has no attribute 'nope'"):
        hugerec.data.nope  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'nope'"):
        from hugerec.data import nope  # noqa: F401


def test_only_imports_inside_type_checking_count(tmp_path: Path) -> None:
    init = tmp_path / "pkg_init.py"
    init.write_text(
        "from typing import TYPE_CHECKING\nimport json\nfrom os import path\n"
        "if TYPE_CHECKING:\n    from collections import OrderedDict as OD, deque\n    import email\n"
    )
    assert exported_names(str(init)) == {"OD": ("collections", "OrderedDict"), "deque": ("collections", "deque")}
    module = types.ModuleType("pkg_lazy_probe")
    module.__file__ = str(init)
    sys.modules["pkg_lazy_probe"] = module
    try:
        lazy_exports("pkg_lazy_probe")
        from collections import OrderedDict

        assert module.OD is OrderedDict  # type: ignore[attr-defined]  # a lazy name
        assert vars(module)["OD"] is OrderedDict  # cached: the next access does not come back here
        assert "deque" in dir(module)
    finally:
        del sys.modules["pkg_lazy_probe"]


def test_a_submodule_import_does_not_replace_the_name_it_shares() -> None:
    """data/prepare.py defines `prepare`: importing the module (as run_config does) leaves
    `hugerec.data.prepare` the function, in whichever order the two are first used."""
    code = (
        "import hugerec.data.prepare\nfrom hugerec.data import prepare\nimport hugerec.data as d\n"
        "print(callable(prepare), type(prepare).__name__, d.prepare is prepare)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["True", "function", "True"]
    from hugerec.data import prepare
    from hugerec.data.prepare import prepare as defined

    assert prepare is defined


def test_import_hugerec_loads_neither_torch_nor_numba() -> None:
    code = "import sys, hugerec, hugerec.data, hugerec.embedding; print([m for m in ('torch', 'numba') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def test_lazy_names_are_typed(tmp_path: Path) -> None:
    """`hr.TableConfig` and `hugerec.data.Loader` are the classes for mypy, not Any."""
    api = pytest.importorskip("mypy.api")
    snippet = tmp_path / "use.py"
    snippet.write_text("import hugerec as hr\nimport hugerec.data\n\nx: int = hr.TableConfig\ny: int = hugerec.data.Loader\n")
    out, _, code = api.run(
        [str(snippet), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache")]
    )
    assert code == 1, out
    assert 'has type "type[TableConfig]"' in out and 'has type "type[Loader]"' in out, out
