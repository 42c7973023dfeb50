"""Prefix caching: keep the KV of what was computed, reuse it for what repeats.

Agent traffic repeats itself: every rollout of a task starts with the same
system + tools prompt, the ``n`` rollouts of a group send the same first
prompt, and each call of a rollout extends the previous call's prompt and
completion. After a prefill the scheduler stores each prompt's KV here, and
when a row finishes, the KV of its prompt and completion; nothing is ever
computed only to be cached. :meth:`PrefixCache.lookup` returns the longest
run of tokens that a new prompt starts with and some entry holds — a whole
entry or the front of one, since with causal attention the KV of a
sequence's first ``k`` tokens is the first ``k`` positions of its KV — and
the engine prefills only the rest (see :meth:`KVBatch.prefill`).

Entries are found through chained hashes of their ``block``-token blocks
(as vLLM's automatic prefix caching does), so a lookup costs one dict probe
per block plus one comparison of tokens; a hash collision is caught by that
comparison. The store is an LRU bounded by tokens; :meth:`clear` drops it
when the weights change. With per-request LoRA adapters (roles) a KV belongs
to the adapter that computed it: every entry and lookup names its adapter
(None: the default weights), which seeds the hash chain.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Prefix", "PrefixCache", "common_prefix_len"]

Layers = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(eq=False)
class Prefix:
    """The KV of ``tokens``: per layer ``(keys, values)``, each ``[1, H, len(tokens), D]``."""

    tokens: tuple[int, ...]
    layers: Layers
    adapter: str | None = None  # the LoRA adapter whose weights computed it


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix (binary search on slice equality, done in C)."""
    a, b = tuple(a), tuple(b)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """An LRU of computed KVs holding at most ``max_tokens`` tokens in all.

    A match shorter than ``min_tokens`` is not returned (it saves less than it costs).
    """

    def __init__(self, *, max_tokens: int = 32_768, min_tokens: int = 16, block: int = 16):
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.block = block
        self.entries: OrderedDict[tuple[str | None, tuple[int, ...]], Prefix] = OrderedDict()
        self._index: dict[int, Prefix] = {}  # chained block hash → an entry holding those blocks
        self.size = 0  # tokens held
        self.hits = 0
        self.tokens_saved = 0

    def _hashes(self, tokens: Sequence[int], adapter: str | None = None) -> list[int]:
        """The chained hash of each complete block of ``tokens`` (under ``adapter``)."""
        out, h, b = [], 0 if adapter is None else hash(adapter), self.block
        for i in range(0, len(tokens) - b + 1, b):
            h = hash((h, tuple(tokens[i : i + b])))
            out.append(h)
        return out

    def lookup(self, prompt: Sequence[int], adapter: str | None = None) -> Prefix | None:
        """The longest cached proper prefix of ``prompt`` computed by ``adapter`` (at least
        one token is left to prefill), or None when it is shorter than ``min_tokens``."""
        limit = len(prompt) - 1
        hashes = self._hashes(prompt[:limit], adapter)
        entry, blocks = None, len(hashes)
        while blocks and entry is None:
            entry = self._index.get(hashes[blocks - 1])
            blocks -= entry is None
        if entry is None:
            return None
        head = blocks * self.block
        if entry.adapter != adapter or entry.tokens[:head] != tuple(prompt[:head]):
            return None  # a hash collision
        n = head + common_prefix_len(entry.tokens[head:limit], prompt[head:limit])
        if n < self.min_tokens:
            return None
        self.entries.move_to_end((adapter, entry.tokens))
        for h in hashes[:blocks]:  # the blocks now point at the entry used last
            self._index[h] = entry
        self.hits += 1
        self.tokens_saved += n
        layers = [(k[:, :, :n], v[:, :, :n]) for k, v in entry.layers]
        return Prefix(tuple(prompt[:n]), layers, adapter)

    def store(self, tokens: Sequence[int], layers: Layers, adapter: str | None = None) -> None:
        """Keep ``layers`` (their own memory, not views of a batch) as the KV of ``tokens``
        computed by ``adapter``."""
        tokens = tuple(tokens)
        key = (adapter, tokens)
        if not self.min_tokens <= len(tokens) <= self.max_tokens:
            return
        if key in self.entries:
            self.entries.move_to_end(key)
            return
        entry = Prefix(tokens, layers, adapter)
        self.entries[key] = entry
        self.size += len(tokens)
        for h in self._hashes(tokens, adapter):
            self._index[h] = entry  # the newest holder; older ones are evicted first
        while self.size > self.max_tokens:
            _, old = self.entries.popitem(last=False)
            self.size -= len(old.tokens)
            for h in self._hashes(old.tokens, old.adapter):
                if self._index.get(h) is old:
                    del self._index[h]

    def clear(self) -> None:
        """Forget everything (the weights changed, so every stored KV is stale)."""
        self.entries.clear()
        self._index.clear()
        self.size = 0
