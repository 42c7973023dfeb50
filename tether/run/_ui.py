"""The dashboard at ``/ui`` of a training run's gateway, over the run's own store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tether.dashboard import PREFIX, Catalog, mount_dashboard

__all__ = ["mount_ui", "ui_line"]


def mount_ui(app: Any, run_dir: Path, name: str, admin_key: str, tokenizer: Any) -> Catalog:
    """Mount the dashboard of run ``name`` (its folder ``run_dir``) on ``app`` (the run's
    gateway app), logged into with ``admin_key``; the catalog to close at the end."""
    catalog = Catalog.of_file(run_dir / "traces.sqlite", key=name)
    mount_dashboard(app, catalog, admin_key, tokenizers=lambda _key, _run: tokenizer)
    return catalog


def ui_line(url: str, how: str) -> str:
    """``dashboard: URL  (log in with the admin key: HOW)``; ``how`` from
    :class:`~tether.gateway.AdminKey`."""
    return f"dashboard: {url.rstrip('/')}{PREFIX}/  (log in with the admin key: {how})"
