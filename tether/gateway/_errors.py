"""The gateway's own errors (what its core raises; ``_http.status`` picks their HTTP statuses).

::

    TetherError                          (tether.errors)
    └── GatewayError                     a request the gateway refuses
        ├── InvalidRequest               a field, a cap or a schema rule broken (400)
        │   └── ContextLengthExceeded    prompt (+ max_tokens) beyond the model's context
        ├── Unauthenticated              no key, a wrong key, an ended rollout's token (401)
        ├── Forbidden                    a key that may not do this (403)
        ├── UnknownRollout               no rollout with that id (404)
        ├── Conflict                     an id already taken, a superseded attempt (409)
        ├── ModelLoading                 the model is still loading (``tether serve``, 503)
        └── EngineDown                   no call can be served: ``Engine.outage`` (503)

Each carries the request field it is about (``param``) and OpenAI's error ``code``
where OpenAI has one (``context_length_exceeded``).
"""

from __future__ import annotations

from tether.errors import TetherError

__all__ = [
    "Conflict",
    "ContextLengthExceeded",
    "EngineDown",
    "Forbidden",
    "GatewayError",
    "InvalidRequest",
    "ModelLoading",
    "Unauthenticated",
    "UnknownRole",
    "UnknownRollout",
]


class GatewayError(TetherError):
    """Base of the gateway's errors; ``param`` names the request field, ``code`` OpenAI's code."""

    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(GatewayError):
    """The request breaks a rule (a field, a cap, a schema); the message names it."""


class ContextLengthExceeded(InvalidRequest):
    """The prompt, or the prompt and ``max_tokens``, do not fit the model's context."""

    code = "context_length_exceeded"


class Unauthenticated(GatewayError):
    """No credentials, wrong ones, or an ended rollout's token."""


class Forbidden(GatewayError):
    """Credentials that may not do this."""


class UnknownRollout(GatewayError):
    """No rollout with that id."""


class UnknownRole(GatewayError):
    """A role the gateway does not serve (``gateway.roles``, set from the run's ``roles``)."""


class Conflict(GatewayError):
    """An id already taken, or a write from an attempt that is no longer current."""


class EngineDown(GatewayError):
    """The engine can serve no call now (no inference server up, the worker thread dead):
    what ``GET /healthz`` answers while ``Engine.outage`` says why."""


class ModelLoading(GatewayError):
    """A request before the model has loaded (``tether serve`` listens first; see
    ``_http/loading.py``): retry once ``GET /healthz`` answers 200."""
