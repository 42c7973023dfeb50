"""Prefix caching: compute a shared prompt prefix once, reuse its KV.

Agent traffic repeats itself: every rollout of a task starts with the same
system + tools prompt, and each call of a rollout extends the previous
call's prompt. :class:`PrefixCache` keeps the KV of such prefixes (per
layer ``[1, H, P, D]``, positions ``0..P-1``) in an LRU bounded by tokens.
For a new prompt it returns the longest stored entry that is a proper
prefix of it; when the prompt shares a longer prefix with a recently seen
prompt, it first extends the best entry to that prefix (prefilling only the
new tokens) and stores the result. The engine then prefills only the
prompt's suffix on top of the entry (see :meth:`KVBatch.prefill`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Prefix", "PrefixCache", "common_prefix_len"]

Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class Prefix:
    """The KV of ``tokens`` (one row, no padding)."""

    tokens: tuple[int, ...]
    layers: Layers


def common_prefix_len(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    """Length of the longest common prefix (binary search on slice equality, done in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if list(a[:mid]) == list(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """An LRU of prefix KVs holding at most ``max_tokens`` tokens in all.

    ``compute(tokens, base)`` builds the KV of ``tokens`` given ``base``, the
    Prefix it extends (or None); the scheduler supplies it. Prefixes shorter
    than ``min_tokens`` are not worth a forward pass of their own.
    """

    def __init__(
        self,
        compute: Callable[[list[int], Prefix | None], Layers],
        *,
        max_tokens: int = 32_768,
        min_tokens: int = 16,
        history: int = 64,
    ):
        self.compute = compute
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self.recent: deque[list[int]] = deque(maxlen=history)
        self.hits = 0
        self.tokens_saved = 0

    @property
    def size(self) -> int:
        return sum(len(key) for key in self.entries)

    def lookup(self, prompt: list[int]) -> Prefix | None:
        """The prefix to prefill ``prompt`` on (proper prefix, so the suffix is not empty)."""
        best = self._stored(prompt)
        shared = max((common_prefix_len(prompt, p) for p in self.recent), default=0)
        shared = min(shared, len(prompt) - 1)
        self.recent.append(prompt)
        have = len(best.tokens) if best else 0
        if shared >= self.min_tokens and shared - have >= self.min_tokens:
            tokens = tuple(prompt[:shared])
            best = Prefix(tokens, self.compute(list(tokens), best))
            self._store(best)
        if best is not None:
            self.entries.move_to_end(best.tokens)
            self.hits += 1
            self.tokens_saved += len(best.tokens)
        return best

    def clear(self) -> None:
        """Forget everything (the weights changed, so every stored KV is stale)."""
        self.entries.clear()
        self.recent.clear()

    def _stored(self, prompt: list[int]) -> Prefix | None:
        best = None
        for key, entry in self.entries.items():
            longer = best is None or len(key) > len(best.tokens)
            if longer and len(key) < len(prompt) and tuple(prompt[: len(key)]) == key:
                best = entry
        return best

    def _store(self, entry: Prefix) -> None:
        if len(entry.tokens) > self.max_tokens:
            return
        self.entries[entry.tokens] = entry
        while self.size > self.max_tokens:
            self.entries.popitem(last=False)
