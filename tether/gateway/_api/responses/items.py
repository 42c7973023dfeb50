"""Responses-API input → the chat-shaped fields the chat-completions path takes.

Pure functions, no HTTP. A Responses call is answered by the same code as a chat
completion: the items become chat messages (so the same chat template renders
them and the same call is recorded), Responses tools become chat tools,
``text.format`` becomes ``response_format``.

How items become messages (the inverse of ``_responses_render.output_items``, so
that a conversation sent back item for item renders to exactly the tokens the
model produced and call k+1's prompt extends call k's prompt + completion):

- ``instructions`` → a first ``system`` message;
- a message item (``{"role", "content"}``, ``type`` ``"message"`` or absent) → a
  message with the text of its ``input_text`` / ``output_text`` parts (or its
  string content); ``developer`` becomes ``system`` as in chat;
- ``function_call`` items → ``tool_calls`` of the assistant message just before
  them (the model's turn was "text, then calls"), or of a new assistant message;
- ``function_call_output`` → a ``tool`` message with its ``call_id``.

Every refusal is an :class:`InvalidRequest` (a 400) naming the item and the field.
"""

from __future__ import annotations

from typing import Any

from ..._errors import InvalidRequest
from .schema import ResponsesRequest

__all__ = [
    "RESPONSES_PARAM",
    "chat_fields",
    "chat_messages",
    "chat_response_format",
    "chat_tool_choice",
    "chat_tools",
]

_ROLES = ("user", "assistant", "system", "developer")
_TEXT_PARTS = ("input_text", "output_text")
_FUNCTION_KEYS = {"type", "name", "description", "parameters", "strict"}


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _text(content: Any, where: str) -> str:
    """A message's or a tool output's text: a string, or the text of its text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(where, "must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise _bad(
                f"{where}[{j}].type",
                f"{kind!r} is not supported; tether renders text parts only ({', '.join(_TEXT_PARTS)})",
            )
        if not isinstance(part.get("text"), str):
            raise _bad(f"{where}[{j}].text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)  # as chat content parts are joined (tether.chat.PART_SEPARATOR)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise _bad(f"{where}.{key}", "must be a string")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def chat_messages(input: str | list[dict[str, Any]], instructions: str | None) -> list[dict]:
    """The chat messages of a Responses ``input`` (and ``instructions``)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(input, str):
        return [*messages, {"role": "user", "content": input}]
    if not input:
        raise _bad("input", "must not be empty")
    for i, item in enumerate(input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{where}.role", f"{role!r} is not one of {', '.join(_ROLES)}")
            if "content" not in item:
                raise _bad(f"{where}.content", "is missing")
            messages.append({"role": role, "content": _text(item["content"], f"{where}.content")})
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise _bad(f"{where}.call_id", "must be a string")
            output = _text(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise _bad(
                f"{where}.type",
                f"{kind!r} items are not supported; tether takes message, function_call and "
                "function_call_output items",
            )
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``name``/``parameters`` at the top) → chat tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise _bad(
                f"tools[{i}].type",
                f"{tool.get('type')!r} tools are not supported; tether serves function tools "
                "(the agent runs them)",
            )
        unknown = sorted(set(tool) - _FUNCTION_KEYS)
        if unknown:
            raise _bad(f"tools[{i}].{unknown[0]}", "is not supported by tether; remove it")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _bad(f"tools[{i}].name", "must be a non-empty string")
        function = {k: v for k, v in tool.items() if k != "type" and v is not None}
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """``auto``/``none``/``required`` as they are; ``{"type": "function", "name"}`` → chat's."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise _bad(
            "tool_choice",
            "must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}",
        )
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` → chat's ``response_format`` (json_schema moves under ``json_schema``)."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        keys = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}
    raise _bad("text.format.type", f"{kind!r} is not one of text, json_object, json_schema")


def chat_fields(req: ResponsesRequest) -> dict[str, Any]:
    """The body of the equivalent chat-completions request."""
    fields: dict[str, Any] = {
        "model": req.model,
        "messages": chat_messages(req.input, req.instructions),
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": chat_response_format(req.text),
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
        "logprobs": req.logprobs or None,
        "top_logprobs": req.top_logprobs if req.logprobs else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


# chat field → the Responses field a user wrote (for error messages)
RESPONSES_PARAM = {
    "messages": "input",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
}
