"""Record mode: a call without a rollout (``/v1/...`` with a record key) in a rollout of its own.

:func:`recording` checks the record key, opens a rollout for the call and ends it when
the call is over, the way the call ended: ``succeeded`` once the answer (or the whole
stream) was given, ``failed`` with the error when the call was refused or failed,
``cancelled`` when the client left first. Handlers report a stream's end through the
:data:`OnEnd` they are given (``_api.openai.sse``, ``_api.responses.routes``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request

from tether.records import AttemptEnd, RolloutStatus

from .._core.gateway import Gateway
from .deps import request_key
from .status import ApiError, http_error

__all__ = ["LEFT", "OnEnd", "check_record_key", "recording"]

#: ``on_end(status, error)``: how the call ended; only its first report counts.
OnEnd = Callable[[RolloutStatus, str | None], None]

#: The error of a call whose client left before the answer ended.
LEFT = "the client left before the answer ended"

Handler = Callable[..., Awaitable[Any]]


def _ended_by(exc: BaseException) -> tuple[RolloutStatus, str]:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return RolloutStatus.CANCELLED, LEFT
    err = http_error(exc) if isinstance(exc, Exception) else None
    return RolloutStatus.FAILED, err.message if err is not None else type(exc).__name__


def check_record_key(gw: Gateway, request: Request) -> None:
    """401 unless the request carries a record key (as a bearer token or ``x-api-key``)."""
    token = request_key(request)
    if token is None:
        raise ApiError(401, "missing key: record mode needs a record key")
    if not gw.keys.is_recorder(token):
        raise ApiError(
            401,
            "invalid key for record mode (tether serve --record-key KEY, or gateway.record_keys)",
        )


async def recording(gw: Gateway, request: Request, handler: Handler) -> Any:
    """Answer with ``handler(gw, rollout_id, attempt, request, on_end=...)`` in a rollout of
    its own; the rollout ends as the call did (module docstring)."""
    check_record_key(gw, request)
    opened = gw.open_rollout({}, run_id=None)
    ended: list[RolloutStatus] = []

    def on_end(status: RolloutStatus, error: str | None = None) -> None:
        if not ended:
            ended.append(status)
            gw.finish_rollout(AttemptEnd(opened.rollout_id, opened.attempt, status, error=error))

    try:
        return await handler(gw, opened.rollout_id, opened.attempt, request, on_end=on_end)
    except BaseException as exc:
        on_end(*_ended_by(exc))
        raise
