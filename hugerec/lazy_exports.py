"""Lazy public names of a package `__init__`: imported on first use, typed as if imported eagerly.

    # hugerec/data/__init__.py
    from typing import TYPE_CHECKING

    from hugerec.lazy_exports import lazy_exports

    if TYPE_CHECKING:  # the public names; imported on first use (see hugerec.lazy_exports)
        from hugerec.data.loader import Loader, load

    __all__ = ["Loader", "load"]
    lazy_exports(__name__)

The `if TYPE_CHECKING:` block is the one list of public names: type checkers read it as ordinary
imports (so `hugerec.data.Loader` is the class, not Any), and `lazy_exports` reads the same block
from the file's syntax tree to know which module defines each name. A name is imported on its first
access (attribute or `from package import name`) and then cached in the package's namespace. The
package module's class becomes `LazyPackage` (a module subclass, as the language reference allows)
so that importing a submodule that shares an exported name (data/prepare.py and its `prepare`) does
not replace the name by the module.

Why: `import hugerec` used to import every subpackage, torch and Numba among them (5 s), so that
`hugerec --help` and `hugerec schema FILE`, which need neither, paid for both.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types


def exported_names(init_file: str) -> dict[str, tuple[str, str]]:
    """name -> (module, attribute) for every `from MODULE import ATTR [as name]` inside a top-level
    `if TYPE_CHECKING:` of `init_file`."""
    with open(init_file, encoding="utf-8") as f:
        tree = ast.parse(f.read(), init_file)
    names: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            continue
        for statement in node.body:
            if isinstance(statement, ast.ImportFrom) and statement.module is not None and statement.level == 0:
                for alias in statement.names:
                    names[alias.asname or alias.name] = (statement.module, alias.name)
    return names


_TABLES: dict[str, dict[str, tuple[str, str]]] = {}  # package -> its exported_names, read on first use


class LazyPackage(types.ModuleType):
    """The class of a package module whose public names load on first use (set by `lazy_exports`)."""

    def _exports(self) -> dict[str, tuple[str, str]]:
        table = _TABLES.get(self.__name__)
        if table is None:  # read once, on the first lazy access: importing the package parses nothing
            assert self.__file__ is not None  # a package __init__ has a file
            table = _TABLES[self.__name__] = exported_names(self.__file__)
        return table

    def __getattr__(self, name: str) -> object:
        found = self._exports().get(name) if not name.startswith("__") else None
        if found is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        module, attribute = found
        if module == self.__name__:  # `from hugerec import data`: a subpackage of this package
            value: object = importlib.import_module(f"{module}.{attribute}")
        else:
            value = getattr(importlib.import_module(module), attribute)
        setattr(self, name, value)  # the next access finds it without coming here
        return value

    def __setattr__(self, name: str, value: object) -> None:
        """Importing a submodule binds it on its package (`hugerec.data.prepare = <module>`); where the
        package exports a name of that submodule under the module's name (the function `prepare` of
        prepare.py), the exported name wins, as it did when the package imported it eagerly."""
        if isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            found = self._exports().get(name)
            if found is not None and found[0] == value.__name__:
                value = getattr(value, found[1])
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._exports()})


def lazy_exports(package: str) -> None:
    """Makes the package `package` (call it last in its `__init__`: `lazy_exports(__name__)`) load the names
    imported in its `if TYPE_CHECKING:` block on first use (see the module docstring). An unknown name
    raises AttributeError as a module without it would."""
    sys.modules[package].__class__ = LazyPackage
