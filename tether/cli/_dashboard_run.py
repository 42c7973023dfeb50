"""``tether dashboard``: the dashboard over a folder of runs or one store file.

::

    tether dashboard                       # every run under runs/, http://127.0.0.1:8322/ui/
    tether dashboard --store .tether/traces.sqlite --port 9000

The admin key is ``TETHER_ADMIN_KEY``, else (on loopback) the key file next to the
runs or the store: ``runs/admin_key`` (the one ``tether train`` uses) or
``.tether/admin_key`` (``tether serve``'s), made once, mode 600
(:func:`tether.gateway.resolve_admin_key`, the rule of every command).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from tether.errors import UserError

__all__ = ["run_dashboard", "tokenizer_finder"]


def _model_folder(run: Any) -> Path | None:
    """The folder of a run's tokenizer: its config's model (the starter's cached folder for
    ``starter``), else its newest checkpoint; None when neither is on this machine."""
    from tether.starter import is_starter, starter_path

    cfg = run.config or {}
    model = cfg.get("model")
    path = model.get("path") if isinstance(model, dict) else model
    candidates: list[Path] = []
    if path == "starter":
        candidates.append(starter_path(warm=True))
    elif isinstance(path, str) and path:
        candidates.append(Path(path))
    for p in candidates:
        if p.is_dir() and (is_starter(p) or (p / "tokenizer_config.json").is_file()):
            return p
    return None


def tokenizer_finder() -> Any:
    """``(store key, run) -> tokenizer or None`` for the dashboard, one load per folder
    (transformers is imported on the first rollout page, not at start)."""
    cache: dict[Path, Any] = {}
    lock = threading.Lock()

    def find(_key: str, run: Any) -> Any:
        folder = _model_folder(run)
        if folder is None:
            return None
        with lock:
            if folder not in cache:
                from tether.models import load_tokenizer

                try:
                    cache[folder] = load_tokenizer(folder)
                except Exception:  # an unreadable folder: show token ids instead
                    cache[folder] = None
            return cache[folder]

    return find


def run_dashboard(
    store: Path | None, runs_dir: Path, host: str, port: int, console: Console
) -> None:
    """Serve the dashboard until stopped (Ctrl-C)."""
    from tether.dashboard import PREFIX, Catalog, create_server_app
    from tether.gateway import make_server, resolve_admin_key

    if store is not None:
        if not store.is_file():
            raise UserError(f"no trace store at {store}: pass --store FILE, or --dir with runs")
        catalog = Catalog.of_file(store)
        key = resolve_admin_key(host, store.parent)
        what = f"store {store}"
    else:
        catalog = Catalog(runs_dir=runs_dir)
        key = resolve_admin_key(host, runs_dir)
        what = f"every run under {runs_dir}/" + ("" if runs_dir.is_dir() else " (none yet)")
    shown = f"[{host}]" if ":" in host else host
    console.print(f"tether dashboard on http://{shown}:{port}{PREFIX}/  ({what})", soft_wrap=True)
    console.print(f"log in with the admin key: {key.how}", soft_wrap=True, highlight=False)
    from tether.trainer import algorithms, build_samples  # torch now, not on the first page

    del algorithms, build_samples
    app = create_server_app(catalog, key.value, tokenizer_finder())
    try:
        make_server(app, host, port, log_level="warning").run()
    finally:
        catalog.close()
