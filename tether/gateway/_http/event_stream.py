"""Named-event SSE answers (the Responses API's and the Messages API's): one mechanism.

Both APIs stream ``event: TYPE`` / ``data: JSON`` pairs built from the gateway's deltas.
:func:`primed` takes the first delta before the response starts, so a call refused or
failed before its first token gets an ordinary HTTP error. :func:`event_stream` writes
the events and tells ``on_end`` how the call ended: succeeded just before the API's last
event (so what the agent saw end is committed), failed (the error is then the stream's
last event, in the API's own shape), or cancelled when the client left.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from typing import Any

from fastapi.responses import StreamingResponse

from tether.records import RolloutStatus

from .record_mode import LEFT, OnEnd
from .status import ApiError, http_error

__all__ = ["ErrorEvent", "event_stream", "primed"]

log = logging.getLogger(__name__)

#: The error event of an API: from the error and the last event sent (None: none yet).
ErrorEvent = Callable[[ApiError, "dict[str, Any] | None"], dict[str, Any]]


async def primed(deltas: AsyncGenerator[Any, None]) -> AsyncIterator[Any]:
    """``deltas`` with its first piece already taken (see the module docstring)."""
    first = await anext(deltas)

    async def chained() -> AsyncIterator[Any]:
        yield first
        async for d in deltas:
            yield d

    return chained()


def event_stream(
    stream: AsyncIterator[dict[str, Any]],
    deltas: AsyncGenerator[Any, None],
    on_end: OnEnd | None,
    *,
    last: Collection[str],
    error_event: ErrorEvent,
) -> StreamingResponse:
    """The SSE answer of ``stream``'s events; ``last`` are the types that end a call well."""

    async def lines() -> AsyncIterator[str]:
        sent: dict[str, Any] | None = None
        try:
            async for e in stream:
                if e["type"] in last and on_end is not None:
                    on_end(RolloutStatus.SUCCEEDED, None)
                sent = e
                yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
        except Exception as exc:  # after the 200: the error is the stream's last event
            err = http_error(exc)
            if err is None:
                log.exception("a streamed call failed")
                err = ApiError(500, "internal error while streaming")
            if on_end is not None:
                on_end(RolloutStatus.FAILED, err.message)
            e = error_event(err, sent)
            yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"
        finally:
            await deltas.aclose()
            if on_end is not None:  # a stream that ended neither way: the client left
                on_end(RolloutStatus.CANCELLED, LEFT)

    return StreamingResponse(
        lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
