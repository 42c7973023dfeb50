"""The dashboard at ``/ui`` of a training run's gateway, over the run's own store."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tether.dashboard import PREFIX, Catalog, mount_dashboard
from tether.run._setup import admin_key_path
from tether.run.config import TrainConfig

__all__ = ["mount_ui", "ui_line"]


def mount_ui(app: Any, run_dir: Path, name: str, admin_key: str, tokenizer: Any) -> Catalog:
    """Mount the dashboard of run ``name`` (its folder ``run_dir``) on ``app`` (the run's
    gateway app), logged into with ``admin_key``; the catalog to close at the end."""
    catalog = Catalog.of_file(run_dir / "traces.sqlite", key=name)
    mount_dashboard(app, catalog, admin_key, tokenizers=lambda _key, _run: tokenizer)
    return catalog


def ui_line(cfg: TrainConfig, url: str) -> str:
    """``dashboard: URL  (log in with the admin key: HOW)``."""
    path = admin_key_path(cfg)
    if path is not None:
        how = f"cat {path}"
    elif os.environ.get("TETHER_ADMIN_KEY"):
        how = "$TETHER_ADMIN_KEY"
    elif cfg.gateway.admin_key:
        how = "gateway.admin_key of the config"
    else:
        how = "none was given: set TETHER_ADMIN_KEY to log in"
    return f"dashboard: {url.rstrip('/')}{PREFIX}/  (log in with the admin key: {how})"
