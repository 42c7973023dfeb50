"""Finished choices → an Anthropic ``message`` object, and its streamed events.

The ``content`` of a choice is what the model wrote, in order: a ``text`` block (absent
when the model wrote only tool calls), then one ``tool_use`` block per parsed tool call,
its ``id`` the id stored in the recorded response and its ``input`` the parsed
arguments. ``_messages_items.chat_messages`` maps these blocks back to the same chat
message, so a resent conversation renders token for token.

:func:`events` consumes an async iterator of :mod:`._deltas` (text and tool-call
pieces, then :class:`~tether.gateway._core.deltas.Done`) and yields Anthropic's event sequence:
``message_start``, ``ping``, per block ``content_block_start``, its
``content_block_delta`` events (``text_delta`` / ``input_json_delta``) and
``content_block_stop``, then ``message_delta`` (the stop reason and the usage) and
``message_stop``. The gateway yields the tool calls and :class:`~tether.gateway._core.deltas.Done` only
once the call is committed, so a client that saw ``message_delta`` saw a recorded call.

Whitespace at the end of the text so far is held back until more text follows: the
text before a tool call is the message without it (as the tool-call parsers strip it),
and whitespace alone before a tool call makes no text block.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ..._core.choices import Choice
from ..._core.deltas import Done, TextDelta, ToolCallDelta

__all__ = ["MessageMeta", "content_blocks", "events", "message_body", "stop_reason"]

_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


@dataclass
class MessageMeta:
    """What every message object of one call carries: its id, the model named, the prompt size."""

    model: str
    input_tokens: int = 0  # set once the prompt is rendered
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")


def _input(arguments: str) -> Any:
    """A tool call's arguments as the ``input`` object (text the parser kept as it was: {})."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def content_blocks(choice: Choice) -> list[dict[str, Any]]:
    """The ``content`` of one finished choice (see the module docstring)."""
    content = choice.message.get("content")
    calls = choice.message.get("tool_calls") or []
    blocks: list[dict[str, Any]] = []
    if content or not calls:
        blocks.append({"type": "text", "text": content or ""})
    for call in calls:
        fn = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": _input(fn["arguments"]),
            }
        )
    return blocks


def stop_reason(choice: Choice, stop_sequence: str | None) -> str:
    """``end_turn``, ``max_tokens``, ``stop_sequence`` or ``tool_use``."""
    if stop_sequence is not None:
        return "stop_sequence"
    return _STOP_REASONS.get(choice.finish_reason, "end_turn")


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_body(
    meta: MessageMeta,
    content: list[dict[str, Any]],
    *,
    stop_reason: str | None,
    stop_sequence: str | None,
    output_tokens: int,
) -> dict[str, Any]:
    return {
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(meta.input_tokens, output_tokens),
    }


class _Events:
    """The event sequence of one streamed message: tracks the blocks streamed so far."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []  # as started (their text grows with the deltas)
        self.open = False  # the last block has no content_block_stop yet
        self.held = ""  # trailing whitespace of the text so far, sent once more text follows

    def start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.stop()
        self.blocks.append(block)
        self.open = True
        index = len(self.blocks) - 1
        started = dict(block)  # as it starts: the deltas grow ``block``, not the event
        return [*out, {"type": "content_block_start", "index": index, "content_block": started}]

    def stop(self) -> list[dict[str, Any]]:
        if not self.open:
            return []
        self.open = False
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def delta(self, **delta: Any) -> dict[str, Any]:
        if delta["type"] == "text_delta":
            self.blocks[-1]["text"] += delta["text"]
        return {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def text(self, d: TextDelta) -> list[dict[str, Any]]:
        text = self.held + d.text
        said = text.rstrip()
        self.held = text[len(said) :]
        if not said:
            return []
        out = []
        if not (self.open and self.blocks[-1]["type"] == "text"):
            out += self.start({"type": "text", "text": ""})
        return [*out, self.delta(type="text_delta", text=said)]

    def tool(self, d: ToolCallDelta) -> list[dict[str, Any]]:
        out = []
        if d.id is not None:
            self.held = ""  # whitespace before a tool call is not part of the text
            out += self.start({"type": "tool_use", "id": d.id, "name": d.name or "", "input": {}})
        if d.arguments and self.open and self.blocks[-1]["type"] == "tool_use":
            out.append(self.delta(type="input_json_delta", partial_json=d.arguments))
        return out

    def done(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """Bring the streamed blocks to the final ``body``'s content, then end the message."""
        out = []
        final = next((b["text"] for b in body["content"] if b["type"] == "text"), None)
        streamed = [b for b in self.blocks if b["type"] == "text"]
        if final is not None and not streamed:  # an empty answer: its empty text block
            out += self.start({"type": "text", "text": ""})
            streamed = [self.blocks[-1]]
        if final is not None and self.open and self.blocks[-1] is streamed[0]:
            said = streamed[0]["text"]
            if final.startswith(said) and len(final) > len(said):
                out.append(self.delta(type="text_delta", text=final[len(said) :]))
        out += self.stop()
        usage = {"output_tokens": body["usage"]["output_tokens"]}
        stop = {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]}
        return [*out, {"type": "message_delta", "delta": stop, "usage": usage}]


async def events(
    meta: MessageMeta,
    deltas: AsyncIterator[TextDelta | ToolCallDelta | Done],
    final: Callable[[Done], dict[str, Any]],
) -> AsyncIterator[dict[str, Any]]:
    """The Messages events of a streamed call (module docstring); ``final(done)`` is the
    finished message object, built as a non-streamed call builds it."""
    out = _Events()
    start = message_body(meta, [], stop_reason=None, stop_sequence=None, output_tokens=0)
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    async for d in deltas:
        if isinstance(d, Done):
            for e in out.done(final(d)):
                yield e
            yield {"type": "message_stop"}
            return
        if d.index != 0:  # a Messages call has one choice
            continue
        for e in out.text(d) if isinstance(d, TextDelta) else out.tool(d):
            yield e
