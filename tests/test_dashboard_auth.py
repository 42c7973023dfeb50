"""The dashboard's login and its attacks, in-process (the ASGI app through httpx), and the
``tether dashboard`` command as a subprocess: its key file, an open bind, a missing store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.dashboard_stores import (
    KEY,
    ORIGIN,
    client,
    login,
)
from tests.helpers import TETHER, free_port
from tether.dashboard import Catalog, create_server_app, mount_dashboard

# -- the login and its attacks -----------------------------------------------------------


def _routes(app: Any) -> list[tuple[str, str]]:
    out = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method != "HEAD":
                out.append((method, route.path))
    return out


def test_every_route_but_login_and_static_files_refuses_without_a_session(runs_dir: Path) -> None:
    """Enumerated from the app, so a page added later without the check fails here."""
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)
    dashboard = next(r.app for r in app.routes if getattr(r, "path", "") == "/ui")
    routes = _routes(dashboard)
    assert len(routes) >= 8

    async def go() -> None:
        async with client(app) as c:
            for method, path in routes:
                url = "/ui" + path.format(key="good", run_id="good-1", rollout_id="good-1-s0-g0-0")
                for cookies in ({}, {"tether_ui": "forged"}, {"tether_ui": KEY}):
                    c.cookies.clear()
                    for k, v in cookies.items():
                        c.cookies.set(k, v)
                    r = await c.request(method, url, headers={"Origin": ORIGIN})
                    if path == "/login":
                        assert r.status_code in (200, 401), (method, path)
                        continue
                    assert r.status_code == 401, (method, path, cookies, r.status_code)
                    shown = r.text.replace(url, "")  # the login form's "next" is the URL
                    assert "good-1" not in shown and "reward" not in shown.lower()
                    if url.endswith(".json"):
                        assert r.json()["error"] == "log in to the dashboard first"
                    else:  # the login form (a page: at its URL, coming back here after)
                        assert 'name="key"' in r.text
                        assert method == "POST" or f'value="{url}"' in r.text
            c.cookies.clear()
            feed = "/ui/s/good/run/good-1/metrics.json?after=oops"
            assert (await c.get(feed)).status_code == 401  # the session before the query
            assert (await login(c)).status_code == 303
            bad = await c.get(feed)
            assert bad.status_code == 400 and "after ('oops')" in bad.json()["error"]
            c.cookies.clear()
            static = await c.get("/ui/static/app.js")
            assert static.status_code == 200 and "textContent" in static.text

    asyncio.run(go())


def test_login_sets_a_strict_httponly_cookie_and_logout_ends_the_session(runs_dir: Path) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)

    async def go() -> None:
        async with client(app) as c:
            wrong = await login(c, "not-the-key")
            assert wrong.status_code == 401 and "wrong admin key" in wrong.text
            assert "set-cookie" not in wrong.headers and "not-the-key" not in wrong.text
            r = await c.post(
                "/ui/login", data={"key": KEY, "next": "/ui/s/good/run/good-1"},
                headers={"Origin": ORIGIN},
            )  # fmt: skip
            assert r.status_code == 303 and r.headers["location"] == "/ui/s/good/run/good-1"
            cookie = r.headers["set-cookie"]
            for flag in ("HttpOnly", "SameSite=strict", "Path=/ui/", "Max-Age="):
                assert flag in cookie, cookie
            assert KEY not in cookie and KEY not in r.headers["location"]
            token = c.cookies.get("tether_ui")
            page = await c.get("/ui/s/good/run/good-1")
            assert page.status_code == 200 and KEY not in page.text
            for name, value in {
                "content-security-policy": "script-src 'self'",
                "x-frame-options": "DENY",
                "x-content-type-options": "nosniff",
                "cache-control": "no-store",
                "referrer-policy": "same-origin",
            }.items():
                assert value in page.headers[name]
            # logging out needs the same origin too; then the old token is dead
            assert (
                await c.post("/ui/logout", headers={"Origin": "http://evil.example"})
            ).status_code == 403
            out = await c.post("/ui/logout", headers={"Origin": ORIGIN})
            assert out.status_code == 303 and out.headers["location"] == "/ui/login"
            c.cookies.clear()
            c.cookies.set("tether_ui", token)
            assert (await c.get("/ui/")).status_code == 401

    asyncio.run(go())


def test_posts_from_another_origin_and_open_redirects_are_refused(runs_dir: Path) -> None:
    app = create_server_app(Catalog(runs_dir=runs_dir), KEY)

    async def go() -> None:
        async with client(app) as c:
            for headers in (
                {"Origin": "http://evil.example"},
                {"Origin": "null"},
                {},  # neither Origin nor Sec-Fetch-Site: not known to be ours
                {"Sec-Fetch-Site": "cross-site"},
            ):
                r = await c.post("/ui/login", data={"key": KEY}, headers=headers)
                assert r.status_code == 403 and "set-cookie" not in r.headers, headers
            r = await c.post(
                "/ui/login", data={"key": KEY}, headers={"Sec-Fetch-Site": "same-origin"}
            )
            assert r.status_code == 303
            for evil in ("//evil.example/x", "https://evil.example", "/ui/\\evil", "/elsewhere"):
                r = await c.post(
                    "/ui/login", data={"key": KEY, "next": evil}, headers={"Origin": ORIGIN}
                )
                assert r.headers["location"] == "/ui/", evil
            big = await c.post(
                "/ui/login", content=b"key=" + b"k" * 20000, headers={"Origin": ORIGIN,
                "Content-Type": "application/x-www-form-urlencoded"},
            )  # fmt: skip
            assert big.status_code == 400

    asyncio.run(go())


def test_mounted_on_a_gateway_app_it_keeps_its_own_login(runs_dir: Path) -> None:
    from fastapi import FastAPI

    gateway_like = FastAPI()

    @gateway_like.get("/healthz")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    mount_dashboard(gateway_like, Catalog.of_file(runs_dir / "good" / "traces.sqlite"), KEY)

    async def go() -> None:
        async with client(gateway_like) as c:
            assert (await c.get("/ui/")).status_code == 401
            assert (await c.get("/healthz")).status_code == 200
            assert (await login(c)).status_code == 303
            page = await c.get("/ui/")
            assert page.status_code == 200 and "/ui/s/good/run/good-1" in page.text

    asyncio.run(go())


# -- tether dashboard, the command ---------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "TETHER_ADMIN_KEY"}, **extra}


def test_tether_dashboard_serves_a_runs_folder_with_the_key_file_it_names(runs_dir: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [*TETHER, "dashboard", "--dir", str(runs_dir), "--port", str(port)],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None
                time.sleep(0.2)
        key_file = runs_dir / "admin_key"
        assert key_file.stat().st_mode & 0o777 == 0o600
        with httpx.Client(base_url=base) as c:
            assert c.get("/", follow_redirects=True).status_code == 401
            r = c.post("/ui/login", data={"key": key_file.read_text().strip()},
                       headers={"Origin": base})  # fmt: skip
            assert r.status_code == 303
            page = c.get("/ui/")
            assert page.status_code == 200 and "crashed" in page.text and "good" in page.text
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert f"tether dashboard on {base}/ui/  (every run under {runs_dir}/)" in out, out
    assert f"log in with the admin key: cat {runs_dir / 'admin_key'}" in out, out
    assert key_file.read_text().strip() not in out


def test_tether_dashboard_refuses_an_open_bind_without_a_key_and_a_missing_store(
    tmp_path: Path,
) -> None:
    for args, message in (
        (["--host", "0.0.0.0"], "refusing to bind 0.0.0.0 without an admin key"),
        (["--store", str(tmp_path / "nope.sqlite")], "no trace store at"),
    ):
        r = subprocess.run([*TETHER, "dashboard", "--dir", str(tmp_path), *args],
                           capture_output=True, text=True, timeout=120, env=_env())  # fmt: skip
        assert r.returncode == 2 and message in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
