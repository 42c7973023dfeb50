"""The exceptions of :mod:`tether.chat` (the tree is drawn in the package docstring)."""

from __future__ import annotations

from tether.errors import TetherError

__all__ = [
    "ChatError",
    "InvalidMessages",
    "MissingChatTemplate",
    "TemplateRenderError",
    "UnknownParser",
    "UnsupportedContent",
]


class ChatError(TetherError):
    """Base of every error raised by :mod:`tether.chat`."""


class InvalidMessages(ChatError, ValueError):
    """The request's ``messages`` or ``tools`` are malformed.

    The message names the offending place, e.g. ``messages[2].content is missing``.
    A caller's mistake: the gateway answers it with 400.
    """


class UnsupportedContent(InvalidMessages):
    """A content part that cannot be rendered as text (image, audio, file, ...)."""


class TemplateRenderError(InvalidMessages):
    """The chat template refused the messages (its ``raise_exception`` or a Jinja error).

    Usually the conversation breaks a rule of the model's template (say, a system
    message that is not first), so it counts as a caller's mistake, as in vLLM.
    """


class MissingChatTemplate(ChatError):
    """The tokenizer has no chat template: not a chat model, or saved without one."""


class UnknownParser(ChatError, ValueError):
    """No tool-call parser is registered under the requested name."""
