"""Keys and per-rollout tokens.

Tokens are random (256 bits) and stored only as SHA-256 hashes, so a copy of
the trace store cannot be used to call the gateway. Comparisons are
constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from tether.records import RolloutStatus

from ._errors import ApiError

__all__ = ["Keys", "bearer", "check_rollout_id", "hash_token", "new_token"]

# Rollout ids travel in URLs and log lines: a conservative alphabet, no dots
# at the start (no "..", no hidden names), at most 128 bytes.
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def new_token() -> str:
    return "tr-" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_rollout_id(rollout_id: str) -> str:
    if not _ROLLOUT_ID.fullmatch(rollout_id) or ".." in rollout_id:
        raise ApiError(
            400,
            "invalid rollout id: use 1-128 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit",
            param="rollout_id",
        )
    return rollout_id


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class Keys:
    """The admin key and the record-mode keys."""

    def __init__(self, admin_key: str | None, record_keys: tuple[str, ...] = ()):
        self._admin = hash_token(admin_key) if admin_key else None
        self._record = {hash_token(k) for k in record_keys}

    def is_admin(self, token: str | None) -> bool:
        return bool(token and self._admin and hmac.compare_digest(hash_token(token), self._admin))

    def is_recorder(self, token: str | None) -> bool:
        if not token:
            return False
        h = hash_token(token)
        return any(hmac.compare_digest(h, k) for k in self._record)

    def require_admin(self, token: str | None) -> None:
        if token is None:
            raise ApiError(401, "missing bearer token: send 'Authorization: Bearer <admin key>'")
        if not self.is_admin(token):
            raise ApiError(401, "invalid admin key")


def check_rollout_token(
    token: str | None, auth: tuple[RolloutStatus, int, str | None] | None, keys: Keys
) -> int:
    """Authorize a call to one rollout; return its current attempt.

    401: no token, a wrong token, or a token whose rollout has ended.
    403: a valid key of another kind (the admin key, a record key) — agents'
    calls must carry their own rollout's token, so nothing is recorded under
    someone else's name.
    """
    if token is None:
        raise ApiError(401, "missing bearer token: set OPENAI_API_KEY to the rollout token")
    if auth is None:
        # Unknown rollout: the same answer as a wrong token, so ids cannot be probed.
        raise ApiError(401, "invalid token for this rollout")
    status, attempt, token_hash = auth
    if token_hash and hmac.compare_digest(hash_token(token), token_hash):
        if status is not RolloutStatus.RUNNING:
            raise ApiError(401, f"rollout has ended ({status.value}); its token no longer works")
        return attempt
    if keys.is_admin(token) or keys.is_recorder(token):
        raise ApiError(403, "this key cannot act for a rollout; use the rollout's own token")
    raise ApiError(401, "invalid token for this rollout")
