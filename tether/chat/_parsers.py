"""Completion text → OpenAI assistant message (content and ``tool_calls``).

Parsers are chosen by name from a small registry (:func:`get_parser`):

``hermes``
    Qwen2.5 / Hermes: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
    any number of them; text before the first one is the content.
``llama3_json``
    Llama 3.x: the whole message is a JSON object ``{"name": ..., "parameters": {...}}``
    (optionally after ``<|python_tag|>``; several separated by ``;``).
``none``
    No tool calls: the whole text is the content (for ``tool_choice="none"``).

Parsing never raises on model output. Text that does not follow a parser's
format exactly (bad JSON, a missing or non-string name, arguments that are not
an object, an unterminated or stray tag) comes back whole as content with no
tool calls: all or nothing, so the agent sees what the model wrote.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any, Protocol

from tether.chat._errors import ChatError, UnknownParser

__all__ = [
    "CallIds",
    "ParsedMessage",
    "ToolCallParser",
    "finish_reason_for",
    "get_parser",
    "parser_names",
    "random_call_id",
    "register_parser",
]

IdFactory = Callable[[], str]


def random_call_id() -> str:
    """A fresh ``call_<24 hex>`` id from the OS's randomness (the default)."""
    return "call_" + secrets.token_hex(12)


class CallIds:
    """A deterministic id factory for tests: ``CallIds(Random(0))`` or a plain counter.

    With an ``rng``, ids look like real ones (``call_<24 hex>``); without one they
    count up: ``call_000000000000000000000000``, ``..01``, ...
    """

    def __init__(self, rng: Random | None = None) -> None:
        self._rng = rng
        self._next = 0

    def __call__(self) -> str:
        if self._rng is not None:
            return f"call_{self._rng.getrandbits(96):024x}"
        self._next += 1
        return f"call_{self._next - 1:024x}"


@dataclass(frozen=True)
class ParsedMessage:
    """An assistant message parsed from completion text.

    ``content`` is ``None`` only when there are tool calls and no text beside them.
    Each tool call is in OpenAI form:
    ``{"id": "call_...", "type": "function", "function": {"name": str, "arguments": str}}``,
    where ``arguments`` is a JSON object serialized as a string.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def to_message(self) -> dict[str, Any]:
        """The OpenAI ``choices[i].message`` dict (``tool_calls`` only when there are some)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [{**c, "function": dict(c["function"])} for c in self.tool_calls]
        return msg


def finish_reason_for(parsed: ParsedMessage, engine_reason: str | None) -> str:
    """The OpenAI ``finish_reason``: ``"tool_calls"`` when the model stopped after tool calls.

    ``"length"`` (and any other reason but ``"stop"``) is kept even when tool calls
    were parsed, so a truncated completion is never reported as a clean one.
    """
    if parsed.tool_calls and engine_reason in (None, "stop"):
        return "tool_calls"
    return engine_reason or "stop"


class ToolCallParser(Protocol):
    """Turns completion text into a :class:`ParsedMessage`; must never raise on any text."""

    name: str

    def parse(self, text: str, *, new_id: IdFactory | None = None) -> ParsedMessage: ...


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# Python's json accepts NaN and Infinity, which are not JSON; refuse them.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not JSON whitespace."""
    match = _WS.match(text, pos)
    return match.end() if match else pos


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes
        return False
    return True


def _dump_arguments(arguments: dict[str, Any]) -> str:
    out = json.dumps(arguments, ensure_ascii=False)
    return out if _utf8_ok(out) else json.dumps(arguments)


def _tool_call(obj: Any, new_id: IdFactory, arg_keys: tuple[str, ...]) -> dict[str, Any] | None:
    """One OpenAI tool call from a decoded JSON object, or ``None`` if it is malformed."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name or not _utf8_ok(name):
        return None
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if not isinstance(args, dict):
        return None
    return {
        "id": new_id(),
        "type": "function",
        "function": {"name": name, "arguments": _dump_arguments(args)},
    }


def _decode_at(text: str, pos: int) -> tuple[Any, int] | None:
    """Decode one JSON value starting at ``pos`` (after whitespace); ``None`` on any error."""
    try:
        return _DECODER.raw_decode(text, _skip_ws(text, pos))
    except (ValueError, RecursionError):
        return None


class HermesParser:
    """``<tool_call>{json}</tool_call>`` blocks (Qwen2.5, Hermes 2/3).

    The JSON is decoded in place, so a ``</tool_call>`` inside a string argument
    does not end the block. Content is the text outside the blocks: the part
    before the first block with trailing whitespace removed (so the template
    re-renders the message exactly), then any other non-blank text, each piece
    stripped, joined by newlines.
    """

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str, *, new_id: IdFactory | None = None) -> ParsedMessage:
        """See the class docstring; malformed markup → the whole text as content."""
        new_id = new_id or random_call_id
        plain = ParsedMessage(content=text)
        if self.open_tag not in text:
            return plain
        outside: list[str] = []
        calls: list[dict[str, Any]] = []
        pos = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                outside.append(text[pos:])
                break
            outside.append(text[pos:start])
            decoded = _decode_at(text, start + len(self.open_tag))
            if decoded is None:
                return plain
            obj, end = decoded
            end = _skip_ws(text, end)
            if not text.startswith(self.close_tag, end):
                return plain
            call = _tool_call(obj, new_id, ("arguments", "parameters"))
            if call is None:
                return plain
            calls.append(call)
            pos = end + len(self.close_tag)
        if any(self.close_tag in piece for piece in outside):
            return plain
        pieces = [outside[0].rstrip()] + [p.strip() for p in outside[1:]]
        content = "\n".join(p for p in pieces if p) or None
        return ParsedMessage(content=content, tool_calls=calls)


class Llama3JsonParser:
    """Llama 3.x JSON tool calls: the whole message is ``{"name": ..., "parameters": {...}}``.

    A leading ``<|python_tag|>`` is skipped; several calls may be separated by ``;``.
    ``arguments`` is accepted in place of ``parameters``. Anything else in the
    text makes it plain content.
    """

    name = "llama3_json"
    python_tag = "<|python_tag|>"

    def parse(self, text: str, *, new_id: IdFactory | None = None) -> ParsedMessage:
        """See the class docstring; malformed markup → the whole text as content."""
        new_id = new_id or random_call_id
        plain = ParsedMessage(content=text)
        body = text.strip()
        if body.startswith(self.python_tag):
            body = body[len(self.python_tag) :].lstrip()
        if not body.startswith("{"):
            return plain
        calls: list[dict[str, Any]] = []
        pos = 0
        while True:
            decoded = _decode_at(body, pos)
            if decoded is None:
                return plain
            call = _tool_call(decoded[0], new_id, ("parameters", "arguments"))
            if call is None:
                return plain
            calls.append(call)
            pos = _skip_ws(body, decoded[1])
            if pos == len(body):
                return ParsedMessage(content=None, tool_calls=calls)
            if body[pos] != ";":
                return plain
            pos += 1


class PlainParser:
    """No tool calls: the whole text is the content."""

    name = "none"

    def parse(self, text: str, *, new_id: IdFactory | None = None) -> ParsedMessage:
        """Return ``text`` as content."""
        return ParsedMessage(content=text)


_REGISTRY: dict[str, ToolCallParser] = {
    p.name: p for p in (HermesParser(), Llama3JsonParser(), PlainParser())
}


def register_parser(parser: ToolCallParser, *, replace: bool = False) -> None:
    """Make ``parser`` available as ``get_parser(parser.name)``.

    Raises :class:`ChatError` if the name is taken, unless ``replace=True``.
    """
    if parser.name in _REGISTRY and not replace:
        raise ChatError(
            f"a tool-call parser named {parser.name!r} is already registered; "
            "pass replace=True to replace it"
        )
    _REGISTRY[parser.name] = parser


def get_parser(name: str) -> ToolCallParser:
    """The parser registered as ``name``; raises :class:`UnknownParser` naming the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownParser(
            f"unknown tool-call parser {name!r}; known: {', '.join(parser_names())}"
        ) from None


def parser_names() -> list[str]:
    """The registered parser names, sorted."""
    return sorted(_REGISTRY)
