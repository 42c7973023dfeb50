"""The ``tether`` command: a module per command. Nothing imports this package.

- ``_app.py``: the typer app, what the commands share (the store option, logging,
  signal handling) and :func:`main`, the console script (one line per error);
- a module per command parses its arguments: ``_serve.py`` (``tether serve``),
  ``_train.py`` (``demo``, ``train``, ``eval``), ``_check.py`` (``tether check``), ``_dashboard.py``, ``_rollouts.py``
  (``rollouts list|show``), ``_track.py`` (``export``, ``report``, ``tensorboard``), ``_config.py``
  (``tether config``: the config as commented YAML, docs/config.md);
- what a command runs is imported on first use, so ``tether --help`` loads neither
  torch nor FastAPI: ``_serve_run.py``, ``_train_run.py`` (with the live display,
  ``_progress.py``), ``_check_run.py`` (the checks ``check`` and ``train`` run), ``_dashboard_run.py``, ``_views.py`` and ``_stores.py``,
  ``_track_run.py``; ``_interrupt.py`` is the Ctrl-C / SIGTERM handling.

``python -m tether.cli`` runs it too (``__main__.py``).
"""

from __future__ import annotations

from ._app import app, main

# Each command module registers its commands on the app when imported; this order is
# the order of `tether --help`.
# isort: off
from tether.cli import _serve  # noqa: F401
from tether.cli import _train  # noqa: F401
from tether.cli import _check  # noqa: F401
from tether.cli import _dashboard  # noqa: F401
from tether.cli import _track  # noqa: F401
from tether.cli import _rollouts  # noqa: F401
from tether.cli import _config  # noqa: F401

# isort: on

__all__ = [
    "app",
    "main",
]
