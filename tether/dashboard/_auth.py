"""The dashboard's login: the admin key, once, in a form; then a session cookie.

- The key is sent once, in the body of ``POST /ui/login``; it never appears in a
  URL, a page or a log. A right key gets a random session token (256 bits) in a
  cookie that is ``HttpOnly`` (scripts cannot read it), ``SameSite=Strict`` (the
  browser sends it only on requests from the dashboard's own pages) and scoped to
  ``/ui``; the server keeps only its SHA-256 hash, for ``SESSION_S`` seconds.
- Every POST must also come from the dashboard's own origin (``Origin``, else
  ``Sec-Fetch-Site: same-origin``): a page elsewhere cannot log the browser in or
  out (CSRF), even where a browser ignores ``SameSite``.
- Comparisons are constant-time; sessions end at logout, expiry, or a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict

__all__ = ["COOKIE", "SESSION_S", "Sessions", "safe_next", "same_origin"]

COOKIE = "tether_ui"
SESSION_S = 12 * 3600
MAX_SESSIONS = 1000


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class Sessions:
    """Logged-in browsers of one dashboard, checked against one admin key."""

    def __init__(self, admin_key: str, ttl_s: float = SESSION_S):
        if not admin_key:
            raise ValueError("the dashboard needs an admin key")
        self._key = _hash(admin_key)
        self.ttl_s = ttl_s
        self._live: OrderedDict[str, float] = OrderedDict()  # token hash -> expiry
        self._lock = threading.Lock()

    def key_ok(self, given: str) -> bool:
        return bool(given) and hmac.compare_digest(_hash(given), self._key)

    def start(self) -> str:
        """A new session's token (for the cookie)."""
        token = secrets.token_urlsafe(32)
        with self._lock:
            while len(self._live) >= MAX_SESSIONS:
                self._live.popitem(last=False)
            self._live[_hash(token)] = time.time() + self.ttl_s
        return token

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        h = _hash(token)
        with self._lock:
            expiry = self._live.get(h)
            if expiry is None:
                return False
            if expiry < time.time():
                del self._live[h]
                return False
            return True

    def end(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._live.pop(_hash(token), None)


def same_origin(headers: dict[str, str], scheme: str) -> bool:
    """Whether a POST comes from a page of this server: its ``Origin`` is this host, or
    (no ``Origin``, or an opaque ``null`` one) the browser says ``Sec-Fetch-Site:
    same-origin`` (a header no script can set). Neither: refused."""
    host = headers.get("host")
    origin = headers.get("origin")
    if origin is not None and origin != "null":
        return bool(host) and hmac.compare_digest(origin, f"{scheme}://{host}")
    return headers.get("sec-fetch-site") == "same-origin"


def safe_next(value: str | None, base: str) -> str:
    """Where to go after logging in: a path of the dashboard itself, else its front page
    (never another site: no ``//host``, no scheme, no backslash)."""
    home = base + "/"
    if not value or not value.startswith(home) or "//" in value or "\\" in value:
        return home
    if any(ord(ch) < 0x20 for ch in value):
        return home
    return value
