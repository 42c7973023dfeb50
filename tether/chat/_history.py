"""A conversation's next prompt from its previous one: render and encode only the new turns.

A multi-turn agent resends its whole history on every call. :class:`HistoryCache`
keeps, per conversation (the gateway's rollout and attempt), the previous
call's messages, tools, prompt text and ids. When the next call's messages
start with exactly those messages (deep equality) and its tools are the same,
only the new messages ``D`` are rendered, in a small context, and only their
text is encoded:

- ``ctx`` = the first message and the last old turn (the template's view of the
  system turn and of the turn the new ones follow; consecutive tool messages
  count as one turn, as templates group them);
- ``tail`` = ``render(ctx + D)`` minus ``render(ctx, no generation prompt)``;
- text = the previous text minus its generation prompt, + ``tail``;
- ids = the previous ids minus the generation prompt's ids, + ``encode(tail)``.

When that is exact, and the guards: the generation prompt, the tail and the
generation prompt of the previous text each start with a turn token at which
the tokenizer encodes exactly piecewise (``turn_token``, see ``_prompt.py``);
``render(ctx)`` extends ``render(first message)`` and its last turn is how the
previous text ended; the previous ids end with the generation prompt's ids.
Any guard that fails, and every call that does not extend the previous one,
takes the full path (render everything, then :class:`PromptEncoder`).

What the guards cannot see is a template that renders an old turn differently
because of a later one (Qwen3 drops the reasoning of assistant turns before
the last user message). So the first ``verify`` incremental results, and one
in ``verify_every`` after that, are also computed in full and compared; a
difference turns the cache off for good, with a warning (the full result is
used). ChatML (Qwen2.5, the starter), Llama 3 and Hermes templates render
each turn from itself and its neighbours.
"""

from __future__ import annotations

import json
import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from tether.chat._prompt import turn_token
from tether.chat._render import render_text

__all__ = ["HistoryCache"]

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    count: int  # the number of messages
    messages: str  # the messages as one JSON list (key order and number types count)
    tools: str  # the tools as JSON
    text: str  # the prompt text (with the generation prompt)
    ids: array  # its ids
    # (the generation prompt's text and ids, the first message's rendering), computed once
    fixed: tuple[str, list[int], str] | None = None


def _extends(dumped: str, entry: _Entry) -> bool:
    """Whether the JSON list ``dumped`` starts with the entry's messages, serialized alike.

    JSON is read left to right, so equal text up to the end of the old last message
    followed by ``, `` means the same old messages, key order and number types included.
    """
    head = entry.messages[:-1]  # without the closing "]"
    return dumped.startswith(head) and dumped.startswith(", ", len(head))


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _dumps(obj: Any) -> str | None:
    try:
        return json.dumps(obj)
    except (TypeError, ValueError):
        return None


class HistoryCache:
    """See the module docstring. ``render(key, messages, tools, full)`` is the only entry point;
    ``full(messages, tools) -> (text, ids)`` is the full path it falls back to (and checks
    against). ``max_entries`` conversations are kept, least recently used out first."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_entries: int = 1024,
        verify: int = 16,
        verify_every: int = 64,
    ):
        self.tokenizer = tokenizer
        self.turn = turn_token(tokenizer)
        self.enabled = self.turn is not None
        self.max_entries = max_entries
        self.hits = self.misses = self.checked = 0
        self._verify, self._every = verify, verify_every
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._gen: dict[Any, tuple[str, list[int]]] = {}
        self._lock = threading.Lock()

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def render(
        self,
        key: Hashable,
        messages: Sequence[Any],
        tools: Any,
        full: Callable[[Sequence[Any], Any], tuple[str, list[int]]],
    ) -> list[int]:
        """The prompt ids of ``messages`` and ``tools``, as ``full`` would compute them."""
        if not self.enabled:
            return full(messages, tools)[1]
        dumped = _dumps(list(messages))
        tools_json = _dumps(tools)
        if tools_json is None or dumped is None:
            return full(messages, tools)[1]
        with self._lock:
            entry = self._entries.get(key)
        found = None
        if entry is not None:
            try:
                found = self._extend(entry, messages, tools, dumped, tools_json)
            except Exception:  # a template that refuses the small context: the full path decides
                found = None
        if found is None:
            self.misses += 1
            text, ids = full(messages, tools)
        else:
            self.hits += 1
            text, ids = found
            if self._verify > 0 or self.hits % self._every == 0:
                self._verify -= 1
                self.checked += 1
                want = full(messages, tools)
                if want != (text, ids):
                    log.warning(
                        "conversation render cache disabled: the chat template does not render "
                        "new turns independently of the old ones (%s)",
                        getattr(self.tokenizer, "name_or_path", "") or "tokenizer",
                    )
                    self.enabled = False
                    with self._lock:
                        self._entries.clear()
                    return want[1]
        fixed = entry.fixed if found is not None and entry is not None else None
        with self._lock:
            self._entries[key] = _Entry(
                len(messages), dumped, tools_json, text, array("i", ids), fixed
            )
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return ids

    def _fixed(self, first: Any, tools: Any) -> tuple[str, list[int], str] | None:
        """The text the template appends for ``add_generation_prompt``, its ids, and the
        rendering of the first message alone."""
        with_gen = render_text(self.tokenizer, [first], tools)
        without = render_text(self.tokenizer, [first], tools, add_generation_prompt=False)
        if not with_gen.startswith(without):
            return None
        gen = with_gen[len(without) :]
        return gen, list(self.tokenizer.encode(gen, add_special_tokens=False)), without

    def _extend(
        self,
        entry: _Entry,
        messages: Sequence[Any],
        tools: Any,
        dumped: str,
        tools_json: str,
    ) -> tuple[str, list[int]] | None:
        old = entry.count
        if len(messages) <= old or tools_json != entry.tools or not _extends(dumped, entry):
            return None
        assert self.turn is not None
        mark = self.turn[0]
        if entry.fixed is None:
            entry.fixed = self._fixed(messages[0], tools)
        if entry.fixed is None:
            return None
        gen_text, gen_ids, first = entry.fixed
        if not gen_text.startswith(mark) or not entry.text.endswith(gen_text):
            return None
        if entry.ids[len(entry.ids) - len(gen_ids) :].tolist() != gen_ids:
            return None
        base_text = entry.text[: len(entry.text) - len(gen_text)]
        start = old - 1  # the last old turn; a run of tool messages is one turn (grouped)
        while start > 1 and _role(messages[start]) == "tool" == _role(messages[start - 1]):
            start -= 1
        ctx = [messages[0], *messages[start:old]] if old > 1 else [messages[0]]
        head = first
        if old > 1:
            head = render_text(self.tokenizer, ctx, tools, add_generation_prompt=False)
            last_turn = head[len(first) :]
            if not head.startswith(first) or not last_turn.startswith(mark):
                return None
            if not base_text.endswith(last_turn):
                return None
        elif head != base_text:
            return None
        whole = render_text(self.tokenizer, [*ctx, *messages[old:]], tools)
        if not whole.startswith(head):
            return None
        tail = whole[len(head) :]
        if not tail.startswith(mark):
            return None
        ids = entry.ids[: len(entry.ids) - len(gen_ids)].tolist()
        ids += self.tokenizer.encode(tail, add_special_tokens=False)
        return base_text + tail, ids
