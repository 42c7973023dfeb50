"""OpenAI-style errors. HTTP status codes are chosen here and nowhere else.

Every error body has the OpenAI shape
``{"error": {"message", "type", "param", "code"}}`` so that the official
clients raise their usual exception classes (``BadRequestError``,
``AuthenticationError``, ``PermissionDeniedError``, ``NotFoundError``,
``ConflictError``, ``InternalServerError``, ...).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.chat import ChatError, InvalidMessages
from tether.engine import AdmissionTimeout, EngineError, EngineTimeout
from tether.store import (
    DuplicateReward,
    IllegalRolloutTransition,
    NotFound,
    RolloutClosed,
    StaleAttempt,
    StoreError,
)

__all__ = ["ApiError", "error_body", "install_handlers"]

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


def _response(status: int, message: str, param: str | None = None, code: str | None = None):
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(
        error_body(status, message, param, code), status_code=status, headers=headers
    )


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        return (f"unsupported field '{param}': tether does not implement it; remove it", param)
    if kind == "json_invalid":
        return ("request body is not valid JSON", None)
    msg = first.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg, param)


def install_handlers(app: FastAPI) -> None:
    """Map every error tether raises to its status and an OpenAI error body."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError):
        return _response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return _response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        return _response(exc.status_code, str(exc.detail))

    @app.exception_handler(ChatError)
    async def _chat(_: Request, exc: ChatError):
        if isinstance(exc, InvalidMessages):
            return _response(400, str(exc), "messages")
        log.error(
            "gateway set-up error: %s", exc
        )  # no chat template, unknown parser: not the caller's fault
        return _response(500, f"gateway set-up error: {exc}")

    @app.exception_handler(EngineError)
    async def _engine(_: Request, exc: EngineError):
        if isinstance(exc, AdmissionTimeout):  # held while paused: the engine did not fail
            return _response(503, str(exc))
        status = 504 if isinstance(exc, EngineTimeout) else 502
        return _response(status, f"engine failed: {exc}")

    @app.exception_handler(StoreError)
    async def _store(_: Request, exc: StoreError):
        if isinstance(exc, NotFound):
            return _response(404, str(exc))
        if isinstance(exc, RolloutClosed):
            return _response(401, f"rollout has ended: {exc}")
        if isinstance(exc, StaleAttempt | DuplicateReward | IllegalRolloutTransition):
            return _response(409, str(exc))
        log.error("store error: %s", exc)
        return _response(503, "trace store unavailable")
