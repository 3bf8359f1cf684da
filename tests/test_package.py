"""The top-level package: lazy subpackages stay typed for type checkers."""

from __future__ import annotations

import ast
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
    out, _, code = api.run(
        [str(snippet), "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache")]
    )
    assert code == 1, out
    assert 'has type "type[DLRM]"' in out, out


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(dotted name of the callee, call) for every call in `tree`: "pickle.load", "torch.load", ..."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            parts = []
            f: ast.expr = node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                parts.append(f.id)
            found.append((".".join(reversed(parts)), node))
    return found


def _keyword(call: ast.Call, name: str) -> object:
    for k in call.keywords:
        if k.arg == name and isinstance(k.value, ast.Constant):
            return k.value.value
    return None


def _may_unpickle(name: str, call: ast.Call, rel: str) -> bool:
    if name in ("pickle.load", "pickle.Unpickler", "marshal.load", "marshal.loads", "dill.load", "dill.loads"):
        return True
    if name == "pickle.loads":
        return rel != "hugerec/distributed/launch.py"
    if name == "torch.load":
        return _keyword(call, "weights_only") is not True
    if name in ("np.load", "numpy.load"):
        return _keyword(call, "allow_pickle") is not False
    return name.endswith("read_pickle")


def test_nothing_the_package_reads_can_unpickle_code() -> None:
    """No pickle / marshal / dill load anywhere in hugerec, every torch.load with weights_only=True, every
    np.load with allow_pickle=False: nothing read from disk (or the network) can run code. The one
    exception is distributed/launch.py, which reads its own child processes' results from a pipe."""
    bad = []
    for path in sorted((ROOT / "hugerec").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, call in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            if _may_unpickle(name, call, rel):
                bad.append(f"{rel}:{call.lineno} {name}")
    assert bad == []


def test_tests_find_the_data_samples_in_one_place() -> None:
    """A fresh clone has no data samples: tests that read them declare them with
    `@pytest.mark.shared_data(...)` (tests/conftest.py skips them without the files) instead of building
    their own path to `$HUGEREC_DATA` or `../shared/data`, which failed instead of skipping."""
    own_paths = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path in (ROOT / "tests" / "conftest.py", Path(__file__).resolve()):
            continue
        text = path.read_text()
        if 'environ.get("HUGEREC_DATA"' in text or '"shared" / "data"' in text:
            own_paths.append(str(path.relative_to(ROOT)))
    assert own_paths == []


MAX_PUBLIC_NAMES = 180  # issue 27: a public API a user can hold in their head (377 names when it was set)


def public_lists() -> dict[str, list[str]]:
    """package -> its `__all__`, for every package of hugerec that has one (read from the source: nothing is
    imported, so lazily exported names count as well)."""
    lists = {}
    for init in sorted((ROOT / "hugerec").rglob("__init__.py")):
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                lists[".".join(init.parent.relative_to(ROOT).parts)] = list(ast.literal_eval(node.value))
    return lists


def test_the_public_names_fit_in_a_head() -> None:
    """At most MAX_PUBLIC_NAMES public names in all: the sum of the lengths of every package's `__all__`.
    Each list counts in full: a name a package takes from its subpackage (`hugerec.TableConfig`, which is
    `hugerec.embedding.TableConfig`) counts once in each list, since it is one more spelling to learn, and
    a subpackage listed by its parent (`"data"` in hugerec's) counts as a name of the parent."""
    lists = public_lists()
    sizes = {package: len(names) for package, names in lists.items()}
    assert sum(sizes.values()) <= MAX_PUBLIC_NAMES, sizes


def test_every_public_name_exists() -> None:
    """Every name of every `__all__` is there (imported on first use where a package is lazy)."""
    import importlib

    missing = []
    for package, names in public_lists().items():
        module = importlib.import_module(package)
        missing += [f"{package}.{name}" for name in names if not hasattr(module, name)]
    assert missing == []
