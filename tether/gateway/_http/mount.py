"""One way to mount a dialect's routes in their three forms.

A dialect (``_api/openai``, ``_api/responses``, ``_api/anthropic``) describes each of its
routes once, as a :class:`Route`, and :func:`mount` serves it at:

- the rollout form, ``/rollouts/{id}{path}``, with the rollout's own token;
- the role form, ``/rollouts/{id}/roles/{role}{path}`` (the same function, the role in
  ``path_params``: :func:`~.deps.rollout_route`);
- the record form, ``{path}`` with a record key (``record=True``; ``gateway.record_keys``):
  a model call gets a rollout of its own (:func:`~.record_mode.recording`).

A route is either a model call (``call``: ``(gw, rollout_id, attempt, request, on_end)``,
``on_end`` set only in the record form) or an answer that needs no rollout (``answer``:
``(gw, request)``, e.g. a token count or the model list).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel

from .._core.gateway import Gateway
from .deps import STREAMED, body_schema, gateway, rollout_attempt, rollout_route
from .record_mode import OnEnd, check_record_key, recording

__all__ = ["Answer", "Call", "Route", "mount"]

#: A model call: ``(gw, rollout_id, attempt, request, on_end)``; ``on_end`` hears how it ended.
Call = Callable[[Gateway, str, int, Request, OnEnd | None], Awaitable[Any]]
#: An answer that needs no rollout: ``(gw, request)``.
Answer = Callable[[Gateway, Request], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One route of a dialect (module docstring)."""

    path: str  # "/v1/chat/completions"
    name: str  # the forms are named rollout_{name} and record_{name} (OpenAPI operation ids)
    tag: str  # the rollout forms' OpenAPI tag; the record form's is "record"
    call: Call | None = None
    answer: Answer | None = None
    body: type[BaseModel] | None = None  # the request body, for the OpenAPI document
    record: bool = True  # also serve the record form
    record_name: str | None = None  # the record form's name, if not record_{name}
    #: the record form's key check; default: a record key (:func:`check_record_key`)
    record_check: Callable[[Gateway, Request], None] = check_record_key
    response_model: Any = None  # an answer's shape, for the OpenAPI document

    def __post_init__(self) -> None:
        if (self.call is None) == (self.answer is None):
            raise ValueError(f"route {self.path}: give exactly one of call= and answer=")


def _openapi(route: Route) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if route.body is not None:
        kwargs["openapi_extra"] = body_schema(route.body)
    if route.call is not None:
        kwargs["responses"] = STREAMED
    if route.response_model is not None:
        kwargs["response_model"] = route.response_model
    return kwargs


def _rollout_form(route: Route) -> Callable[..., Awaitable[Any]]:
    call, answer = route.call, route.answer

    async def endpoint(
        rollout_id: str,
        request: Request,
        gw: Gateway = Depends(gateway),
        attempt: int = Depends(rollout_attempt),
    ):
        if call is not None:
            return await call(gw, rollout_id, attempt, request, None)
        assert answer is not None
        return await answer(gw, request)

    return endpoint


def _record_form(route: Route) -> Callable[..., Awaitable[Any]]:
    call, answer, check = route.call, route.answer, route.record_check

    async def endpoint(request: Request, gw: Gateway = Depends(gateway)):
        if call is not None:
            return await recording(gw, request, call)
        assert answer is not None
        check(gw, request)
        return await answer(gw, request)

    return endpoint


def mount(router: APIRouter, routes: tuple[Route, ...]) -> None:
    """Serve each of ``routes`` in its forms on ``router``: the rollout and role forms of
    all of them first, then the record forms."""
    for route in routes:
        method = router.post if route.body is not None else router.get
        register = rollout_route(
            method, route.path, tags=[route.tag], name=f"rollout_{route.name}", **_openapi(route)
        )
        register(_rollout_form(route))
    for route in routes:
        if not route.record:
            continue
        method = router.post if route.body is not None else router.get
        name = route.record_name or f"record_{route.name}"
        method(route.path, tags=["record"], name=name, **_openapi(route))(_record_form(route))
