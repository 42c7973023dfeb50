"""Every package's face: ``__all__`` lists exactly what the package shows.

One rule for every package (in the spirit of httpx's ``test_exports``), read from the
package's ``__init__.py`` with :mod:`ast` so that lazily imported names count too:

- every name in ``__all__`` can be imported from the package;
- every public name the ``__init__`` brings in from its own modules (directly, under
  ``TYPE_CHECKING`` for a lazy ``__getattr__``, or defined there) is in ``__all__``;
- ``__all__`` has no duplicates.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = [
    "tether.chat",
    "tether.dashboard",
    "tether.engine",
    "tether.gateway",
    "tether.runner",
    "tether.run",
    "tether.trainer",
    "tether.store",
    "tether.starter",
    "tether.tracking",
]
# Public top-level modules that name their exports too.
MODULES = ["tether.records", "tether.errors", "tether.configio"]

# Names an ``__init__`` may define or import without exporting them.
NOT_EXPORTS = {"annotations", "TYPE_CHECKING", "Any"}


def _source(name: str) -> Path:
    path = ROOT.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _own_names(name: str) -> set[str]:
    """Public names the module defines, or imports from within its own package."""
    tree = ast.parse(_source(name).read_text())
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            local = node.level > 0 or (node.module or "").startswith(name + ".")
            if local:
                own.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node in tree.body:
                own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node in tree.body:
            if _is_typevar(node.value):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in own if not n.startswith("_")} - NOT_EXPORTS


def _is_typevar(value: ast.expr | None) -> bool:
    return isinstance(value, ast.Call) and getattr(value.func, "id", "") == "TypeVar"


@pytest.mark.parametrize("name", PACKAGES + MODULES)
def test_all_is_the_public_face(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), f"{name}.__all__ has duplicates"
    for export in exported:
        assert getattr(module, export) is not None, f"{name}.{export}"
    missing = _own_names(name) - set(exported)
    assert not missing, f"{name} shows {sorted(missing)} but its __all__ does not list them"


@pytest.mark.parametrize("name", PACKAGES)
def test_unknown_names_raise_attribute_error(name: str) -> None:
    module = importlib.import_module(name)
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")  # noqa: B009
