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

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (the app needs FastAPI and Jinja2; the catalog does not).
if TYPE_CHECKING:
    from ._app import PREFIX as PREFIX
    from ._app import create_dashboard as create_dashboard
    from ._app import create_server_app as create_server_app
    from ._app import mount_dashboard as mount_dashboard
    from ._catalog import DEFAULT_PORT as DEFAULT_PORT
    from ._catalog import STORE_FILE as STORE_FILE
    from ._catalog import Catalog as Catalog

__getattr__, __dir__, __all__ = lazy_face(__name__)
