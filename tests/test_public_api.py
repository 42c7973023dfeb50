"""Every package's face: one listing names exactly what the package shows.

A package's ``__init__.py`` names each export once: as a plain import where importing
it is cheap (with ``__all__``, as httpx does), or, where a lazy import saves real
time (torch, FastAPI), as an import under ``TYPE_CHECKING`` that :mod:`tether._lazy`
reads for ``__all__`` and the lazy loader.
In the spirit of httpx's ``test_exports``:

- ``__all__`` is the face's names, without duplicates;
- every name resolves, to the object of that name in its module;
- the ``__init__`` shows no other public name (it defines nothing public of its own).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = sorted(f"tether.{p.parent.name}" for p in (ROOT / "tether").glob("*/__init__.py"))
# Public top-level modules that name their exports too.
MODULES = ["tether.records", "tether.errors", "tether.configio"]

# Names an ``__init__`` may define or import without exporting them.
NOT_EXPORTS = {"annotations", "TYPE_CHECKING", "Any", "lazy_face"}


def _source(name: str) -> Path:
    path = ROOT.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _absolute(package: str, module: str, level: int) -> str:
    return package + "." + module if level else module


def _type_checking_imports(package: str) -> dict[str, str]:
    """name → absolute module of the imports under ``if TYPE_CHECKING:``."""
    found: dict[str, str] = {}
    for node in ast.parse(_source(package).read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom), f"{package}: only imports there"
                for a in imp.names:
                    found[a.asname or a.name] = _absolute(package, imp.module or "", imp.level)
    return found


def _plain_imports(package: str) -> dict[str, str]:
    """name → absolute module of the package's own top-level relative imports."""
    found: dict[str, str] = {}
    for node in ast.parse(_source(package).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            for a in node.names:
                name = a.asname or a.name
                if not name.startswith("_"):
                    found[name] = _absolute(package, node.module or "", node.level)
    return found


def _own_names(name: str) -> set[str]:
    """Public names the module defines or imports (anywhere in its top level)."""
    tree = ast.parse(_source(name).read_text())
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level > 0 or (node.module or "").startswith(name + "."):
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


def _table(package: str) -> dict[str, str]:
    """The package's face, name → absolute module: its ``TYPE_CHECKING`` imports where it
    loads lazily, else its plain imports."""
    return _type_checking_imports(package) or _plain_imports(package)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_the_table(package: str) -> None:
    module = importlib.import_module(package)
    assert len(set(module.__all__)) == len(module.__all__), f"{package}.__all__ has duplicates"
    assert sorted(module.__all__) == sorted(_table(package)), f"{package}: __all__ != its face"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_lists_its_face_once(package: str) -> None:
    """Either plain imports or imports under TYPE_CHECKING (read lazily), never both."""
    lazy, plain = _type_checking_imports(package), _plain_imports(package)
    assert bool(lazy) != bool(plain), f"{package}: its face is listed as both or neither"
    if lazy:
        assert list(importlib.import_module(package).__all__) == list(lazy)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_resolves_to_its_module(package: str) -> None:
    module = importlib.import_module(package)
    for name, home in _table(package).items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), name


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


def test_the_checks_see_a_drifted_table() -> None:
    """The faces are read as written: plain, lazy, or a table beside its imports."""
    assert _table("tether.store")["Store"] == "tether.store._store"
    assert _plain_imports("tether.store")["Store"] == "tether.store._store"
    assert _type_checking_imports("tether.gateway")["Gateway"] == "tether.gateway._core.gateway"
    assert _table("tether.gateway")["Gateway"] == "tether.gateway._core.gateway"
    assert _absolute("tether.store", "_codec", 1) != _table("tether.store")["Store"]


LAZY = [p for p in PACKAGES if hasattr(importlib.import_module(p), "__getattr__")]


@pytest.mark.parametrize("package", LAZY)
def test_dir_shows_the_face_not_the_inits_own_imports(package: str) -> None:
    """A lazy package's dir() lists its face before it is loaded (a plain one's is Python's)."""
    shown = {n for n in dir(importlib.import_module(package)) if not n.startswith("_")}
    assert set(importlib.import_module(package).__all__) <= shown
    assert not shown & {"TYPE_CHECKING", "lazy_face", "annotations"}
