"""Chat templates and tool-call parsing: OpenAI messages ⇄ token ids and text.

The gateway renders the prompt itself (:func:`render_prompt`), so the ids it
records are exactly what the model saw, and parses the completion text back
into an OpenAI assistant message (:func:`get_parser`), streamed or not
(:class:`LiveText` releases a completion's content token by token while it
is generated). :class:`PromptEncoder` encodes a growing
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

from typing import TYPE_CHECKING

from tether._lazy import lazy_face

#: The package's face, read by tether._lazy.lazy_face: each name is imported on first use
#: (`tether` starts with two of its modules; the rest load when a run renders prompts).
if TYPE_CHECKING:
    from ._errors import ChatError as ChatError
    from ._errors import InvalidMessages as InvalidMessages
    from ._errors import MissingChatTemplate as MissingChatTemplate
    from ._errors import TemplateRenderError as TemplateRenderError
    from ._errors import UnknownParser as UnknownParser
    from ._errors import UnsupportedContent as UnsupportedContent
    from ._history import HistoryCache as HistoryCache
    from ._incremental import LiveText as LiveText
    from ._parsers import ParsedMessage as ParsedMessage
    from ._parsers import ToolCallParser as ToolCallParser
    from ._parsers import finish_reason_for as finish_reason_for
    from ._parsers import get_parser as get_parser
    from ._parsers import parser_names as parser_names
    from ._parsers import register_parser as register_parser
    from ._prompt import PromptEncoder as PromptEncoder
    from ._render import decode_completion as decode_completion
    from ._render import render_prompt as render_prompt
    from ._render import render_text as render_text

__getattr__, __dir__, __all__ = lazy_face(__name__)
