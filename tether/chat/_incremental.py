"""Completion ids arriving one by one → the content text that is safe to stream now.

A streamed answer must reassemble to the message a non-streamed call returns
(and that the store records): :func:`~tether.chat.decode_completion`, stop
strings trimmed, then the tool-call parser. :class:`LiveText` follows the ids
as they come and releases only text that is certain to begin the final
content, whatever tokens follow:

- a character cut in half by a token boundary waits for its other bytes;
- a suffix that could be the start of a stop string waits (a stop string
  found ends the text there);
- the parser's markup: :func:`live_prefix` holds back what a tool-call parser
  might still turn into a tool call. Hermes: everything from the first
  ``<tool_call>`` on (and the trailing whitespace before it, which the parser
  strips). Llama 3 JSON: the whole text once it starts with ``{`` or
  ``<|python_tag|>``. A parser tether does not know: everything. The parsers
  are all or nothing (one malformed call makes the whole text content), so a
  tool call is only known when the completion ends; text before the markup
  streams live.

Whatever was held back comes out at the end (:meth:`LiveText.rest`), with the
tool calls of the final message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LiveText", "live_prefix"]

_HERMES_OPEN = "<tool_call>"
_PYTHON_TAG = "<|python_tag|>"


def _partial_suffix(text: str, marks: Sequence[str]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of one of ``marks``."""
    best = 0
    for mark in marks:
        for k in range(min(len(mark) - 1, len(text)), best, -1):
            if text.endswith(mark[:k]):
                best = k
                break
    return best


def live_prefix(parser_name: str | None, text: str) -> int:
    """How many characters of ``text`` (the visible completion so far) are sure to begin the
    content of the final message, for the tool-call parser ``parser_name`` (None: no parsing)."""
    if parser_name in (None, "none"):
        return len(text)
    if parser_name == "hermes":
        at = text.find(_HERMES_OPEN)
        if at < 0:
            at = len(text) - _partial_suffix(text, (_HERMES_OPEN,))
        return len(text[:at].rstrip())
    if parser_name == "llama3_json":
        body = text.lstrip()
        if not body:
            return 0
        if body.startswith(_PYTHON_TAG):
            after = body[len(_PYTHON_TAG) :].lstrip()
            return 0 if not after or after.startswith("{") else len(text)
        if body.startswith("{") or _PYTHON_TAG.startswith(body):
            return 0
        return len(text)
    return 0


class LiveText:
    """The visible text of one completion, token by token; see the module docstring.

    ``feed(token_id)`` returns the text newly safe to send (often ``""``);
    ``rest(content)`` returns what is left of the final ``content`` once the
    completion is done (``None`` if the text already sent is not a prefix of it,
    which the checks above rule out for the parsers tether knows).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        parser_name: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_token_ids)
        self.stops = tuple(s for s in stop if s)
        self.parser_name = parser_name
        self.ids: list[int] = []
        self.text = ""  # the decoded text of ids[:read] (stop tokens excepted)
        self.sent = ""
        self.stopped = False  # a stop string or token was seen: nothing more is visible
        self._start = 0  # ids[_start:read] are decoded again with each new token (context)
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def feed(self, token_id: int) -> str:
        if self.stopped:
            return ""
        if token_id in self.stop_ids:  # decode_completion drops it; the engine stops after it
            self.stopped = True
            return ""
        self.ids.append(token_id)
        head = self._decode(self.ids[self._start : self._read])
        whole = self._decode(self.ids[self._start :])
        if whole.endswith("\ufffd") or not whole.startswith(head):
            return ""  # a character split across tokens: wait for the rest
        self.text += whole[len(head) :]
        self._start, self._read = self._read, len(self.ids)
        return self._release()

    def _release(self) -> str:
        visible = self.text
        cut = min((i for s in self.stops if (i := visible.find(s)) >= 0), default=-1)
        if cut >= 0:
            visible, self.stopped = visible[:cut], True
        else:
            visible = visible[: len(visible) - _partial_suffix(visible, self.stops)]
        safe = visible[: live_prefix(self.parser_name, visible)]
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def rest(self, content: str | None) -> str | None:
        """What is left to send of the final message's ``content``."""
        content = content or ""
        if not content.startswith(self.sent):
            return None
        return content[len(self.sent) :]
