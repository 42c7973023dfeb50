"""The starter model's special tokens and its ChatML chat template.

The template follows Qwen2.5's: a system turn (with a ``<tools>`` block and
instructions when tools are given), user and assistant turns framed by
``<|im_start|>role\\n … <|im_end|>\\n``, assistant tool calls rendered as::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "3 + 4"}}
    </tool_call>

and tool results as ``<tool_response>`` blocks inside one user turn
(consecutive tool messages grouped). Rendering is *prefix-stable*: the
rendering of a conversation extends the rendering of any earlier prefix of it
ended by ``add_generation_prompt``, token for token, when the model emitted
the canonical format. The gateway relies on this to merge the calls of one
rollout into one training sequence.

Arguments given as a dict are rendered with ``tojson`` (``json.dumps`` with
its default separators); arguments given as a string (as the OpenAI SDK sends
them back) are rendered raw, so the model's own text comes back unchanged.
"""

from __future__ import annotations

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "ENDOFTEXT",
    "IM_END",
    "IM_START",
    "SPECIAL_TOKENS",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_RESPONSE_END",
    "TOOL_RESPONSE_START",
]

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
# Single ids, but not "special": decode(skip_special_tokens=True) keeps them,
# so a tool-call parser sees them in the text (as with Qwen2.5).
ADDED_TOKENS: tuple[str, ...] = (
    TOOL_CALL_START,
    TOOL_CALL_END,
    TOOL_RESPONSE_START,
    TOOL_RESPONSE_END,
)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions. "
    "Their signatures are within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _jinja_str(text: str) -> str:
    """``text`` as a Jinja string literal (double-quoted, escaped)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


# Content may be a string, None, missing, or a list of OpenAI content parts;
# only the text parts are rendered.
_CONTENT_MACRO = """{%- macro render_content(content) -%}
    {%- if content is none or content is undefined -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
"""

CHAT_TEMPLATE = (
    _CONTENT_MACRO
    + """
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) }}
    {%- else %}
        {{- """
    + _jinja_str(DEFAULT_SYSTEM_PROMPT)
    + """ }}
    {%- endif %}
    {{- """
    + _jinja_str(TOOLS_PREAMBLE)
    + """ }}
    {%- for tool in tools %}
        {{- '\\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- """
    + _jinja_str(TOOLS_POSTAMBLE)
    + """ }}
    {{- '<|im_end|>\\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\n' + """
    + _jinja_str(DEFAULT_SYSTEM_PROMPT)
    + """ + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) }}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant' }}
        {%- set text = render_content(message.content) %}
        {%- if text or not message.tool_calls %}
            {{- '\\n' + text }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
)
