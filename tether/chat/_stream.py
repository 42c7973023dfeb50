"""A finished completion → the OpenAI ``chat.completion.chunk`` sequence, as plain dicts.

The gateway generates the whole completion, parses it, then streams it; it
serializes each dict as one SSE ``data:`` line and ends with ``data: [DONE]``.
The chunks follow what OpenAI sends:

1. ``{"role": "assistant", "content": ""}`` (``content`` is ``None`` when the
   message has tool calls and no text);
2. one ``{"content": piece}`` per piece of content;
3. per tool call,
   ``{"tool_calls": [{"index", "id", "type", "function": {"name", "arguments": ""}}]}``
   then ``{"tool_calls": [{"index", "function": {"arguments": ...}}]}``;
4. an empty delta with the ``finish_reason``.

:func:`usage_chunk` is the extra chunk for ``stream_options.include_usage``;
:func:`assemble_chunks` folds chunks back into ``choices`` (what an SDK does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tether.chat._parsers import ParsedMessage

__all__ = ["assemble_chunks", "stream_chunks", "usage_chunk"]


def _chunk(
    completion_id: str, created: int, model: str, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }


def _content_pieces(content: str, text_pieces: Sequence[str] | None) -> list[str]:
    """Split ``content`` along the boundaries of ``text_pieces`` (e.g. one per token).

    ``text_pieces`` spell the whole completion, markup included; content is
    usually a prefix of it and is cut where it ends. When it is not (text
    between tool calls), or no pieces are given, the content goes as one piece.
    """
    if not content:
        return []
    if text_pieces is None or not "".join(text_pieces).startswith(content):
        return [content]
    out, used = [], 0
    for piece in text_pieces:
        if used >= len(content):
            break
        piece = piece[: len(content) - used]
        if piece:
            out.append(piece)
            used += len(piece)
    return out


def stream_chunks(
    parsed: ParsedMessage,
    *,
    completion_id: str,
    model: str,
    created: int,
    finish_reason: str,
    choice_index: int = 0,
    text_pieces: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """The chunks for one choice of a streamed chat completion.

    ``finish_reason`` is the final one (see :func:`finish_reason_for`).
    ``text_pieces``, when given, are the decoded pieces of the completion text
    in order (per token or per engine step); content deltas follow their
    boundaries. For ``n > 1`` call once per choice with its ``choice_index``
    and send the lists one after the other (or interleaved; each chunk names
    its choice).
    """

    def one(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": choice_index, "delta": delta, "logprobs": None, "finish_reason": reason}
        return _chunk(completion_id, created, model, [choice])

    chunks = [one({"role": "assistant", "content": None if parsed.content is None else ""})]
    chunks += [one({"content": p}) for p in _content_pieces(parsed.content or "", text_pieces)]
    for i, call in enumerate(parsed.tool_calls):
        head = {
            "index": i,
            "id": call["id"],
            "type": call.get("type", "function"),
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(one({"tool_calls": [head]}))
        args = call["function"]["arguments"]
        chunks.append(one({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
    chunks.append(one({}, finish_reason))
    return chunks


def usage_chunk(
    *, completion_id: str, model: str, created: int, usage: Mapping[str, Any]
) -> dict[str, Any]:
    """The last chunk when the request asked for ``stream_options: {"include_usage": true}``."""
    chunk = _chunk(completion_id, created, model, [])
    chunk["usage"] = dict(usage)
    return chunk


def _merge_tool_delta(calls: dict[int, dict[str, Any]], delta: Mapping[str, Any]) -> None:
    call = calls.setdefault(
        delta["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if delta.get("id"):
        call["id"] = delta["id"]
    if delta.get("type"):
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def assemble_chunks(chunks: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fold streamed chunks back into non-streamed ``choices``, sorted by index.

    Each is ``{"index", "message": {"role", "content", "tool_calls"?}, "finish_reason"}``;
    ``content`` stays ``None`` if no chunk carried text.
    """
    state: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.get("choices", []):
            st = state.setdefault(
                choice["index"],
                {"role": "assistant", "content": None, "calls": {}, "finish_reason": None},
            )
            delta = choice.get("delta") or {}
            if delta.get("role"):
                st["role"] = delta["role"]
            if delta.get("content") is not None:
                st["content"] = (st["content"] or "") + delta["content"]
            for tool_delta in delta.get("tool_calls") or []:
                _merge_tool_delta(st["calls"], tool_delta)
            if choice.get("finish_reason") is not None:
                st["finish_reason"] = choice["finish_reason"]
    out = []
    for index in sorted(state):
        st = state[index]
        message: dict[str, Any] = {"role": st["role"], "content": st["content"]}
        if st["calls"]:
            message["tool_calls"] = [st["calls"][i] for i in sorted(st["calls"])]
        out.append({"index": index, "message": message, "finish_reason": st["finish_reason"]})
    return out
