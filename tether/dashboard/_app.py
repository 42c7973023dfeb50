"""The dashboard's ASGI app: login, the four pages, the live metrics feed, static files.

Mounted at ``/ui`` (by :func:`mount_dashboard` on a gateway app, or by
:func:`create_server_app` for ``tether dashboard``). Every route but the login
form and the static files needs a session (:mod:`._auth`); a page without one
answers 401 with the login form, a JSON route 401 with an error.
Page handlers are plain functions: FastAPI runs them on its thread pool, so
reads of a store never hold up a gateway that shares the event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from tether.dashboard import _pages as pages
from tether.dashboard._auth import COOKIE, Sessions, safe_next, same_origin
from tether.dashboard._catalog import Catalog
from tether.dashboard._render import render
from tether.dashboard._rollout_page import rollout_page
from tether.dashboard._rollouts_page import rollouts_page

__all__ = ["PREFIX", "create_dashboard", "create_server_app", "mount_dashboard"]

PREFIX = "/ui"
STATIC = Path(__file__).parent / "static"
MAX_FORM_BYTES = 8192
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # not no-referrer: under it a browser sends "Origin: null" on the login form's POST
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}

Tokenizers = Callable[[str, Any], Any]  # (store key, Run) -> a tokenizer or None


class NeedLogin(Exception):
    pass


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def create_dashboard(
    catalog: Catalog, admin_key: str, tokenizers: Tokenizers | None = None
) -> FastAPI:
    """The dashboard app over ``catalog``'s stores, for whoever holds ``admin_key``.

    ``tokenizers(store_key, run)`` gives the tokenizer that shows a run's tokens as
    text (None: token ids, or the token texts the gateway returned).
    """
    sessions = Sessions(admin_key)
    app = FastAPI(title="tether dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.catalog, app.state.sessions = catalog, sessions
    app.state.tokenizers = tokenizers or (lambda key, run: None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.middleware("http")(_headers)
    _add_error_pages(app)
    _add_login(app, sessions)
    _add_pages(app, catalog, sessions)
    return app


async def _headers(request: Request, call_next: Any) -> Response:
    response = await call_next(request)
    response.headers.update(SECURITY_HEADERS)
    if not request.url.path.startswith(_base(request) + "/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def _error_page(request: Request, title: str, message: str, status: int) -> HTMLResponse:
    return HTMLResponse(
        render("error.html", base=_base(request), title=title, message=message),
        status_code=status,
    )


def _add_error_pages(app: FastAPI) -> None:
    """What a missing session, page or store, a cross-origin POST and a bad query get."""

    @app.exception_handler(NeedLogin)
    async def _login_first(request: Request, _: NeedLogin) -> Response:
        if request.url.path.endswith(".json"):
            return JSONResponse({"error": "log in to the dashboard first"}, status_code=401)
        return _login_page(request, 401, None)

    @app.exception_handler(pages.NotFoundPage)
    async def _not_found(request: Request, exc: pages.NotFoundPage) -> Response:
        return _error_page(request, "not found", str(exc), 404)

    @app.exception_handler(pages.Forbidden)
    async def _forbidden(request: Request, _: pages.Forbidden) -> Response:
        return Response(
            "refused: a POST to the dashboard must come from its own pages (same origin)\n",
            status_code=403,
            media_type="text/plain",
        )

    @app.exception_handler(pages.BadQuery)
    async def _bad(request: Request, exc: pages.BadQuery) -> Response:
        return _error_page(request, "bad request", str(exc), 400)


def _add_login(app: FastAPI, sessions: Sessions) -> None:
    """``/login`` (the form, and its POST that starts a session) and ``/logout``."""

    @app.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str | None = None) -> Response:
        if sessions.valid(request.cookies.get(COOKIE)):
            return RedirectResponse(safe_next(next, _base(request)), status_code=303)
        return _login_page(request, 200, None, next)

    @app.post("/login")
    async def login(request: Request) -> Response:
        _check_origin(request)
        form = await _form(request)
        base = _base(request)
        if not sessions.key_ok(form.get("key", "")):
            return _login_page(request, 401, "wrong admin key", form.get("next"))
        response = RedirectResponse(safe_next(form.get("next"), base), status_code=303)
        response.set_cookie(
            COOKIE,
            sessions.start(),
            max_age=int(sessions.ttl_s),
            path=base + "/" if base else "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        _check_origin(request)
        _need_session(sessions, request)
        sessions.end(request.cookies.get(COOKIE))
        base = _base(request)
        response = RedirectResponse(base + "/login", status_code=303)
        response.delete_cookie(COOKIE, path=base + "/" if base else "/")
        return response


def _need_session(sessions: Sessions, request: Request) -> None:
    if not sessions.valid(request.cookies.get(COOKIE)):
        raise NeedLogin()


def _page(template: str, request: Request, context: dict[str, Any]) -> HTMLResponse:
    return HTMLResponse(render(template, base=_base(request), **context))


def _add_pages(app: FastAPI, catalog: Catalog, sessions: Sessions) -> None:
    """The four pages and the live metrics feed; each checks the session first (so even a
    malformed query gets a 401 without one)."""

    @app.get("/", response_class=HTMLResponse)
    def runs(request: Request) -> Response:
        _need_session(sessions, request)
        return _page("runs.html", request, pages.runs_page(catalog))

    @app.get("/s/{key}/run/{run_id}", response_class=HTMLResponse)
    def run(request: Request, key: str, run_id: str) -> Response:
        _need_session(sessions, request)
        return _page("run.html", request, pages.run_page(catalog, key, run_id))

    @app.get("/s/{key}/run/{run_id}/metrics.json")
    def metrics(request: Request, key: str, run_id: str) -> Response:
        _need_session(sessions, request)
        raw = request.query_params.get("after") or "0"
        if not raw.isdigit():
            return JSONResponse({"error": f"after ({raw!r}) must be a row id >= 0"}, 400)
        data = pages.metrics_feed(catalog, key, run_id, int(raw))
        return Response(json.dumps(data, allow_nan=False), media_type="application/json")

    @app.get("/s/{key}/run/{run_id}/rollouts", response_class=HTMLResponse)
    def rollouts(request: Request, key: str, run_id: str) -> Response:
        _need_session(sessions, request)
        query = dict(request.query_params)
        return _page("rollouts.html", request, rollouts_page(catalog, key, run_id, query))

    @app.get("/s/{key}/rollout/{rollout_id}", response_class=HTMLResponse)
    def rollout(request: Request, key: str, rollout_id: str) -> Response:
        _need_session(sessions, request)
        context = rollout_page(catalog, key, rollout_id, app.state.tokenizers)
        return _page("rollout.html", request, context)


def _login_page(
    request: Request, status: int, error: str | None, next_path: str | None = None
) -> HTMLResponse:
    base = _base(request)
    if next_path is None and request.method == "GET" and not request.url.path.endswith("/login"):
        next_path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return HTMLResponse(
        render(
            "login.html", base=base, title="log in", error=error, next=safe_next(next_path, base)
        ),
        status_code=status,
    )


def _check_origin(request: Request) -> None:
    headers = {k.lower(): v for k, v in request.headers.items()}
    if not same_origin(headers, request.url.scheme):
        raise pages.Forbidden()


async def _form(request: Request) -> dict[str, str]:
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > MAX_FORM_BYTES:
            raise pages.BadQuery(f"form above {MAX_FORM_BYTES} bytes")
    try:
        parsed = parse_qs(body.decode("utf-8"), max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        raise pages.BadQuery("the form is not valid UTF-8 form data") from None
    return {k: v[0] for k, v in parsed.items() if v}


def mount_dashboard(
    app: Any, catalog: Catalog, admin_key: str, tokenizers: Tokenizers | None = None
) -> FastAPI:
    """Serve the dashboard at ``/ui`` of ``app`` (a gateway's FastAPI app); returns it."""
    dashboard = create_dashboard(catalog, admin_key, tokenizers)
    app.mount(PREFIX, dashboard)
    return dashboard


def create_server_app(
    catalog: Catalog, admin_key: str, tokenizers: Tokenizers | None = None
) -> FastAPI:
    """``tether dashboard``'s app: the dashboard at ``/ui``, ``/`` redirecting there."""
    root = FastAPI(title="tether dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    @root.get("/", include_in_schema=False)
    def _home() -> Response:
        return RedirectResponse(PREFIX + "/", status_code=303)

    @root.get("/healthz", include_in_schema=False)
    def _health() -> dict[str, str]:
        return {"status": "ok"}

    mount_dashboard(root, catalog, admin_key, tokenizers)
    return root
