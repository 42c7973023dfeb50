"""Chat templates and tool-call parsing: OpenAI messages ⇄ token ids and text.

The gateway renders the prompt itself (:func:`render_prompt`), so the ids it
records are exactly what the model saw, and parses the completion text back
into an OpenAI assistant message (:func:`get_parser`), streamed or not
(:func:`stream_chunks`; :class:`LiveText` releases a completion's content
token by token while it is generated). :class:`PromptEncoder` encodes a growing
conversation's prompt text reusing the ids of the prefix it has seen;
:class:`HistoryCache` renders and encodes only a conversation's new turns.

Exceptions::

    tether.errors.TetherError
    └── ChatError                    base of everything raised here
        ├── InvalidMessages          malformed messages/tools, names index and field (→ 400)
        │   ├── UnsupportedContent   a non-text content part (image, audio, ...)
        │   └── TemplateRenderError  the chat template refused the conversation
        ├── MissingChatTemplate      the tokenizer has no chat template (a setup mistake)
        └── UnknownParser            no tool-call parser of that name

Model output never raises: text a parser cannot read comes back as content.
"""

from __future__ import annotations

from tether.chat._errors import (
    ChatError,
    InvalidMessages,
    MissingChatTemplate,
    TemplateRenderError,
    UnknownParser,
    UnsupportedContent,
)
from tether.chat._history import HistoryCache
from tether.chat._incremental import LiveText, live_prefix
from tether.chat._parsers import (
    CallIds,
    ParsedMessage,
    ToolCallParser,
    finish_reason_for,
    get_parser,
    parser_names,
    random_call_id,
    register_parser,
)
from tether.chat._prompt import PromptEncoder, turn_token
from tether.chat._render import (
    decode_completion,
    normalize_messages,
    normalize_tools,
    render_prompt,
    render_text,
)
from tether.chat._stream import assemble_chunks, stream_chunks, usage_chunk

__all__ = [
    "CallIds",
    "ChatError",
    "HistoryCache",
    "InvalidMessages",
    "LiveText",
    "MissingChatTemplate",
    "ParsedMessage",
    "PromptEncoder",
    "TemplateRenderError",
    "ToolCallParser",
    "UnknownParser",
    "UnsupportedContent",
    "assemble_chunks",
    "decode_completion",
    "finish_reason_for",
    "get_parser",
    "live_prefix",
    "normalize_messages",
    "normalize_tools",
    "parser_names",
    "random_call_id",
    "register_parser",
    "render_prompt",
    "render_text",
    "stream_chunks",
    "turn_token",
    "usage_chunk",
]
