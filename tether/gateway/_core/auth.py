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
from collections.abc import Callable

from tether.records import RolloutStatus

from .._errors import Conflict, Forbidden, InvalidRequest, Unauthenticated

__all__ = ["Keys", "agent_key", "bearer", "check_rollout_id", "hash_token", "new_token"]

# Rollout ids travel in URLs and log lines: a conservative alphabet, no dots
# at the start (no "..", no hidden names), at most 128 bytes.
_ROLLOUT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def new_token() -> str:
    return "tr-" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_rollout_id(rollout_id: str) -> str:
    if not _ROLLOUT_ID.fullmatch(rollout_id) or ".." in rollout_id:
        raise InvalidRequest(
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


def agent_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """An agent's key: the ``Authorization: Bearer`` token (what ``OPENAI_API_KEY`` and
    ``ANTHROPIC_AUTH_TOKEN`` send), else the ``x-api-key`` header (``ANTHROPIC_API_KEY``)."""
    token = bearer(authorization)
    if token is None and x_api_key and x_api_key.strip():
        return x_api_key.strip()
    return token


MAX_SUPERSEDED = 100_000  # retried attempts whose tokens are remembered for a 409


class Keys:
    """The admin key and the record-mode keys."""

    def __init__(self, admin_key: str | None, record_keys: tuple[str, ...] = ()):
        self._admin = hash_token(admin_key) if admin_key else None
        self._record = {hash_token(k) for k in record_keys}
        # token hash of an attempt -> the hash of the retry that replaced it (in memory)
        self._superseded: dict[str, str] = {}

    def supersede(self, old_hash: str, new_hash: str) -> None:
        """Remember that a retry replaced ``old_hash``'s attempt: its late writes get 409."""
        if len(self._superseded) >= MAX_SUPERSEDED:
            self._superseded.pop(next(iter(self._superseded)))
        self._superseded[old_hash] = new_hash

    def superseded(self, token_hash: str, current_hash: str) -> bool:
        """Whether ``token_hash`` is an earlier attempt's token of the rollout at ``current_hash``."""
        later = self._superseded.get(token_hash)
        for _ in range(MAX_SUPERSEDED):
            if later is None:
                return False
            if hmac.compare_digest(later, current_hash):
                return True
            later = self._superseded.get(later)
        return False

    def is_admin(self, token: str | None) -> bool:
        return bool(token and self._admin and hmac.compare_digest(hash_token(token), self._admin))

    def is_recorder(self, token: str | None) -> bool:
        if not token:
            return False
        h = hash_token(token)
        return any(hmac.compare_digest(h, k) for k in self._record)

    def require_admin(self, token: str | None) -> None:
        if token is None:
            raise Unauthenticated("missing bearer token: send 'Authorization: Bearer <admin key>'")
        if not self.is_admin(token):
            raise Unauthenticated("invalid admin key")


def check_rollout_token(
    token: str | None,
    auth: tuple[RolloutStatus, int, str | None] | None,
    keys: Keys,
    in_use: Callable[[str], bool] | None = None,
) -> int:
    """Authorize a call to one rollout; return its current attempt.

    401: no token, a wrong token, or a token whose rollout has ended.
    409: the token of an earlier attempt of this rollout (a retry replaced it).
    403: a valid credential of another kind — the admin key, a record key, or
    (``in_use(hash)`` true) the token of another running rollout. Agents'
    calls must carry their own rollout's token, so nothing is recorded under
    someone else's name. The answer does not depend on whether the rollout
    in the URL exists, so ids cannot be probed.
    """
    if token is None:
        raise Unauthenticated(
            "missing key: send the rollout token as 'Authorization: Bearer <token>' "
            "(OPENAI_API_KEY) or as 'x-api-key' (ANTHROPIC_API_KEY)"
        )
    token_hash = hash_token(token)
    if auth is not None:
        status, attempt, stored = auth
        if stored and hmac.compare_digest(token_hash, stored):
            # queued: its runner has not said it started the agent, but here it is
            if status not in (RolloutStatus.RUNNING, RolloutStatus.QUEUED):
                raise Unauthenticated(
                    f"rollout has ended ({status.value}); its token no longer works"
                )
            return attempt
        if stored and keys.superseded(token_hash, stored):
            raise Conflict(
                f"this token is an earlier attempt's; the rollout is at attempt {attempt} "
                "and nothing was stored",
            )
    if keys.is_admin(token) or keys.is_recorder(token):
        raise Forbidden("this key cannot act for a rollout; use the rollout's own token")
    if in_use is not None and in_use(token_hash):
        raise Forbidden("this token belongs to another rollout; use this rollout's own token")
    raise Unauthenticated("invalid token for this rollout")
