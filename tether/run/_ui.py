"""The dashboard at ``/ui`` of a training run's gateway, over the run's own store."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tether.dashboard import PREFIX, Catalog, mount_dashboard
from tether.run._setup import admin_key_path

if TYPE_CHECKING:
    from tether.run._loop import TrainingRun

__all__ = ["mount_ui", "ui_line"]


def mount_ui(app: Any, run: TrainingRun) -> Catalog:
    """Mount the dashboard on ``app`` (the run's gateway app); the catalog to close at the end."""
    catalog = Catalog.of_file(run.run_dir / "traces.sqlite", key=run.cfg.name)
    key = run.gateway.config.admin_key
    assert key, "gateway_config always sets an admin key"
    mount_dashboard(app, catalog, key, tokenizers=lambda _key, _run: run.tokenizer)
    return catalog


def ui_line(run: TrainingRun, url: str) -> str:
    """``dashboard: URL  (log in with the admin key: HOW)``."""
    path = admin_key_path(run.cfg)
    if path is not None:
        how = f"cat {path}"
    elif os.environ.get("TETHER_ADMIN_KEY"):
        how = "$TETHER_ADMIN_KEY"
    elif run.cfg.gateway.admin_key:
        how = "gateway.admin_key of the config"
    else:
        how = "none was given: set TETHER_ADMIN_KEY to log in"
    return f"dashboard: {url.rstrip('/')}{PREFIX}/  (log in with the admin key: {how})"
