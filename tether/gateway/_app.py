"""The ASGI app: the agents' OpenAI-compatible and Anthropic routes and the admin routes over
a Gateway.

The routes live in routers (``_api``: one package per dialect, and the admin routes);
what they share (body parsing, auth dependencies, error handlers) is in ``_http``; the
logic is :class:`Gateway`'s (``_core``).
"""

from __future__ import annotations

from fastapi import FastAPI

from tether import __version__

from ._api import admin as _admin_routes
from ._api.anthropic import routes as _messages
from ._api.openai import routes as _openai_routes
from ._api.responses import routes as _responses
from ._core.gateway import Gateway
from ._http.deps import install_handlers
from ._http.openapi import install_openapi

__all__ = ["create_app"]


def create_app(gw: Gateway) -> FastAPI:
    """Build the FastAPI app over a :class:`Gateway`."""
    app = FastAPI(
        title="tether gateway", version=__version__, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = gw
    install_handlers(app)
    install_openapi(app)
    app.include_router(_openai_routes.router)
    app.include_router(_responses.router)
    app.include_router(_messages.router)
    app.include_router(_admin_routes.router)
    return app
