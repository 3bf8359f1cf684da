"""The rules of ARCHITECTURE.md that a program can check: one base name per module and per class, no private
name used outside its module, names imported from the module that defines them, tests that mirror the package
(every test file names a module, every module has its test file), ops/gpu's modules named after ops/cpu's, and
where Numba and Triton may be imported.
(The layering is import-linter's: the contracts in pyproject.toml.)"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hugerec"

# ops/gpu/X.py mirrors ops/cpu/X.py by design: the same file names, function and class names, argument order
MIRRORED = (PurePosixPath("hugerec/ops/cpu"), PurePosixPath("hugerec/ops/gpu"))
# where a module may import Numba: the kernels of ops/, the NumPy-in/NumPy-out helpers of data/ (see "Where we
# departed from DESIGN.md"), the GBM forest's scoring kernel
NUMBA_ALLOWED = ("hugerec/ops/", "hugerec/data/", "hugerec/serving/runtime/forest.py")
TRITON_ALLOWED = ("hugerec/ops/",)


def _modules() -> Iterator[tuple[PurePosixPath, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield PurePosixPath(path.relative_to(ROOT).as_posix()), ast.parse(path.read_text(encoding="utf-8"))


def _mirrored(paths: list[PurePosixPath]) -> bool:
    """True for exactly one module in ops/cpu and its namesake in ops/gpu."""
    return len(paths) == 2 and sorted(p.parent for p in paths) == sorted(MIRRORED)


def duplicates(names: dict[str, list[PurePosixPath]]) -> dict[str, list[str]]:
    return {n: [str(p) for p in ps] for n, ps in sorted(names.items()) if len(ps) > 1 and not _mirrored(ps)}


def test_module_base_names_are_unique() -> None:
    """A file says what it holds: no two modules share a base name (package __init__s aside), except that
    ops/gpu/X.py mirrors ops/cpu/X.py."""
    names: dict[str, list[PurePosixPath]] = defaultdict(list)
    for path, _ in _modules():
        if path.name not in ("__init__.py", "__main__.py"):
            names[path.stem].append(path)
    assert duplicates(names) == {}


def test_class_names_are_unique() -> None:
    """One name per concept: no two public top-level classes share a name (ops/gpu mirrors ops/cpu)."""
    names: dict[str, list[PurePosixPath]] = defaultdict(list)
    for path, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                names[node.name].append(path)
    assert duplicates(names) == {}


def _module_path(dotted: str) -> Path | None:
    base = ROOT / dotted.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_crossings(path: PurePosixPath, tree: ast.Module) -> list[str]:
    """`from hugerec.x import _y`, and `m._y` where `m` is a hugerec module imported by name: a private name
    used outside the module that defines it."""
    found: list[tuple[int, str]] = []
    modules: set[str] = set()  # local names bound to hugerec modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hugerec":
            for alias in node.names:
                if _private(alias.name) and _module_path(f"{node.module}.{alias.name}") is None:
                    found.append((node.lineno, f"{path}:{node.lineno} imports {node.module}.{alias.name}"))
                if _module_path(f"{node.module}.{alias.name}") is not None:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hugerec" and alias.asname is not None:
                    modules.add(alias.asname)
    for node in ast.walk(tree):
        owner = node.value.id if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) else None
        if owner in modules and isinstance(node, ast.Attribute) and _private(node.attr):
            found.append((node.lineno, f"{path}:{node.lineno} reads {owner}.{node.attr}"))
    return [line for _, line in sorted(found)]


def test_no_private_name_crosses_modules() -> None:
    """A leading underscore means "this module only": the package never imports or reads another module's
    private name (a helper two modules need gets a public name in the module where it belongs). Tests may
    reach into the module they test."""
    found = [line for path, tree in _modules() for line in private_crossings(path, tree)]
    assert found == []


def test_the_private_name_check_finds_both_forms() -> None:
    tree = ast.parse(
        "from hugerec.serving.http import auth as a\nfrom hugerec.sparse.features import _x\nimport hugerec.ops.cpu as c\n"
        "a._check(1)\nc._kernel\nfrom hugerec.ops import cpu\ncpu._y\nself._z\n"
    )
    found = private_crossings(PurePosixPath("m.py"), tree)
    assert found == [
        "m.py:2 imports hugerec.sparse.features._x",
        "m.py:4 reads a._check",
        "m.py:5 reads c._kernel",
        "m.py:7 reads cpu._y",
    ]


def test_duplicate_check_exempts_only_the_cpu_gpu_mirror() -> None:
    p = PurePosixPath
    names = {
        "lookup_kernels": [p("hugerec/ops/cpu/lookup_kernels.py"), p("hugerec/ops/gpu/lookup_kernels.py")],
        "gbm": [p("hugerec/models/gbm.py"), p("hugerec/training/gbm.py")],
        "rows": [p("hugerec/ops/cpu/rows.py"), p("hugerec/ops/gpu/rows.py"), p("hugerec/data/rows.py")],
    }
    assert duplicates(names) == {
        "gbm": ["hugerec/models/gbm.py", "hugerec/training/gbm.py"],
        "rows": ["hugerec/ops/cpu/rows.py", "hugerec/ops/gpu/rows.py", "hugerec/data/rows.py"],
    }


def mirror_names(package: Path) -> set[str]:
    """The names a test file in tests/<folder>/ may mirror, for the package hugerec/<folder>: its modules, its
    sub-packages, and its own name (for its `__init__`)."""
    names = {p.stem for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    names |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    names.add(package.name)
    return names


def mirrored_module(test: PurePosixPath, package: Path) -> Path | None:
    """The module (a file of `package`, or a package's `__init__`) that tests/<folder>/test_<name>.py mirrors:
    <name> is the module's name or the name + "_" + the aspect tested (test_loop_server.py), the longest such
    name winning (test_fused_lookup.py mirrors fused_lookup.py, not fused.py); None if it names none."""
    name = test.stem.removeprefix("test_")
    matches = [m for m in mirror_names(package) if name == m or name.startswith(m + "_")]
    if not matches:
        return None
    best = max(matches, key=len)
    if best == package.name and not (package / f"{best}.py").is_file():
        return package / "__init__.py"
    if (package / best / "__init__.py").is_file():
        return package / best / "__init__.py"
    return package / f"{best}.py"


def test_tests_mirror_the_package() -> None:
    """tests/<folder>/test_<name>.py tests hugerec/<folder>/: <name> is a module of that folder (or of a
    sub-package named so), or such a module's name + "_" + the aspect tested (test_loop_server.py). The
    files directly in tests/ are about the package as a whole."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        folder = path.parent.relative_to(ROOT / "tests")
        if folder == Path("."):
            continue
        package = PACKAGE / folder
        if not (package / "__init__.py").is_file():
            bad.append(f"{path.relative_to(ROOT)}: no package hugerec/{folder.as_posix()}")
            continue
        if mirrored_module(PurePosixPath(path.name), package) is None:
            bad.append(f"{path.relative_to(ROOT)}: names no module of hugerec/{folder.as_posix()}")
    assert bad == []


def re_export_only(init: Path) -> bool:
    """A package `__init__` that defines no function or class: it only imports and lists names (its `__all__` is
    counted and checked by tests/test_package.py), so it has no behaviour of its own for a test file to test."""
    tree = ast.parse(init.read_text(encoding="utf-8"))
    return not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body)


def untested_modules(root: Path = ROOT) -> list[str]:
    """The modules of hugerec/ (as "hugerec/x/y.py") that no test file mirrors: hugerec/<folder>/<m>.py wants
    tests/<folder>/test_<m>.py or test_<m>_<aspect>.py, a top-level hugerec/<m>.py tests/test_<m>.py; a
    re-export-only `__init__` wants none."""
    package_root = root / "hugerec"
    mirrored: set[Path] = set()
    for test in (root / "tests").rglob("test_*.py"):
        package = package_root / test.parent.relative_to(root / "tests")
        if package == package_root:  # tests/test_<m>.py: a top-level module, or the package as a whole
            mirrored.add(package_root / f"{test.stem.removeprefix('test_')}.py")
        elif (package / "__init__.py").is_file() and (module := mirrored_module(PurePosixPath(test.name), package)):
            mirrored.add(module)
    return [
        path.relative_to(root).as_posix()
        for path in sorted(package_root.rglob("*.py"))
        if path not in mirrored and not (path.name == "__init__.py" and re_export_only(path))
    ]


# The modules that have no test file of their own, each with the reason: no behaviour of its own to test. Keep it
# short: a module with behaviour gets its tests/<folder>/test_<module>.py instead (test_every_module_has_a_test_file).
NO_TEST_FILE = {
    "hugerec/__main__.py": "`python -m hugerec` is `hugerec`: one call of cli.main (torchrun launches it in tests/cli)",
    "hugerec/ops/lookup_plan.py": "constants only: the column indices of the lookup plan, read by the tested lookups",
}


def mirror_problems(untested: list[str], exempt: dict[str, str]) -> list[str]:
    """One line per module without a test file that is not exempt, and per exemption that is stale (its module
    has a test file now, or no longer exists)."""
    missing = [
        f"{m}: no test file (tests/{PurePosixPath(m).parent.relative_to('hugerec')}/test_<its name>.py); write one, "
        "or put it in NO_TEST_FILE with the reason"
        for m in untested
        if m not in exempt
    ]
    stale = [
        f"{m}: in NO_TEST_FILE but it has a test file now, or no longer exists" for m in exempt if m not in untested
    ]
    return missing + stale


def test_every_module_has_a_test_file() -> None:
    """The other direction of test_tests_mirror_the_package: every module of the package has its mirroring test
    file, or is in NO_TEST_FILE with the reason; and every entry of NO_TEST_FILE names a module that exists
    and still lacks one, so the list cannot go stale."""
    assert mirror_problems(untested_modules(), NO_TEST_FILE) == []


def test_the_mirror_check_finds_a_missing_test_file(tmp_path: Path) -> None:
    files = [
        "hugerec/__init__.py",  # re-exports only: needs no test file
        "hugerec/top.py",
        "hugerec/lone.py",
        "hugerec/sub/__init__.py",
        "hugerec/sub/fused.py",
        "hugerec/sub/fused_lookup.py",
        "hugerec/sub/loop.py",
        "hugerec/sub/deep/__init__.py",
        "tests/test_top.py",
        "tests/sub/test_fused_lookup.py",  # mirrors fused_lookup.py, not fused.py
        "tests/sub/test_loop_server.py",  # loop.py, its server aspect
        "tests/sub/test_deep.py",  # the sub-package's __init__
    ]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "hugerec/sub/deep/__init__.py").write_text("def f() -> None: ...\n")
    (tmp_path / "hugerec/sub/__init__.py").write_text("class C: ...\n")
    assert untested_modules(tmp_path) == ["hugerec/lone.py", "hugerec/sub/__init__.py", "hugerec/sub/fused.py"]
    (tmp_path / "tests/sub/test_sub.py").write_text("")
    assert untested_modules(tmp_path) == ["hugerec/lone.py", "hugerec/sub/fused.py"]
    exempt = {"hugerec/lone.py": "constants only", "hugerec/sub/loop.py": "stale: it has a test file"}
    assert mirror_problems(untested_modules(tmp_path), exempt) == [
        "hugerec/sub/fused.py: no test file (tests/sub/test_<its name>.py); write one, or put it in NO_TEST_FILE "
        "with the reason",
        "hugerec/sub/loop.py: in NO_TEST_FILE but it has a test file now, or no longer exists",
    ]


def _imported_roots(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module.split(".")[0]


def test_numba_and_triton_are_imported_only_where_kernels_live() -> None:
    """Numba in ops/ (the kernels), data/ (its NumPy helpers) and the GBM forest kernel; Triton in ops/ only."""
    bad = []
    for path, tree in _modules():
        for line, root in _imported_roots(tree):
            allowed = {"numba": NUMBA_ALLOWED, "triton": TRITON_ALLOWED}.get(root)
            if allowed is not None and not str(path).startswith(allowed):
                bad.append(f"{path}:{line} imports {root}")
    assert bad == []


def _defined_in(init: Path) -> set[str]:
    """The names a package `__init__` defines itself (functions, classes, assignments), not those it imports."""
    names: set[str] = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def imports_through_a_package(path: PurePosixPath, tree: ast.Module) -> list[str]:
    """`from hugerec.PKG import Name` where PKG's `__init__` only re-exports Name (it is defined in a module
    of PKG): inside the package and the tests, a name is imported from the module that defines it."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if node.module.split(".")[0] != "hugerec":
            continue
        init = ROOT / node.module.replace(".", "/") / "__init__.py"
        if not init.is_file():
            continue
        defined = _defined_in(init)
        for alias in node.names:
            submodule = _module_path(f"{node.module}.{alias.name}") is not None
            if not submodule and alias.name not in defined:
                found.append(f"{path}:{node.lineno} imports {alias.name} from the package {node.module}")
    return found


def test_names_are_imported_from_their_defining_module() -> None:
    """ARCHITECTURE.md: "Inside the package and the tests, import names from the module that defines them;
    the package `__init__`s are the curated public surface for users." (The `__init__`s themselves, and the
    tests of the public surface directly in tests/, are what re-export or read that surface.)"""
    bad = []
    files = [p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    files += [p for p in (ROOT / "tests").rglob("*.py") if p.parent != ROOT / "tests"]
    for file in sorted(files):
        path = PurePosixPath(file.relative_to(ROOT).as_posix())
        bad += imports_through_a_package(path, ast.parse(file.read_text(encoding="utf-8")))
    assert bad == []


def test_the_defining_module_check_finds_a_re_export() -> None:
    tree = ast.parse("from hugerec.data import load\nfrom hugerec.data.loader import load\nfrom hugerec.ops import pooled_lookup\n")
    assert imports_through_a_package(PurePosixPath("x.py"), tree) == ["x.py:1 imports load from the package hugerec.data"]


def test_gpu_modules_are_named_after_their_cpu_modules() -> None:
    """ops/gpu/X.py holds the Triton side of what ops/cpu/X.py does in Numba: no gpu module without its cpu
    namesake (the one exemption from unique module names)."""
    cpu = {p.name for p in (PACKAGE / "ops" / "cpu").glob("*.py")}
    gpu = {p.name for p in (PACKAGE / "ops" / "gpu").glob("*.py")}
    assert gpu - cpu == set()
