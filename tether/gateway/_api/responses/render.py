"""Finished choices → a Responses-API ``response`` object, and its streamed events.

The ``output`` of a choice is what the model wrote, in order: a ``message`` item
with one ``output_text`` part (absent when the model wrote only tool calls), then
one ``function_call`` item per parsed tool call, its ``call_id`` the id stored in
the recorded response. ``_responses_items.chat_messages`` maps these items back
to the same chat message, so a resent conversation renders token for token.

:func:`events` consumes an async iterator of :mod:`._deltas` (text and
tool-call pieces, then :class:`~tether.gateway._core.deltas.Done`) and yields the Responses event
sequence: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` (+ ``response.content_part.added``), its deltas,
its ``.done`` events and ``response.output_item.done``, then
``response.completed`` (``response.incomplete`` when the token budget ran out),
each with a ``sequence_number`` from 0. The final response is built from
``Done`` (it is what was recorded); items already streamed keep their ids.

Whitespace at the end of the text so far is held back until more text follows:
the text before a tool call is the message without it (as the tool-call parsers
strip it), and whitespace alone before a tool call makes no message item.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..._core.choices import Choice
from ..._core.deltas import Done, TextDelta, ToolCallDelta
from .schema import ResponsesRequest

__all__ = [
    "ResponseMeta",
    "echo",
    "events",
    "final_status",
    "output_items",
    "response_body",
]


@dataclass
class ResponseMeta:
    """What every response object of one call carries: its id and the request's echo."""

    echo: dict[str, Any]  # the request fields a response object repeats
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def item_id(self, kind: str, index: int) -> str:
        return f"{kind}_{self.id.removeprefix('resp_')}_{index}"


def echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request fields a response object repeats (OpenAI's defaults where unset)."""
    return {
        "model": req.model,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "top_logprobs": req.top_logprobs,
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "text": {"format": {"type": "text"}, **(req.text or {})},
        "truncation": "disabled",
        "reasoning": {"effort": None, "summary": None, **(req.reasoning or {})},
        "store": False,  # nothing is kept for previous_response_id or GET /responses/{id}
        "background": False,
        "metadata": req.metadata or {},
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "service_tier": "default",
    }


def _message_item(item_id: str, text: str, status: str, logprobs: list | None) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _call_item(item_id: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": status,
    }


def output_items(meta: ResponseMeta, choice: Choice, logprobs: list | None) -> list[dict]:
    """The ``output`` of one finished choice (see the module docstring)."""
    status = final_status(choice)
    content = choice.message.get("content")
    calls = choice.message.get("tool_calls") or []
    items = []
    if content is not None or not calls:
        items.append(_message_item(meta.item_id("msg", 0), content or "", status, logprobs))
    for call in calls:
        items.append(_call_item(meta.item_id("fc", len(items)), call, status))
    return items


def response_body(
    meta: ResponseMeta,
    output: list[dict[str, Any]],
    *,
    status: str,
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    """The ``response`` object; ``usage`` maps chat's counts onto the Responses names."""
    return {
        "id": meta.id,
        "object": "response",
        "created_at": meta.created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        **meta.echo,
        "output": output,
        "previous_response_id": None,
        "usage": None
        if usage is None
        else {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def final_status(choice: Choice) -> str:
    return "incomplete" if choice.finish_reason == "length" else "completed"


@dataclass
class _Streamed:
    index: int  # output_index
    item: dict[str, Any]  # as added (its text / arguments grow with the deltas)
    done: bool = False


class _Events:
    """The event sequence of one streamed response: numbers events, tracks streamed items."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        self.seq = 0
        self.streamed: list[_Streamed] = []
        self.held = ""  # trailing whitespace of the text so far, sent once more text follows

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": f"response.{kind}", "sequence_number": self.seq - 1, **fields}

    def added(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        s = _Streamed(len(self.streamed), _empty(item))
        self.streamed.append(s)
        out = [self.event("output_item.added", output_index=s.index, item=_pending(item))]
        if item["type"] == "message":
            part = {**item["content"][0], "text": "", "logprobs": []}
            out.append(self.event("content_part.added", **_at(s), content_index=0, part=part))
        return out

    def delta(self, s: _Streamed, piece: str) -> dict[str, Any]:
        if s.item["type"] == "message":
            s.item["content"][0]["text"] += piece
            return self.event(
                "output_text.delta", **_at(s), content_index=0, delta=piece, logprobs=[]
            )
        s.item["arguments"] += piece
        return self.event("function_call_arguments.delta", **_at(s), delta=piece)

    def finished(self, s: _Streamed, item: dict[str, Any]) -> list[dict[str, Any]]:
        s.done = True
        if item["type"] == "message":
            part = item["content"][0]
            out = [
                self.event(
                    "output_text.done",
                    **_at(s),
                    content_index=0,
                    text=part["text"],
                    logprobs=part["logprobs"],
                ),
                self.event("content_part.done", **_at(s), content_index=0, part=part),
            ]
        else:
            args = {"name": item["name"], "arguments": item["arguments"]}
            out = [self.event("function_call_arguments.done", **_at(s), **args)]
        return [*out, self.event("output_item.done", output_index=s.index, item=item)]

    def opening(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        """Close the items still open, then add ``item``."""
        open_ = [s for s in self.streamed if not s.done]
        closed = [e for s in open_ for e in self.finished(s, {**s.item, "status": "completed"})]
        return [*closed, *self.added(item)]

    def text(self, d: TextDelta) -> list[dict[str, Any]]:
        text = self.held + d.text
        said = text.rstrip()
        self.held = text[len(said) :]
        if not said:
            return []
        out = []
        last = self.streamed[-1] if self.streamed else None
        if last is None or last.done or last.item["type"] != "message":
            index = len(self.streamed)
            out += self.opening(
                _message_item(self.meta.item_id("msg", index), "", "in_progress", None)
            )
        return [*out, self.delta(self.streamed[-1], said)]

    def tool(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        out = []
        if d.id is not None:
            self.held = ""  # whitespace before a tool call is not part of the message
            call = {"id": d.id, "function": {"name": d.name or "", "arguments": ""}}
            index = len(self.streamed)
            out += self.opening(_call_item(self.meta.item_id("fc", index), call, "in_progress"))
        last = self.streamed[-1] if self.streamed else None
        if d.arguments and last is not None and last.item["type"] == "function_call":
            out.append(self.delta(last, d.arguments))
        return out

    def done(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        out = _finish(self.streamed, body, self.added, self.delta, self.finished)
        kind = "completed" if body["status"] == "completed" else "incomplete"
        return [*out, self.event(kind, response=body)]


async def events(
    meta: ResponseMeta,
    deltas: AsyncIterator[TextDelta | ToolCallDelta | Done],
    final: Callable[[Done], dict[str, Any]],
) -> AsyncIterator[dict[str, Any]]:
    """The Responses events of a streamed call (module docstring); ``final(done)`` is the
    finished response object, built as a non-streamed call builds it."""
    out = _Events(meta)
    pending = response_body(meta, [], status="in_progress", usage=None)
    yield out.event("created", response=pending)
    yield out.event("in_progress", response=pending)
    async for d in deltas:
        if isinstance(d, Done):
            for e in out.done(final(d)):
                yield e
            return
        if d.index != 0:  # a Responses call has one choice
            continue
        for e in out.text(d) if isinstance(d, TextDelta) else out.tool(d):
            yield e


def _empty(item: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``item`` with no text or arguments yet (the deltas fill it)."""
    if item["type"] == "message":
        return {**item, "content": [{**item["content"][0], "text": "", "logprobs": []}]}
    return {**item, "arguments": ""}


def _pending(item: dict[str, Any]) -> dict[str, Any]:
    """An item as first announced: in progress, no text or arguments yet."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    return {**item, "status": "in_progress", "arguments": ""}


def _at(s: _Streamed) -> dict[str, Any]:
    return {"item_id": s.item["id"], "output_index": s.index}


def _finish(streamed, body, added, delta, finished) -> list[dict[str, Any]]:
    """The events that bring the streamed items to the final ``body``'s output.

    Final items are matched to streamed ones by kind, in order (the message, then the
    calls by position); a matched item keeps its streamed id, and what the deltas have
    not yet said is sent as one more delta. Final items never streamed are sent whole.
    """
    out: list[dict[str, Any]] = []
    pool = {"message": [s for s in streamed if s.item["type"] == "message"]}
    pool["function_call"] = [s for s in streamed if s.item["type"] == "function_call"]
    output = []
    for item in body["output"]:
        candidates = pool[item["type"]]
        s = candidates.pop(0) if candidates else None
        if s is None:
            out += added(item)
            s = streamed[-1]
        item = {**item, "id": s.item["id"]}
        output.append(item)
        if not s.done:
            said, whole = _said(s.item), _said(item)
            if whole.startswith(said) and len(whole) > len(said):
                out.append(delta(s, whole[len(said) :]))
            out += finished(s, item)
    for s in streamed:  # streamed but not in the final output (e.g. whitespace before a call)
        if not s.done:
            out += finished(s, {**s.item, "status": "completed"})
    body["output"] = output
    return out


def _said(item: dict[str, Any]) -> str:
    return item["content"][0]["text"] if item["type"] == "message" else item["arguments"]
