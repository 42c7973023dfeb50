"""``stream: true`` answers: the pieces of ``Gateway.generate_stream`` as OpenAI SSE chunks.

Chat completions (``chat.completion.chunk``): per choice, a role chunk
(``content: ""``, or ``None`` when its first piece is a tool call), a chunk
per text piece (with the logprobs of the tokens it completes, when asked),
per tool call a head (``id``, ``type``, ``name``, ``arguments: ""``) and its
arguments, then an empty delta with the ``finish_reason``; the usage chunk
(``stream_options.include_usage``); ``data: [DONE]``. Completions
(``text_completion``): a chunk per text piece, then one with the
``finish_reason``. The generator is primed before the response starts, so a
call refused or failed before its first token gets an ordinary HTTP error;
a failure later is a last ``data: {"error": ...}`` event (what OpenAI sends)
and no ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from tether.engine import TokenDelta
from tether.records import RolloutStatus

from ..._core.choices import TokenText
from ..._core.deltas import Done, TextDelta, ToolCallDelta
from ..._http.record_mode import LEFT, OnEnd
from ..._http.status import ApiError, error_body, http_error
from .render import _usage

__all__ = ["stream_response"]

log = logging.getLogger(__name__)


def _data(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class _Chat:
    """Chunks of a chat completion; see the module docstring."""

    def __init__(
        self, token_text: TokenText, model: str, policy_version: int, logprobs: bool, top: int
    ):
        self.token_text, self.logprobs, self.top = token_text, logprobs, top
        self.base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"tether-policy-v{policy_version}",
        }
        self.started: set[int] = set()
        self.pending: dict[int, list[dict[str, Any]]] = {}

    def chunk(self, index: int, delta: dict[str, Any], reason: str | None = None) -> str:
        lps = self.pending.pop(index, None)
        logprobs = {"content": lps, "refusal": None} if lps else None
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        return _data({**self.base, "choices": [choice]})

    def start(self, index: int, content: str | None) -> list[str]:
        if index in self.started:
            return []
        self.started.add(index)
        return [_data({**self.base, "choices": [_choice(index, "assistant", content)]})]

    def token(self, d: TokenDelta) -> None:
        if not self.logprobs:
            return
        text = self.token_text(d.token_id)
        top = []
        if self.top and d.top_logprobs:
            ranked = sorted(d.top_logprobs.items(), key=lambda kv: -kv[1])[: self.top]
            for k, v in ranked:
                t = self.token_text(k)
                top.append({"token": t, "logprob": v, "bytes": list(t.encode())})
        entry = {
            "token": text,
            "logprob": d.logprob,
            "bytes": list(text.encode()),
            "top_logprobs": top,
        }
        self.pending.setdefault(d.index, []).append(entry)

    def text(self, d: TextDelta) -> list[str]:
        return [*self.start(d.index, ""), self.chunk(d.index, {"content": d.text})]

    def tool(self, d: ToolCallDelta) -> list[str]:
        if d.id is not None:
            head = {
                "index": d.call,
                "id": d.id,
                "type": "function",
                "function": {"name": d.name, "arguments": d.arguments},
            }
        else:
            head = {"index": d.call, "function": {"arguments": d.arguments}}
        return [*self.start(d.index, None), self.chunk(d.index, {"tool_calls": [head]})]

    def done(self, d: Done, include_usage: bool) -> list[str]:
        out = []
        for i, c in enumerate(d.choices):
            out += self.start(i, None if c.message.get("content") is None else "")
            out.append(self.chunk(i, {}, c.finish_reason))
        if include_usage:
            usage = _usage(d.prompt_tokens, d.choices)
            out.append(_data({**self.base, "choices": [], "usage": usage}))
        return out


def _choice(index: int, role: str, content: str | None) -> dict[str, Any]:
    delta = {"role": role, "content": content}
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}


class _Completion:
    """Chunks of a text completion (``/v1/completions``)."""

    def __init__(
        self, token_text: TokenText, model: str, policy_version: int, logprobs: int | None
    ):
        self.token_text, self.logprobs = token_text, logprobs
        self.base = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": f"tether-policy-v{policy_version}",
        }
        self.pending: dict[int, list[TokenDelta]] = {}
        self.offset: dict[int, int] = {}

    def token(self, d: TokenDelta) -> None:
        if self.logprobs is not None:
            self.pending.setdefault(d.index, []).append(d)

    def chunk(self, index: int, text: str, reason: str | None = None) -> str:
        lp = None
        if self.logprobs is not None:
            toks = self.pending.pop(index, [])
            texts = [self.token_text(t.token_id) for t in toks]
            offsets, pos = [], self.offset.get(index, 0)
            for t in texts:
                offsets.append(pos)
                pos += len(t)
            self.offset[index] = pos
            top = None
            if self.logprobs and any(t.top_logprobs for t in toks):
                top = [
                    {
                        self.token_text(k): v
                        for k, v in sorted((t.top_logprobs or {}).items(), key=lambda kv: -kv[1])[
                            : self.logprobs
                        ]
                    }
                    for t in toks
                ]
            lp = {
                "tokens": texts,
                "token_logprobs": [t.logprob for t in toks],
                "top_logprobs": top,
                "text_offset": offsets,
            }
        choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": reason}
        return _data({**self.base, "choices": [choice]})

    def text(self, d: TextDelta) -> list[str]:
        return [self.chunk(d.index, d.text)]

    def tool(self, d: ToolCallDelta) -> list[str]:  # pragma: no cover - completions parse none
        return []

    def done(self, d: Done, include_usage: bool) -> list[str]:
        out = [self.chunk(i, "", c.finish_reason) for i, c in enumerate(d.choices)]
        if include_usage:
            usage = _usage(d.prompt_tokens, d.choices)
            out.append(_data({**self.base, "choices": [], "usage": usage}))
        return out


async def _events(
    form: _Chat | _Completion,
    first: Any,
    rest: AsyncGenerator[Any, None],
    include_usage: bool,
    on_end: OnEnd | None,
) -> AsyncIterator[str]:
    try:
        item = first
        while True:
            if isinstance(item, TokenDelta):
                form.token(item)
            elif isinstance(item, TextDelta):
                for line in form.text(item):
                    yield line
            elif isinstance(item, ToolCallDelta):
                for line in form.tool(item):
                    yield line
            elif isinstance(item, Done):
                if on_end is not None:  # before [DONE]: what the agent saw end is committed
                    on_end(RolloutStatus.SUCCEEDED, None)
                for line in form.done(item, include_usage):
                    yield line
                yield "data: [DONE]\n\n"
                return
            try:
                item = await anext(rest)
            except StopAsyncIteration:  # pragma: no cover - the gateway always ends with Done
                return
    except Exception as exc:  # after the 200: the error goes as the stream's last event
        err = http_error(exc)
        if err is None:
            log.exception("streamed call failed")
            err = ApiError(500, "internal error while streaming")
        if on_end is not None:
            on_end(RolloutStatus.FAILED, err.message)
        yield _data(error_body(err.status, err.message, err.param, err.code))
    finally:
        await rest.aclose()
        if on_end is not None:  # a stream that ended neither way: the client left
            on_end(RolloutStatus.CANCELLED, LEFT)


async def stream_response(
    events: AsyncGenerator[Any, None],
    *,
    token_text: TokenText,
    model: str,
    policy_version: int,
    chat: bool,
    logprobs: bool | int | None,
    top_logprobs: int = 0,
    include_usage: bool = False,
    on_end: OnEnd | None = None,
) -> StreamingResponse:
    """Prime ``events`` (``Gateway.generate_stream(..., tokens=True)``) and stream it as SSE.

    ``logprobs``: chat: a bool (``top_logprobs`` per token); completions: the int or None.
    ``on_end(status, error)`` reports how the stream ended, once it is over: for a
    complete stream before its last event, so an agent that saw ``[DONE]`` finds its
    rollout finished. Only its first report counts. A call refused or failed before its
    first piece raises here (the caller's to report).
    """
    form: _Chat | _Completion
    if chat:
        form = _Chat(token_text, model, policy_version, bool(logprobs), top_logprobs)
    else:
        form = _Completion(token_text, model, policy_version, logprobs)  # type: ignore[arg-type]
    first = await anext(events)  # errors before the first token are plain HTTP errors
    return StreamingResponse(
        _events(form, first, events, include_usage, on_end),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )
