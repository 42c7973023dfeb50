"""The generated reference pages of the docs site are up to date: the CLI reference from
the typer app, the HTTP reference from the gateway's OpenAPI schema (docs/config.md is
checked by tests/test_cli_config.py). ``make docs`` builds the site strictly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _dev(name: str) -> ModuleType:
    """A generator script of dev/ (not a package), loaded from its file."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "dev" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_is_generated_from_the_app() -> None:
    from tether.cli import app

    page = ROOT / "docs" / "reference" / "cli.md"
    assert page.read_text() == _dev("clidoc").cli_markdown(app), (
        "docs/reference/cli.md is out of date: regenerate it with "
        "`.venv/bin/python dev/clidoc.py > docs/reference/cli.md`"
    )


def test_the_http_reference_is_generated_from_the_openapi_schema() -> None:
    from tether.gateway import create_app

    schema = create_app(None).openapi()  # type: ignore[arg-type]
    page = ROOT / "docs" / "reference" / "http.md"
    assert page.read_text() == _dev("httpdoc").http_markdown(schema), (
        "docs/reference/http.md is out of date: regenerate it with "
        "`.venv/bin/python dev/httpdoc.py > docs/reference/http.md`"
    )


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    missing = [p for p in pages if f" {p}\n" not in nav]
    assert not missing, f"docs pages missing from mkdocs.yml's nav: {missing}"
