"""The app that answers while the model loads: ``tether serve`` listens first.

``tether serve`` binds its port and starts serving before the model has loaded
(a cold start builds the starter model first, minutes). Until :meth:`LoadingApp.ready`
hands it the real app, ``GET /healthz`` answers 503 ``{"status": "loading"}`` and
every other request 503 with an OpenAI error body (:class:`ModelLoading`; the
official clients retry a 503), so a health check or an agent started early waits
instead of seeing a refused connection or a 404. Then every request goes to the
real app, unchanged. A plain ASGI callable: it imports neither FastAPI nor uvicorn.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .._errors import ModelLoading
from .status import error_body, http_error

__all__ = ["LoadingApp"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Seconds a client is asked to wait before it retries (``Retry-After``).
RETRY_AFTER_S = 5


class LoadingApp:
    """An ASGI app: "loading" answers until :meth:`ready`, then the real app."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None

    def ready(self, app: ASGIApp) -> None:
        """From now on every request goes to ``app``."""
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        if app is not None:
            await app(scope, receive, send)
            return
        if scope["type"] != "http":  # lifespan is off; a websocket is closed unanswered
            return
        api = http_error(
            ModelLoading("the model is still loading: retry when GET /healthz answers 200")
        )
        assert api is not None
        if scope["path"] == "/healthz":
            body: dict[str, Any] = {"status": "loading"}
        else:
            body = error_body(api.status, api.message, code="model_loading")
        headers = [
            (b"content-type", b"application/json"),
            (b"retry-after", str(RETRY_AFTER_S).encode()),
        ]
        await send({"type": "http.response.start", "status": api.status, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})
