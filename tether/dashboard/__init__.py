"""A local web dashboard over trace stores: runs, live curves, rollouts, tokens.

::

    tether dashboard --dir runs            # http://127.0.0.1:8322/ui/, every run under runs/

and the same pages at ``/ui`` of a running ``tether serve`` or ``tether train``
gateway. Stores are opened read-only; the pages need the admin key (a login
form; a session cookie that is HttpOnly and SameSite=Strict). See
docs/dashboard.md.

- :class:`Catalog`: which stores are shown, by key;
- :func:`create_dashboard`: the dashboard's ASGI app (mount it where you like);
- :func:`mount_dashboard`: mount it at ``/ui`` of a gateway app;
- :func:`create_server_app`: ``tether dashboard``'s app (``/`` redirects to ``/ui/``).

The app needs FastAPI (tether's own dependency) and Jinja2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tether._lazy import lazy_exports
from tether.dashboard._catalog import STORE_FILE, Catalog

if TYPE_CHECKING:
    from tether.dashboard._app import PREFIX, create_dashboard, create_server_app, mount_dashboard

__all__ = [
    "DEFAULT_PORT",
    "PREFIX",
    "STORE_FILE",
    "Catalog",
    "create_dashboard",
    "create_server_app",
    "mount_dashboard",
]

#: ``tether dashboard``'s port when ``--port`` is not given (the gateway's is 8321).
DEFAULT_PORT = 8322

_LAZY = {
    "PREFIX": "tether.dashboard._app",
    "create_dashboard": "tether.dashboard._app",
    "create_server_app": "tether.dashboard._app",
    "mount_dashboard": "tether.dashboard._app",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
