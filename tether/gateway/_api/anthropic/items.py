"""Anthropic Messages request → the chat-shaped fields the chat-completions path takes.

Pure functions, no HTTP. A Messages call is answered by the same code as a chat
completion: ``system`` and the content blocks become chat messages (so the same chat
template renders them and the same call is recorded), Anthropic tools become chat
tools, ``tool_choice`` becomes chat's (``any`` → ``required``, ``tool`` → a named
function: both forced by constrained decoding), ``output_config.format`` becomes
``response_format``.

How blocks become messages (the inverse of ``_messages_render.content_blocks``, so
that a conversation sent back block for block renders to exactly the tokens the
model produced and call k+1's prompt extends call k's prompt + completion):

- ``system`` (a string or text blocks) → a first ``system`` message; a ``system``
  message among ``messages`` (Anthropic's mid-conversation system messages, which
  Claude Code sends) → a ``system`` message there;
- a user message's ``text`` blocks → a ``user`` message (text parts, joined as chat
  joins them); each ``tool_result`` block → a ``tool`` message with its
  ``tool_use_id`` (its content a string or text blocks; ``is_error`` kept on the
  message, which chat templates do not render);
- an assistant message's ``text`` blocks → its content, ``tool_use`` blocks → its
  ``tool_calls`` (``input`` as JSON arguments), ``thinking`` blocks → its
  ``reasoning_content`` (rendered where the template renders reasoning, e.g. Qwen3's).

Every refusal is an :class:`InvalidRequest` (a 400) naming the field.
"""

from __future__ import annotations

import json
from typing import Any

from ..._errors import InvalidRequest
from .schema import CountTokensRequest, MessagesRequest

__all__ = ["ANTHROPIC_PARAM", "chat_fields", "chat_messages", "chat_tool_choice", "chat_tools"]

_BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking"),
    "system": ("text",),  # mid-conversation system messages (Claude Code sends them)
}
_TEXT_KEYS = {"type", "text", "cache_control", "citations"}
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict"}


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _unknown(obj: dict[str, Any], known: set[str]) -> list[str]:
    """The keys of ``obj`` tether does not implement (a key sent as null is no request)."""
    return sorted(k for k in set(obj) - known if obj[k] is not None)


def _text_block(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        raise _bad(f"{where}.type", f"{kind!r} is not supported here; tether renders text blocks")
    unknown = _unknown(block, _TEXT_KEYS)
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", "is not supported by tether; remove it")
    if not isinstance(block.get("text"), str):
        raise _bad(f"{where}.text", "must be a string")
    return block["text"]


def _texts(content: Any, where: str) -> str | list[dict[str, str]]:
    """A string, or text blocks as chat text parts (joined as chat content parts are)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of content blocks")
    return [
        {"type": "text", "text": _text_block(b, f"{where}[{j}]")} for j, b in enumerate(content)
    ]


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("tool_use_id"), str):
        raise _bad(f"{where}.tool_use_id", "must be a string")
    content = _texts(block.get("content", ""), f"{where}.content")
    message = {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}
    if block.get("is_error"):
        message["is_error"] = True
    return message


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
        raise _bad(where, "a tool_use block needs a string id and name")
    if not isinstance(block.get("input"), dict):
        raise _bad(f"{where}.input", "must be an object")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def _user(content: list[Any], where: str) -> list[dict[str, Any]]:
    """A user turn's blocks, in order: text runs as user messages, results as tool messages."""
    out: list[dict[str, Any]] = []
    parts: list[dict[str, str]] = []
    for j, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, f"{where}[{j}]"))
        else:
            parts.append({"type": "text", "text": _text_block(block, f"{where}[{j}]")})
    if parts or not out:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    texts, calls, thoughts = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_use":
            calls.append(_tool_use(block, f"{where}[{j}]"))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{where}[{j}].thinking", "must be a string")
            thoughts.append(block["thinking"])
        else:
            texts.append({"type": "text", "text": _text_block(block, f"{where}[{j}]")})
    message: dict[str, Any] = {"role": "assistant", "content": texts or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning_content"] = "\n".join(thoughts)
    return message


def _check_blocks(role: str, content: list[Any], where: str) -> None:
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind not in _BLOCKS[role]:
            raise _bad(
                f"{where}[{j}].type",
                f"{kind!r} blocks are not supported in {role} messages; tether renders "
                f"{', '.join(_BLOCKS[role])} blocks (no images, documents or server tools)",
            )


def chat_messages(system: str | list[dict[str, Any]] | None, messages: list[dict]) -> list[dict]:
    """The chat messages of a Messages ``system`` and ``messages``."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": _texts(system, "system")})
    if not messages:
        raise _bad("messages", "must not be empty")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in _BLOCKS:
            raise _bad(f"{where}.role", f"{role!r} is not one of user, assistant, system")
        # ``output_config`` on a message: a per-turn effort (Claude Code), without effect
        unknown = _unknown(message, {"role", "content", "output_config"})
        config = message.get("output_config")
        if config is not None and (not isinstance(config, dict) or set(config) - {"effort"}):
            unknown.insert(0, "output_config")
        if unknown:
            raise _bad(f"{where}.{unknown[0]}", "is not supported by tether; remove it")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise _bad(f"{where}.content", "must be a string or a list of content blocks")
        _check_blocks(role, content, f"{where}.content")
        if role == "system":
            out.append({"role": role, "content": _texts(content, f"{where}.content")})
        elif role == "user":
            out += _user(content, f"{where}.content")
        else:
            out.append(_assistant(content, f"{where}.content"))
    if messages[-1].get("role") == "assistant":
        raise _bad(
            f"messages[{len(messages) - 1}]",
            "a last assistant message (prefill) is not supported: tether renders a new "
            "assistant turn; end with a user message",
        )
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic custom tools (``name``, ``description``, ``input_schema``) → chat tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type", "custom") != "custom":
            raise _bad(
                f"tools[{i}].type",
                f"{tool.get('type')!r} tools are not supported; tether serves custom tools "
                "(name, description, input_schema; the agent runs them), not Anthropic's "
                "server or built-in tools",
            )
        unknown = _unknown(tool, _TOOL_KEYS)
        if unknown:
            raise _bad(f"tools[{i}].{unknown[0]}", "is not supported by tether; remove it")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{i}].name", "must be a non-empty string")
        if not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"tools[{i}].input_schema", "must be a JSON schema object")
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """(chat's ``tool_choice``, ``parallel_tool_calls``) for an Anthropic ``tool_choice``."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    unknown = _unknown(choice, {"type", "name", "disable_parallel_tool_use"})
    if unknown:
        raise _bad(f"tool_choice.{unknown[0]}", "is not supported by tether; remove it")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _bad(
        "tool_choice", "must be {'type': 'auto' | 'any' | 'none'} or {'type': 'tool', 'name': ...}"
    )


def _response_format(output_config: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (output_config or {}).get("format")
    if fmt is None:
        return None
    spec = {"name": "output", "schema": fmt.get("schema", {"type": "object"}), "strict": True}
    return {"type": "json_schema", "json_schema": spec}


def chat_fields(req: MessagesRequest | CountTokensRequest) -> dict[str, Any]:
    """The body of the equivalent chat-completions request (a count: without sampling)."""
    tool_choice, parallel = chat_tool_choice(req.tool_choice)
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req.system, req.messages),
        "tools": chat_tools(req.tools),
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "response_format": _response_format(req.output_config),
    }
    if isinstance(req, MessagesRequest):
        fields.update(
            max_completion_tokens=req.max_tokens,
            stop=req.stop_sequences or None,
            temperature=req.temperature,
            top_p=req.top_p,
            stream=req.stream,
        )
    return {k: v for k, v in fields.items() if v is not None}


# chat field → the Messages field a user wrote (for error messages)
ANTHROPIC_PARAM = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "response_format": "output_config.format",
}
