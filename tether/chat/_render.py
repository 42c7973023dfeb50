"""OpenAI messages → the model's chat template → prompt token ids.

The gateway owns tokenization: it renders the prompt here and sends the ids to
the engine, so what is recorded is exactly what the model saw.

How the ids are made: the template is rendered to a string with
``apply_chat_template(..., tokenize=False)`` and that string is encoded with
``tokenizer.encode(text, add_special_tokens=False)``. This is exactly what
``tokenize=True`` does inside transformers (a test asserts the ids are equal),
but it gives one code path for :func:`render_text` and :func:`render_prompt`,
so the text shown by ``tether rollouts show`` is the text that was encoded, and
it does not depend on the return type of ``tokenize=True``, which changed from
``list[int]`` (transformers 4) to ``BatchEncoding`` (transformers 5).
``add_special_tokens=False`` because a chat template writes its own BOS;
adding it again would double it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from tether.chat._errors import (
    InvalidMessages,
    MissingChatTemplate,
    TemplateRenderError,
    UnsupportedContent,
)

__all__ = [
    "PART_SEPARATOR",
    "decode_completion",
    "normalize_messages",
    "normalize_tools",
    "render_prompt",
    "render_text",
]

#: Text content parts are joined with this, as vLLM does.
PART_SEPARATOR = "\n"

_ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system"}


def _as_dict(obj: Any, where: str) -> dict[str, Any]:
    """A plain dict from a mapping or a pydantic model; anything else is an error."""
    if hasattr(obj, "model_dump") and not isinstance(obj, Mapping):
        obj = obj.model_dump(exclude_none=True)
    if not isinstance(obj, Mapping):
        raise InvalidMessages(f"{where} must be an object, got {type(obj).__name__}")
    return dict(obj)


def _content_text(content: Any, where: str) -> str:
    """A message's content as one string; text parts are joined with :data:`PART_SEPARATOR`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise InvalidMessages(
            f"{where} must be a string or a list of content parts, got {type(content).__name__}"
        )
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        part = _as_dict(part, f"{where}[{j}]")
        kind = part.get("type")
        if kind != "text":
            raise UnsupportedContent(
                f"{where}[{j}] has type {kind!r}; only 'text' content parts can be rendered"
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidMessages(f"{where}[{j}].text must be a string")
        texts.append(text)
    return PART_SEPARATOR.join(texts)


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as the dict templates expect; a JSON string is parsed.

    An empty string means no arguments (``{}``). A string that is not a JSON
    object is kept as it is, so nothing the agent sent is lost.
    """
    if not isinstance(arguments, str):
        return {} if arguments is None else arguments
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    return parsed if isinstance(parsed, dict) else arguments


def _named_function(obj: dict[str, Any], where: str) -> dict[str, Any]:
    """``obj["function"]`` as a dict with a non-empty string ``name``, else InvalidMessages."""
    function = _as_dict(obj.get("function"), f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidMessages(f"{where}.function.name must be a non-empty string")
    return function


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, (list, tuple)):
        raise InvalidMessages(f"{where} must be a list, got {type(calls).__name__}")
    out = []
    for j, call in enumerate(calls):
        call = _as_dict(call, f"{where}[{j}]")
        function = _named_function(call, f"{where}[{j}]")
        function["arguments"] = _arguments(function.get("arguments"))
        call["function"] = function
        call.setdefault("type", "function")
        out.append({k: v for k, v in call.items() if v is not None})
    return out


def _message(message: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    msg = _as_dict(message, where)
    role = msg.get("role")
    if role is None:
        raise InvalidMessages(f"{where}.role is missing")
    if role not in _ROLES:
        raise InvalidMessages(f"{where}.role is {role!r}; expected one of {', '.join(_ROLES)}")
    msg["role"] = _ROLE_ALIASES.get(role, role)
    calls = _tool_calls(msg["tool_calls"], f"{where}.tool_calls") if msg.get("tool_calls") else []
    if role != "assistant" and calls:
        raise InvalidMessages(f"{where}.tool_calls is only allowed on assistant messages")
    content = msg.get("content")
    if content is None:
        if role != "assistant" or not calls:
            raise InvalidMessages(f"{where}.content is missing")
        content = ""
    msg["content"] = _content_text(content, f"{where}.content")
    msg.pop("tool_calls", None)
    if calls:
        msg["tool_calls"] = calls
    # Templates test ``message.name is defined``; an explicit None would render "None".
    return {k: v for k, v in msg.items() if v is not None}


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages → the plain form Hugging Face chat templates expect.

    - content given as a list of text parts is joined into one string;
      any other part type raises :class:`UnsupportedContent`;
    - an assistant message with ``tool_calls`` and no content gets ``""``;
    - ``tool_calls[].function.arguments`` given as a JSON string is parsed to a dict
      (invalid JSON is kept as the string; ``""`` becomes ``{}``);
    - role ``developer`` becomes ``system``; ``tool`` messages keep ``tool_call_id``/``name``;
    - keys whose value is ``None`` are dropped.

    The input is not modified. Raises :class:`InvalidMessages` naming the index and
    field for a non-list, an empty list, a non-object message, an unknown or missing
    role, or missing content.
    """
    if not isinstance(messages, (list, tuple)):
        raise InvalidMessages(f"messages must be a list, got {type(messages).__name__}")
    if not messages:
        raise InvalidMessages("messages must contain at least one message")
    return [_message(m, i) for i, m in enumerate(messages)]


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check the OpenAI ``tools`` list (each ``{"type": "function", "function": {"name": ...}}``).

    Returns plain dicts, or ``None`` for ``None`` or an empty list (so a template
    that tests ``if tools`` sees no tools). Raises :class:`InvalidMessages`.
    """
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)):
        raise InvalidMessages(f"tools must be a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        tool = _as_dict(tool, f"tools[{i}]")
        function = _named_function(tool, f"tools[{i}]")
        out.append({**tool, "function": function})
    return out or None


def render_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render OpenAI ``messages`` (and ``tools``) with the tokenizer's own chat template.

    ``continue_final_message`` leaves the last (assistant) message open for the
    model to continue (prefill); it excludes ``add_generation_prompt``.
    ``template_kwargs`` are passed to the template (vLLM's ``chat_template_kwargs``,
    e.g. ``{"enable_thinking": False}``).

    Raises :class:`InvalidMessages` (including :class:`TemplateRenderError`) and
    :class:`MissingChatTemplate`.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise MissingChatTemplate(
            f"tokenizer {name!r} has no chat template; use a chat (instruct) model "
            "or set tokenizer.chat_template"
        )
    msgs = normalize_messages(messages)
    if continue_final_message and add_generation_prompt:
        add_generation_prompt = False
    try:
        text = tokenizer.apply_chat_template(
            msgs,
            tools=normalize_tools(tools),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **dict(template_kwargs or {}),
        )
    except InvalidMessages:
        raise
    except Exception as exc:  # jinja2 errors and the template's raise_exception()
        raise TemplateRenderError(f"the chat template failed on these messages: {exc}") from exc
    if not isinstance(text, str):  # pragma: no cover - a tokenizer that ignores tokenize=False
        raise TemplateRenderError(f"apply_chat_template returned {type(text).__name__}, not str")
    return text


def render_prompt(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """The prompt token ids: :func:`render_text` encoded with ``add_special_tokens=False``."""
    text = render_text(
        tokenizer,
        messages,
        tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=template_kwargs,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def decode_completion(
    tokenizer: Any, completion_ids: Sequence[int], *, stop_token_ids: Sequence[int] | None = None
) -> str:
    """The completion text to hand to a tool-call parser.

    A trailing stop token (default: the tokenizer's EOS) is dropped; every other
    token is kept, special or not, because tool-call markers such as
    ``<tool_call>`` may be special tokens. Spaces are never "cleaned up", so the
    text is exactly what the tokens spell.
    """
    ids = list(completion_ids)
    stops = set(stop_token_ids) if stop_token_ids is not None else set()
    if stop_token_ids is None and getattr(tokenizer, "eos_token_id", None) is not None:
        stops.add(tokenizer.eos_token_id)
    if ids and ids[-1] in stops:
        ids.pop()
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
