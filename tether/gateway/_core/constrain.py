"""OpenAI request fields → a grammar :class:`~tether.engine.Constraint`.

:func:`constraint_for` is the one mapping, from plain chat-shaped fields
(``response_format``, ``tools`` in chat shape, ``tool_choice``), so chat
completions and the Responses route (``text.format``) build the same grammar:

- ``response_format`` ``json_schema`` / ``json_object`` → one JSON value (compact,
  ``json.dumps``' separators), then the end-of-turn token;
- ``tool_choice`` ``"required"`` or a named function → the output is a tool call
  in the served model's format (``hermes``: a ``<tool_call>`` block;
  ``llama3_json``: a JSON object), the arguments valid against the tool's schema;
  several calls (hermes) only with ``parallel_tool_calls: true``;
- ``tool_choice`` ``"auto"`` with a ``strict: true`` tool → free text, but a tool
  call, once opened, follows the tool's schema (an xgrammar triggered tag);
- ``response_format`` with tools under ``"auto"`` → the JSON value or tool calls.

Schemas are checked first (:func:`check_schema`): keywords the grammar would
silently ignore, nesting (``$ref`` followed) beyond :data:`MAX_DEPTH`, or a
schema beyond :data:`MAX_SCHEMA_BYTES` get a 400 naming the problem.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from tether.engine import (
    Constraint,
    ConstraintError,
    Engine,
    MissingStructuredExtra,
    SamplingParams,
    UnsupportedParams,
    json_schema_format,
)

from .._errors import InvalidRequest

__all__ = ["MAX_DEPTH", "MAX_SCHEMA_BYTES", "check_schema", "constrain", "constraint_for"]

MAX_DEPTH = 10  # nesting of objects/arrays/combinators, through $ref; a recursive $ref exceeds it
MAX_SCHEMA_BYTES = 32_768  # the schema as compact JSON
MAX_PROPERTIES = 500  # property definitions in one schema, counted through $ref

# What the grammar enforces, plus annotations it may ignore. Anything else would be
# silently dropped by the grammar, so it is refused by name.
_ENFORCED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
    "definitions", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
}  # fmt: skip
_ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "discriminator", "strict", "nullable",
}  # fmt: skip
_FORMATS = {
    "date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6",
    "uri", "uri-reference", "uuid",
}  # fmt: skip
_SUBSCHEMA = ("items", "additionalProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_TOOL_FORMATS = {  # parser name -> (trigger, begin of a call to NAME, end of a call)
    "hermes": ("<tool_call>", '<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
    "llama3_json": ('{"name": "', '{{"name": "{name}", "parameters": ', "}"),
}
_SEPARATOR = {"hermes": "\n", "llama3_json": "; "}


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def check_schema(schema: Any, param: str) -> None:
    """Refuse a JSON schema the grammar cannot enforce faithfully (400 naming why)."""
    if not isinstance(schema, dict | bool):
        raise _bad(f"{param} must be a JSON schema object", param)
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > MAX_SCHEMA_BYTES:
        raise _bad(f"{param} is {size} bytes; the limit is {MAX_SCHEMA_BYTES}", param)
    counted = [0]
    _walk(schema, schema, param, "#", 0, counted)


def _walk(node: Any, root: Any, param: str, path: str, depth: int, counted: list[int]) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise _bad(f"{param}: {path} must be a schema object, not {type(node).__name__}", param)
    if depth > MAX_DEPTH:
        raise _bad(
            f"{param}: {path} nests deeper than {MAX_DEPTH} levels (recursive schemas are "
            "not supported: the grammar would be unbounded)",
            param,
        )
    for key in node:
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            raise _bad(
                f"{param}: keyword {key!r} at {path} is not supported by constrained decoding "
                "(the grammar would ignore it); remove it",
                param,
            )
    if "format" in node and node["format"] not in _FORMATS:
        raise _bad(f"{param}: format {node['format']!r} at {path} is not supported", param)
    if len(node.get("allOf", [])) > 1:
        raise _bad(f"{param}: allOf with several schemas at {path} is not supported", param)
    for key in _SUBSCHEMA:
        if isinstance(node.get(key), dict):
            _walk(node[key], root, param, f"{path}/{key}", depth + 1, counted)
    for key in _SUBSCHEMA_LISTS:
        subs = node.get(key) or []
        if not isinstance(subs, list):
            raise _bad(f"{param}: {key} at {path} must be a list of schemas", param)
        for i, sub in enumerate(subs):
            _walk(sub, root, param, f"{path}/{key}/{i}", depth + 1, counted)
    props = node.get("properties") or {}
    if not isinstance(props, dict):
        raise _bad(f"{param}: properties at {path} must be an object", param)
    counted[0] += len(props)
    if counted[0] > MAX_PROPERTIES:
        raise _bad(f"{param} defines more than {MAX_PROPERTIES} properties", param)
    for name, sub in props.items():
        _walk(sub, root, param, f"{path}/properties/{name}", depth + 1, counted)
    if "$ref" in node:
        _walk(_resolve(root, node["$ref"], param), root, param, node["$ref"], depth + 1, counted)


def _resolve(root: Any, ref: Any, param: str) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise _bad(f"{param}: only local $ref ('#/...') is supported, not {ref!r}", param)
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise _bad(f"{param}: $ref {ref!r} points to nothing", param)
        node = node[part]
    return node


def _json_format(schema: Any, strict: bool, param: str) -> dict[str, Any]:
    check_schema(schema, param)
    try:
        return json_schema_format(schema, strict=strict)
    except ConstraintError as exc:
        raise _bad(f"{param}: {exc}", param) from None


def _response_format(rf: dict[str, Any] | None) -> tuple[dict[str, Any] | None, str]:
    """(the JSON format, its label), or (None, "text") for text / no response_format."""
    kind = (rf or {}).get("type", "text")
    if kind == "text":
        return None, "text"
    if kind == "json_object":
        return _json_format({"type": "object"}, False, "response_format"), "json_object"
    if kind != "json_schema":
        raise _bad(
            f"response_format type {kind!r} is not supported; use text, json_object or json_schema",
            "response_format",
        )
    # chat nests the schema under "json_schema"; Responses' text.format has it flat
    spec = rf.get("json_schema", rf if "schema" in rf else None) if rf else None
    if not isinstance(spec, dict):
        raise _bad("response_format json_schema needs a json_schema object", "response_format")
    schema = spec.get("schema", {"type": "object"})
    fmt = _json_format(schema, spec.get("strict") is not False, "response_format.json_schema")
    return fmt, f"json_schema:{spec.get('name', 'response')}"


def _tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def _tool_format(
    parser: str, tools: list[dict[str, Any]], only: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """One tag per tool (those in ``only`` when given: forced, the arguments then follow
    the tool's schema): its call in ``parser``'s format; the arguments of the others
    follow the schema when the tool is ``strict``, else they are any JSON object."""
    _, begin, end = _TOOL_FORMATS[parser]
    tags = []
    for i, tool in enumerate(tools):
        if only is not None and not any(tool is t for t in only):
            continue
        schemas = only is not None
        fn = _tool_function(tool)
        name = fn.get("name")
        if not isinstance(name, str) or not name or '"' in name or "\\" in name:
            raise _bad(f"tools[{i}] needs a plain function name", f"tools[{i}].function.name")
        if schemas or fn.get("strict") is True:
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            content = _json_format(params, True, f"tools[{i}].function.parameters")
        else:
            content = _json_format({"type": "object"}, False, f"tools[{i}].function.parameters")
        tags.append(
            {"type": "tag", "begin": begin.format(name=name), "content": content, "end": end}
        )
    return tags


def _forced(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]] | None:
    """The tools a call is forced to use, or None when the call is not forced."""
    if choice == "required":
        if not tools:
            raise _bad("tool_choice 'required' needs tools", "tool_choice")
        return tools
    if not isinstance(choice, dict):
        return None
    name = (choice.get("function") or {}).get("name") or choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise _bad(
            "tool_choice must be 'auto', 'none', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    chosen = [t for t in tools if _tool_function(t).get("name") == name]
    if not chosen:
        raise _bad(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
    return chosen[:1]


def _checked(constraint: Constraint, param: str) -> Constraint:
    try:
        constraint.check()
    except ConstraintError as exc:
        raise _bad(f"{param}: {exc}", param) from None
    return constraint


def constraint_for(
    *,
    response_format: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None,
    tool_choice: str | dict[str, Any] | None,
    parallel_tool_calls: bool | None = None,
    tool_parser: str = "hermes",
) -> Constraint | None:
    """The grammar these request fields ask for (see the module docstring), or None.

    ``response_format`` in chat shape, or a Responses ``text.format`` (``name``,
    ``schema``, ``strict`` at its top level); ``tools`` in chat shape (``{"type": "function", "function": {...}}``; the Responses
    shape with ``name``/``parameters`` at the top level is read too); ``tool_parser``
    the gateway's tool-call format. Raises :class:`InvalidRequest` (a 400) naming the problem.
    """
    tools = list(tools or []) if tool_choice != "none" else []
    try:
        forced = _forced(tools, tool_choice)
        json_fmt, json_label = _response_format(response_format)
        strict = [t for t in tools if _tool_function(t).get("strict") is True]
        if not (forced or strict or (json_fmt and tools)):
            return (
                _checked(Constraint.of(json_fmt, json_label), "response_format")
                if json_fmt
                else None
            )
        if tool_parser not in _TOOL_FORMATS:
            raise _bad(
                f"forcing or constraining tool calls needs a tool-call format; this gateway's "
                f"tool_parser is {tool_parser!r} (known formats: {', '.join(_TOOL_FORMATS)})",
                "tool_choice",
            )
        # A forced call is one call unless parallel calls are asked for by name: a weak
        # model would otherwise repeat calls until max_tokens.
        single = (
            parallel_tool_calls is False
            or (forced is not None and parallel_tool_calls is not True)
            or (tool_parser == "llama3_json")
        )
        calls = {
            "type": "tags_with_separator",
            "tags": _tool_format(tool_parser, tools, forced),
            "separator": _SEPARATOR[tool_parser],
            "at_least_one": True,
            "stop_after_first": single,
        }
        if forced:
            label = "tool_choice:" + (
                "required" if tool_choice == "required" else _tool_function(forced[0])["name"]
            )
            return _checked(Constraint.of(calls, label), "tool_choice")
        if json_fmt:
            either = {"type": "or", "elements": [json_fmt, calls]}
            return _checked(Constraint.of(either, json_label), "response_format")
        trigger = _TOOL_FORMATS[tool_parser][0]
        auto = {
            "type": "triggered_tags",
            "triggers": [trigger],
            "tags": calls["tags"],
            "stop_after_first": single,
        }
        return _checked(Constraint.of(auto, "strict_tools"), "tools")
    except MissingStructuredExtra as exc:
        raise _bad(str(exc), "response_format" if response_format else "tool_choice") from None


def constrain(
    engine: Engine, params: SamplingParams, constraint: Constraint | None
) -> SamplingParams:
    """``params`` with ``constraint``; 400 when the engine cannot honour one, or cannot
    serve the sampling parameters with exact logprobs (its ``check_params``: vLLM's top_p).

    ``strict`` tools under ``tool_choice: "auto"`` only tighten what the request already
    allows, so on such an engine (the scripted test engines) they stay render-only.
    """
    try:
        engine.check_params(params)
    except UnsupportedParams as exc:
        raise InvalidRequest(str(exc), param=exc.param) from exc
    if constraint is None:
        return params
    supported = engine.supports_constraints
    if not supported and constraint.label == "strict_tools":
        return params
    if not supported:
        param = "response_format" if constraint.label.startswith("json") else "tool_choice"
        raise InvalidRequest(
            f"{param} ({constraint.label}) needs constrained decoding, which this gateway's "
            f"engine ({type(engine).__name__}) cannot do; serve with the transformers engine",
            param=param,
        )
    return replace(params, constraint=constraint)
