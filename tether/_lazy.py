"""Lazy package exports: a name's module is imported on first use (PEP 562), so importing
the package stays cheap (e.g. ``tether.starter.calc`` without torch, ``tether.gateway``
without FastAPI). A package names each export once, as an import for type checkers, and
:func:`lazy_face` reads those imports (as ``lazy_loader.attach_stub`` reads a stub)::

    if TYPE_CHECKING:  # the face, imported on first use (tether._lazy)
        from ._app import create_app as create_app

    __getattr__, __dir__, __all__ = lazy_face(__name__)

A package whose exports are cheap to import imports them plainly, with ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["lazy_face"]


def _loader(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's ``__getattr__`` and ``__dir__`` for ``exports`` (name → module).

    A name, once imported, is stored in the package's globals, so later lookups
    are plain attribute reads.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        # the face, the submodules and the dunders; not what the __init__ imports for
        # itself (TYPE_CHECKING, lazy_face, annotations)
        own = vars(sys.modules[package])
        shown = {n for n, v in own.items() if n.startswith("_") or _submodule(v, package)}
        return sorted(shown | set(exports))

    return __getattr__, __dir__


def lazy_face(
    package: str,
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The package's ``__getattr__``, ``__dir__`` and ``__all__`` from the relative imports
    under ``if TYPE_CHECKING:`` in its ``__init__.py`` (name → module, in that order)."""
    exports = type_checking_imports(package)
    return (*_loader(package, exports), list(exports))


def type_checking_imports(package: str) -> dict[str, str]:
    """name → module (absolute) of the imports under ``if TYPE_CHECKING:`` in the
    package's ``__init__.py``."""
    path = sys.modules[package].__file__
    assert path is not None, f"{package} has no source to read its face from"
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    home = importlib.util.resolve_name(
                        "." * imp.level + (imp.module or ""), package
                    )
                    found.update((a.asname or a.name, home) for a in imp.names)
    return found


def _submodule(value: Any, package: str) -> bool:
    return isinstance(value, ModuleType) and value.__name__.startswith(package + ".")
