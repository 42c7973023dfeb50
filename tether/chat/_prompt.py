"""Prompt text → token ids, reusing the ids of a prefix the gateway has encoded before.

An agent's prompts grow call by call and share a system prompt, so most of
each prompt's text was tokenized before. :class:`PromptEncoder` cuts the
text at the start of a turn token (``<|im_start|>`` and the like) and encodes
only what follows a cached prefix.

Why the ids stay exact: a Hugging Face fast tokenizer first splits the text
on its added tokens, then normalizes, pre-tokenizes and runs the model on
each piece between them separately. If the cut is at the start of an added
token ``T`` that no added-token match can cross (``T`` is not ``lstrip``,
``single_word`` or ``normalized``, and no added token has ``T``'s first
character after its own start), every piece of ``text`` is a piece of
``text[:cut]`` or of ``text[cut:]``, so ``encode(text) == encode(text[:cut]) +
encode(text[cut:])``. Tokenizers for which this cannot be shown (slow ones,
``split_special_tokens``, no such token) are never cut. As a guard, the
first ``verify`` cut encodings are also encoded whole and compared; a
difference turns the cache off for good (with a warning).
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from typing import Any

__all__ = ["PromptEncoder", "turn_token"]

log = logging.getLogger(__name__)

# Tokens that open a turn in common chat templates (ChatML, Llama 3, Gemma, Harmony).
TURN_TOKENS = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "<|start|>")
_TAIL = 64  # characters of a prefix's end that, with its length, key the cache


def turn_token(tokenizer: Any) -> tuple[str, int] | None:
    """``(text, id)`` of a turn token at which ``tokenizer`` encodes exactly piecewise, or None."""
    if not getattr(tokenizer, "is_fast", False) or getattr(
        tokenizer, "split_special_tokens", False
    ):
        return None
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(added, dict):
        return None
    by_text = {str(tok): (tid, tok) for tid, tok in added.items()}
    for text in TURN_TOKENS:
        if text not in by_text:
            continue
        tid, tok = by_text[text]
        head = text[0]
        if head.isalnum() or head.isspace():
            continue
        if any(getattr(tok, flag, True) for flag in ("lstrip", "single_word", "normalized")):
            continue
        if any(
            head in str(other)[1:] or (str(other) != text and str(other).startswith(text))
            for other in added.values()
        ):
            continue
        return text, int(tid)
    return None


class PromptEncoder:
    """``tokenizer.encode(text, add_special_tokens=False)``, with a prefix cache.

    Keeps, per encoded text, the ids of two prefixes that end where a turn
    starts: the first turn (a shared system prompt) and everything before the
    last turn (the conversation so far, which the agent's next call extends).
    ``max_entries`` and ``max_chars`` (the prefixes' total length) bound the
    cache, least recently used out first; ids are kept as 4-byte arrays.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_entries: int = 1024,
        max_chars: int = 8_000_000,
        verify: int = 16,
    ):
        self.tokenizer = tokenizer
        self.turn = turn_token(tokenizer)
        self.max_entries, self.max_chars = max_entries, max_chars
        self.hits = self.misses = self.tokens_reused = 0
        self._verify = verify
        self._chars = 0
        self._entries: OrderedDict[tuple[int, str], tuple[str, array]] = OrderedDict()
        self._lock = threading.Lock()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``, exactly as the tokenizer would encode it whole."""
        if self.turn is None:
            return self._encode(text)
        starts = _starts(text, self.turn[0])
        if len(starts) < 2:
            return self._encode(text)
        found = self._lookup(text, starts)
        if found is None:
            self.misses += 1
            ids = self._encode(text)
        else:
            cut, head = found
            ids = head.tolist() + self._encode(text[cut:])
            self.hits += 1
            self.tokens_reused += len(head)
            if self._verify > 0:
                self._verify -= 1
                whole = self._encode(text)
                if whole != ids:
                    log.warning(
                        "prompt prefix cache disabled: piecewise encoding differs for this "
                        "tokenizer (%s)",
                        type(self.tokenizer).__name__,
                    )
                    self.turn = None
                    self._entries.clear()
                    return whole
        self._remember(text, starts, ids)
        return ids

    def _lookup(self, text: str, starts: list[int]) -> tuple[int, array] | None:
        """The longest cached prefix of ``text`` ending at one of ``starts`` (the last 16 tried)."""
        candidates = starts[:0:-1][:16]
        if starts[1] not in candidates:
            candidates.append(starts[1])
        with self._lock:
            for cut in candidates:
                key = (cut, text[max(0, cut - _TAIL) : cut])
                entry = self._entries.get(key)
                if entry is not None and text.startswith(entry[0]):
                    self._entries.move_to_end(key)
                    return cut, entry[1]
        return None

    def _remember(self, text: str, starts: list[int], ids: list[int]) -> None:
        """Cache the ids of ``text[:starts[1]]`` and ``text[:starts[-1]]``."""
        tid = self.turn[1] if self.turn else None
        if tid is None or ids.count(tid) != len(starts):
            return  # the turn token did not map one-to-one: store nothing
        second = ids.index(tid, ids.index(tid) + 1)
        last = len(ids) - 1 - ids[::-1].index(tid)
        with self._lock:
            for cut, n in {(starts[1], second), (starts[-1], last)}:
                if cut > self.max_chars // 4:
                    continue
                key = (cut, text[max(0, cut - _TAIL) : cut])
                old = self._entries.get(key)
                if old is not None and text.startswith(old[0]):
                    self._entries.move_to_end(key)
                    continue
                self._entries[key] = (text[:cut], array("i", ids[:n]))  # may replace another
                self._chars += cut - (len(old[0]) if old is not None else 0)
                self._entries.move_to_end(key)
            while self._entries and (
                len(self._entries) > self.max_entries or self._chars > self.max_chars
            ):
                _, (prefix, _) = self._entries.popitem(last=False)
                self._chars -= len(prefix)


def _starts(text: str, token: str) -> list[int]:
    """Every index at which ``token`` starts in ``text``."""
    out, at = [], text.find(token)
    while at >= 0:
        out.append(at)
        at = text.find(token, at + len(token))
    return out
