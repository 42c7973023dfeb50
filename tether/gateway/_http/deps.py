"""What the routers share: error handlers, body parsing, SSE, and the auth dependencies.

Order of checks on every route: rollout id shape (400) → credentials
(401/403) → body size (413) → body shape and caps (400) → engine. A request
that fails a check never reaches the engine and changes nothing stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .._core.auth import agent_key, bearer
from .._core.gateway import Gateway
from .status import MAPPED, ApiError, anthropic_error_body, error_body, http_error

__all__ = [
    "STREAMED",
    "body_schema",
    "call_role",
    "gateway",
    "install_handlers",
    "is_anthropic",
    "parse",
    "request_key",
    "require_admin",
    "rollout_attempt",
    "rollout_route",
]


class _AnyRolloutId(Convertor):
    """Matches any text, "/", CR, LF and NUL included, so that every bad id
    reaches :func:`check_rollout_id` (a 400) instead of missing the route (404)."""

    regex = r"[\s\S]+?"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("rid", _AnyRolloutId())

F = TypeVar("F", bound=Callable[..., Any])


class _AnyRole(_AnyRolloutId):
    """One path segment, any text: a malformed role gets a 400 that names the rule."""

    regex = r"[^/]+"


register_url_convertor("role", _AnyRole())


def rollout_route(method: Callable[..., Any], path: str, **kwargs: Any) -> Callable[[F], F]:
    """Register a rollout's route twice: at ``/rollouts/{id}{path}`` and at its role form
    ``/rollouts/{id}/roles/{role}{path}`` (one function, the role in ``path_params``).

    ``method`` is ``router.post`` or ``router.get``. The role form is registered first:
    the rollout id's convertor takes "/" (so a bad id gets its 400), and the plain form
    would read ``abc/roles/critic`` as an id.
    """

    def register(fn: F) -> F:
        method(f"/rollouts/{{rollout_id:rid}}/roles/{{role:role}}{path}", **kwargs)(fn)
        return method(f"/rollouts/{{rollout_id:rid}}{path}", **kwargs)(fn)

    return register


# -- dependencies ------------------------------------------------------------


def gateway(request: Request) -> Gateway:
    """The :class:`Gateway` the app was built over."""
    return request.app.state.gateway


def require_admin(request: Request) -> None:
    """401 unless the request carries the admin key."""
    gateway(request).keys.require_admin(bearer(request.headers.get("authorization")))


def request_key(request: Request) -> str | None:
    """The agent's key: ``Authorization: Bearer`` or ``x-api-key`` (:func:`agent_key`)."""
    return agent_key(request.headers.get("authorization"), request.headers.get("x-api-key"))


def rollout_attempt(rollout_id: str, request: Request) -> int:
    """The rollout's current attempt, if the request carries that rollout's own token (and,
    on a role route, names a role the gateway serves: 400/404 otherwise)."""
    gw = gateway(request)
    attempt = gw.authorize(rollout_id, request_key(request))
    role = request.path_params.get("role")
    if role is not None:
        gw.config.check_role(role)
    return attempt


def call_role(request: Request) -> str | None:
    """The role named in the request's URL (``/rollouts/{id}/roles/{role}/v1/...``), checked
    by :func:`rollout_attempt`; None on the plain routes and in record mode."""
    return request.path_params.get("role")


# -- bodies ------------------------------------------------------------------


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    }


# The 200 of a route that answers ``stream: true`` with server-sent events.
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "the response, or with `stream: true` its chunks as server-sent events",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is above the cap of {limit} bytes")
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise ApiError(413, f"request body is above the cap of {limit} bytes")
            parts.append(part)
    except ClientDisconnect:  # an agent killed mid-request (Ctrl-C, a timeout): nothing to answer
        raise ApiError(499, "the client closed the connection before sending its body") from None
    return b"".join(parts)


async def parse(request: Request, model: type[BaseModel]) -> Any:
    """The body as ``model``, within the gateway's body cap (400/413 otherwise)."""
    body = await _read_body(request, gateway(request).config.max_body_bytes)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        if err.get("type") == "extra_forbidden":
            raise ApiError(
                400,
                f"unsupported field '{param}': tether does not implement it; remove it",
                param=param,
            ) from None
        raise ApiError(
            400, f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param=param
        ) from None


# -- errors ------------------------------------------------------------------


def is_anthropic(request: Request) -> bool:
    """Whether ``request`` is to the Messages API (its errors have Anthropic's shape)."""
    return "/v1/messages" in request.url.path


def _response(
    request: Request, status: int, message: str, param: str | None = None, code: str | None = None
):
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if is_anthropic(request):
        body = anthropic_error_body(status, message)
    else:
        body = error_body(status, message, param, code)
    return JSONResponse(body, status_code=status, headers=headers)


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
    """Answer every error tether raises with its status (:func:`http_error`), OpenAI-shaped
    (Anthropic-shaped on the Messages API's routes)."""

    async def _mapped(request: Request, exc: Exception):
        err = http_error(exc)
        assert err is not None  # registered only for the classes http_error maps
        return _response(request, err.status, err.message, err.param, err.code)

    for cls in (ApiError, *MAPPED):
        app.add_exception_handler(cls, _mapped)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return _response(request, 400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _response(request, exc.status_code, str(exc.detail))
