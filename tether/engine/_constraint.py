"""Grammar constraints on generation (structured outputs, forced tool calls).

A :class:`Constraint` is plain data — an xgrammar *structural tag* as canonical
JSON — so it is hashable, can sit in :class:`SamplingParams`, and a remote
engine (vLLM takes the same structural tags) can be handed it unchanged. The
embedded engine compiles it once per tokenizer with :class:`GrammarBook`
(an LRU of compiled grammars) and gives each constrained row a matcher.

xgrammar is an optional extra (``pip install 'tether[structured]'``); it is
imported only when a constraint is built or compiled.
:func:`json_schema_format` turns a JSON schema into the structural-tag format
the gateway composes (compact JSON with ``json.dumps``' separators, so the
text the model writes is what a chat template renders back).
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tether.engine._protocol import EngineError
from tether.errors import UserError

__all__ = [
    "Constraint",
    "ConstraintError",
    "GrammarBook",
    "MissingStructuredExtra",
    "UnsupportedConstraint",
    "json_schema_format",
    "masked_logits",
]

EXTRA_HINT = "pip install 'tether[structured]'"


class ConstraintError(UserError):
    """A constraint that cannot be compiled (a schema xgrammar refuses)."""


class MissingStructuredExtra(UserError):
    """Constrained decoding was asked for and xgrammar is not installed."""


class UnsupportedConstraint(EngineError):
    """The engine cannot honour ``SamplingParams.constraint`` (it would ignore it)."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ModuleNotFoundError as exc:  # the optional extra
        raise MissingStructuredExtra(
            f"structured outputs and forced tool calls need xgrammar: {EXTRA_HINT}"
        ) from exc
    return xgrammar


@dataclass(frozen=True)
class Constraint:
    """An xgrammar structural tag (``{"type": "structural_tag", "format": ...}``) as
    canonical JSON; ``label`` says what it enforces (for messages and the store)."""

    structural_tag: str
    label: str = "grammar"

    @classmethod
    def of(cls, fmt: dict[str, Any], label: str = "grammar") -> Constraint:
        """The constraint whose structural tag has format ``fmt``."""
        tag = {"type": "structural_tag", "format": fmt}
        return cls(json.dumps(tag, sort_keys=True, separators=(",", ":")), label)

    def check(self) -> None:
        """Build the grammar without a tokenizer (remembered for the last 256 checked);
        :class:`ConstraintError` when it fails."""
        _check_tag(self.structural_tag)


@functools.lru_cache(maxsize=256)
def _check_tag(tag: str) -> None:
    xgr = _xgrammar()
    try:
        xgr.Grammar.from_structural_tag(tag)
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError with its reason
        raise ConstraintError(_reason(exc)) from exc


def _reason(exc: BaseException) -> str:
    """xgrammar's message without its ``[time] file.cc:line:`` prefix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


def json_schema_format(schema: dict[str, Any] | bool, *, strict: bool = True) -> dict[str, Any]:
    """The structural-tag format of one JSON value valid against ``schema``.

    One line, separators ``", "`` and ``": "`` (``json.dumps``' defaults); with
    ``strict`` no properties or items beyond the schema's. Raises
    :class:`ConstraintError` for a schema xgrammar cannot convert.
    """
    xgr = _xgrammar()
    try:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, strict_mode=strict
        )
    except Exception as exc:
        raise ConstraintError(_reason(exc)) from exc
    # xgrammar 0.2.9's string characters are too loose in two ways: a length-bounded
    # string may hold raw control characters, which JSON forbids (json.loads and pydantic
    # refuse them), and any string may hold a UTF-16 surrogate (U+D800-U+DFFF) as three
    # bytes, which is not UTF-8: a byte-level model writes them, they decode to U+FFFD
    # each, and a maxLength string grows past its bound. Both classes become JSON's.
    text = str(grammar)
    for loose in _LOOSE_CHARS:
        text = text.replace(loose, _JSON_CHARS)
    return {"type": "grammar", "grammar": text}


_LOOSE_CHARS = (r"[^\"\\\r\n]", r"[^\0-\x1f\"\\\r\n]")  # length-bounded, plain strings
_JSON_CHARS = r"[^\0-\x1f\"\\\uD800-\uDFFF]"


class GrammarBook:
    """Compiled grammars for one tokenizer, least recently used dropped beyond ``size``.

    ``stop_token_id`` is the one token that may (and must) follow a complete
    grammar: the end-of-turn token the chat template puts after an assistant turn.
    The tokenizer's other special tokens are never allowed: xgrammar reads them as
    their text (``<|endoftext|>`` would be 13 characters of a JSON string) while the
    engine stops at an end-of-sequence one, which cut a forced call short.
    Thread-safe; compilation runs outside the lock.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_id: int, *, size: int = 256):
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[stop_token_id]
        )
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.vocab_size = vocab_size
        special = {i for i in tokenizer.all_special_ids if 0 <= i < vocab_size}
        self.never = sorted(special - {stop_token_id})  # see the class docstring
        self.size = size
        self.compiled = 0  # compilations done (cache misses)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def cached(self, constraint: Constraint) -> bool:
        """Whether ``constraint`` is compiled already."""
        with self._lock:
            return constraint.structural_tag in self._cache

    def grammar(self, constraint: Constraint) -> Any:
        """The compiled grammar of ``constraint`` (cached)."""
        key = constraint.structural_tag
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            compiled = self._compiler.compile_structural_tag(key)
        except Exception as exc:
            raise ConstraintError(_reason(exc)) from exc
        with self._lock:
            self.compiled += 1
            self._cache[key] = compiled
            while len(self._cache) > self.size:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, constraint: Constraint) -> Any:
        """A fresh matcher (one per generated row) for ``constraint``."""
        return self.matcher_of(self.grammar(constraint))

    def matcher_of(self, compiled: Any) -> Any:
        """A fresh matcher of a grammar :meth:`grammar` compiled."""
        return self._xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int) -> Any:
        """An all-allowed int32 bitmask for ``rows`` rows ([rows, ceil(V / 32)])."""
        return self._xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply(self, logits: Any, bitmask: Any, indices: list[int]) -> None:
        """Set the disallowed logits of rows ``indices`` to -inf, in place (the special
        tokens in :attr:`never` included)."""
        self._xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=indices)
        if self.never:
            import torch

            rows = torch.tensor(indices, device=logits.device)[:, None]
            logits[rows, torch.tensor(self.never, device=logits.device)] = float("-inf")


def masked_logits(book: GrammarBook, logits: Any, matchers: list[Any]) -> Any:
    """``logits`` [B, V] with each constrained row's disallowed tokens at -inf (a copy);
    None when no row has a matcher (``matchers[b]`` is row ``b``'s, or None)."""
    rows = [b for b, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    bitmask = book.bitmask(len(matchers))
    for b in rows:
        matchers[b].fill_next_token_bitmask(bitmask, b)
    out = logits.float().clone()
    book.apply(out, bitmask, rows)
    return out
