"""HTTP helpers shared by the server adapters: error answers and SSE lines.

:func:`check` turns a server's error answer into :class:`~tether.engine.EngineFailed`
with the server's own message (vLLM: ``{"error": {"message"}}``, older ``{"message"}``;
SGLang: ``{"error": {"message"}}`` or a FastAPI ``{"detail"}``); :func:`sse_events`
reads ``data:`` lines of a streamed answer as JSON until ``[DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from tether.engine._protocol import EngineFailed

__all__ = ["check", "error_message", "sse_events"]


def error_message(body: Any, fallback: str) -> str:
    """The message in an error body of any of the shapes above, else ``fallback``."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)
    return fallback


def check(resp: httpx.Response, server: str) -> Any:
    """The JSON body of a 2xx answer (None when empty); EngineFailed with the server's
    message otherwise: ``vLLM server at URL answered 400: <message>``."""
    if resp.is_success:
        return resp.json() if resp.content else None
    try:
        body: Any = resp.json()
    except ValueError:
        body = None
    text = resp.text.strip()[:500] if body is None else ""
    message = error_message(body, text or resp.reason_phrase)
    raise EngineFailed(
        f"{server} server at {resp.request.url} answered {resp.status_code}: {message}"
    )


async def sse_events(resp: httpx.Response, server: str) -> AsyncGenerator[dict[str, Any], None]:
    """The JSON objects of a server-sent event stream's ``data:`` lines, until ``[DONE]``;
    EngineFailed (as :func:`check` words it) when the server refused the stream."""
    if not resp.is_success:
        await resp.aread()
        check(resp, server)
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        if data:
            yield json.loads(data)
