"""OpenAI-style errors. HTTP status codes are chosen here and nowhere else.

:func:`http_error` is the one mapping from what tether raises to a status: the
gateway's own errors (``tether.gateway._errors``: a cap, a bad rollout id, a missing key),
the store's, the engine's and the chat layer's. :class:`ApiError` carries a status
chosen at the HTTP edge itself (a body too large, not JSON). Every error body has the OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` so that the official
clients raise their usual exception classes (``BadRequestError``,
``AuthenticationError``, ``PermissionDeniedError``, ``NotFoundError``,
``ConflictError``, ``InternalServerError``, ...); on the Messages API's routes the
body has Anthropic's shape (:func:`anthropic_error_body`), which the ``anthropic``
clients turn into the same classes of theirs. This module does not import FastAPI
(``deps`` installs the handlers).
"""

from __future__ import annotations

import logging

from tether.chat import ChatError, InvalidMessages
from tether.engine import AdmissionTimeout, EngineError, EngineTimeout
from tether.store import (
    AlreadyExists,
    IllegalRolloutTransition,
    InvalidRecord,
    NotFound,
    RolloutClosed,
    StaleAttempt,
    StoreError,
)

from .._errors import (
    Conflict,
    EngineDown,
    Forbidden,
    GatewayError,
    InvalidRequest,
    ModelLoading,
    Unauthenticated,
    UnknownRole,
    UnknownRollout,
)

__all__ = ["MAPPED", "ApiError", "anthropic_error_body", "error_body", "http_error"]

log = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    502: "engine_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error that becomes an HTTP response with an OpenAI error body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


# tether's error classes → (status, message prefix), most specific first.
_STATUSES: tuple[tuple[type[Exception], int, str], ...] = (
    (InvalidRequest, 400, ""),
    (Unauthenticated, 401, ""),
    (Forbidden, 403, ""),
    (UnknownRollout, 404, ""),
    (UnknownRole, 404, ""),
    (Conflict, 409, ""),
    (ModelLoading, 503, ""),  # not ready yet: nothing failed
    (EngineDown, 503, ""),  # /healthz while no inference server is up
    (InvalidMessages, 400, ""),
    (ChatError, 500, "gateway set-up error: "),  # no chat template, unknown parser
    (AdmissionTimeout, 503, ""),  # held while paused: the engine did not fail
    (EngineTimeout, 504, "engine failed: "),
    (EngineError, 502, "engine failed: "),
    (NotFound, 404, ""),
    (RolloutClosed, 401, "rollout has ended: "),
    (StaleAttempt, 409, ""),
    (AlreadyExists, 409, ""),  # DuplicateReward too; an id taken in a race past the pre-check
    (IllegalRolloutTransition, 409, ""),
    (InvalidRecord, 400, ""),
    (StoreError, 503, ""),
)


# The error classes :func:`http_error` answers (others are the gateway's bugs: a 500).
MAPPED: tuple[type[Exception], ...] = tuple(cls for cls, _, _ in _STATUSES)


def http_error(exc: Exception) -> ApiError | None:
    """The status and message ``exc`` is answered with; None for an unexpected error (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    match = next((row for row in _STATUSES if isinstance(exc, row[0])), None)
    if match is None:
        return None
    _, status, prefix = match
    if status in (500, 503) and not isinstance(exc, (AdmissionTimeout, ModelLoading, EngineDown)):
        log.error("%s: %s", type(exc).__name__, exc)  # the gateway's set-up or its store
    if isinstance(exc, StoreError) and status == 503:
        return ApiError(503, "trace store unavailable")
    if isinstance(exc, GatewayError):
        return ApiError(status, exc.message, param=exc.param, code=exc.code)
    param = "messages" if isinstance(exc, InvalidMessages) else None
    return ApiError(status, f"{prefix}{exc}", param=param)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "api_error"),
            "param": param,
            "code": code,
        }
    }


# Anthropic's error types by status (its docs: "Errors"); others are "api_error".
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    499: "invalid_request_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_body(status: int, message: str) -> dict:
    """``{"type": "error", "error": {"type", "message"}}``, the Messages API's error shape."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
