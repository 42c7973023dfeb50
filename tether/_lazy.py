"""Lazy package exports: a package names what it exports and the module each lives in,
and a name's module is imported on first use (PEP 562), so importing the package stays
cheap (e.g. ``tether.starter.calc`` without torch, ``tether.gateway`` without FastAPI)::

    __getattr__, __dir__ = lazy_exports(__name__, {"TrainingRun": "tether.run._loop"})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
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
        # itself (TYPE_CHECKING, lazy_exports, annotations)
        own = vars(sys.modules[package])
        shown = {n for n, v in own.items() if n.startswith("_") or _submodule(v, package)}
        return sorted(shown | set(exports))

    return __getattr__, __dir__


def _submodule(value: Any, package: str) -> bool:
    return isinstance(value, ModuleType) and value.__name__.startswith(package + ".")
