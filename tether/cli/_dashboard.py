"""``tether dashboard``: its flags (what it runs: ``_dashboard_run.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli._app import LogLevelOpt, app, console, setup_logging


@app.command()
def dashboard(
    store: Annotated[
        Path | None, typer.Option(help="One SQLite trace store file (instead of --dir).")
    ] = None,
    dir: Annotated[
        Path, typer.Option("--dir", help="A folder of runs: every NAME/traces.sqlite in it.")
    ] = Path("runs"),
    host: Annotated[
        str, typer.Option(help="Address to bind; others than loopback need TETHER_ADMIN_KEY.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8322,
    log_level: LogLevelOpt = "warning",
) -> None:
    """Watch runs in a browser: curves, rollouts and tokens, live.

    Serves http://127.0.0.1:8322/ui/ (every run under --dir, or one --store) until
    Ctrl-C; log in with the admin key. Tokens are coloured by their logprob.
    """
    setup_logging(log_level)
    from tether.cli._dashboard_run import run_dashboard

    run_dashboard(store, dir, host, port, console)
