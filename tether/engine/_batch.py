"""A left-padded batch of sequences sharing one KV cache.

:class:`KVBatch` is the tensor side of the transformers engine's scheduler:
prefill a group of prompts, decode one token per row, merge a newly
prefilled batch into the running one (continuous batching), drop finished
rows. Rows are left-padded: row ``b`` owns the last ``mask[b].sum()`` cache
positions, and its position ids count only its own tokens, so a padded row
computes the same logits as the row alone (up to float rounding). With
``adapters`` (a peft model serving several LoRA adapters) each row runs with
its own adapter in the same forward (peft's ``adapter_names``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from tether._hf import cache_layers, takes_kwarg
from tether.engine._prefix import Prefix

__all__ = ["KVBatch"]


def _prefix_cache(
    prefixes: list[Prefix | None], rows: int, device: Any
) -> tuple[DynamicCache, torch.Tensor]:
    """The rows' prefixes as one cache, each left-padded to the longest, and its mask [B, P]."""
    given = [p for p in prefixes if p is not None]
    width = max((len(p.tokens) for p in given), default=0)
    head = torch.zeros((rows, width), dtype=torch.long, device=device)
    if not width:
        return DynamicCache(), head
    for b, p in enumerate(prefixes):
        if p is not None:
            head[b, width - len(p.tokens) :] = 1
    if all(p is not None and p.tokens == given[0].tokens for p in prefixes):  # broadcast
        layers = [
            (k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in given[0].layers
        ]
        return DynamicCache(layers), head
    layers = []
    for i, (k0, _) in enumerate(given[0].layers):
        empty = k0.new_zeros((1, k0.shape[1], width, k0.shape[3]))
        keys = [_left_pad(p.layers[i][0], width, 2) if p else empty for p in prefixes]
        values = [_left_pad(p.layers[i][1], width, 2) if p else empty for p in prefixes]
        layers.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(layers), head


def _left_pad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [missing, 0]
    return F.pad(t, pad)


def _adapter_kwargs(adapters: list[str] | None) -> dict[str, Any]:
    return {} if adapters is None else {"adapter_names": adapters}


class KVBatch:
    """``mask``: [B, L] (1 = real token); ``positions``: [B], the next position id per row."""

    def __init__(self, cache: DynamicCache, mask: torch.Tensor, positions: torch.Tensor):
        self.cache = cache
        self.mask = mask
        self.positions = positions

    @property
    def size(self) -> int:
        return self.mask.shape[0]

    @property
    def length(self) -> int:
        return self.mask.shape[1]

    @classmethod
    def prefill(
        cls,
        model: Any,
        kwarg: str,
        prompts: list[list[int]],
        pad_id: int = 0,
        prefixes: Sequence[Prefix | None] | None = None,
        adapters: list[str] | None = None,
    ) -> tuple[KVBatch, torch.Tensor]:
        """Run the prompts as one batch; return it and the next-token logits [B, V].

        With ``prefixes`` (per row a proper prefix of its prompt, or None) only the
        suffixes are computed; rows are laid out ``[padding | prefix | padding | suffix]``,
        each prefix left-padded to the longest one. ``adapters``: per row the peft adapter
        name (``"__base__"``: none).
        """
        device, rows = model.device, len(prompts)
        rows_prefixes: list[Prefix | None] = (
            list(prefixes) if prefixes is not None else [None] * rows
        )
        starts = [len(p.tokens) if p else 0 for p in rows_prefixes]
        suffixes = [p[start:] for p, start in zip(prompts, starts, strict=True)]
        length = max(len(p) for p in suffixes)
        ids = torch.full((rows, length), pad_id, dtype=torch.long)
        mask = torch.zeros((rows, length), dtype=torch.long)
        for b, suffix in enumerate(suffixes):
            ids[b, length - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[b, length - len(suffix) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        offsets = torch.tensor(starts, dtype=torch.long, device=device)[:, None]
        positions = offsets + (mask.cumsum(-1) - 1).clamp(min=0)
        cache, head = _prefix_cache(rows_prefixes, rows, device)
        mask = torch.cat([head.to(mask.dtype), mask], 1)
        keep = {"logits_to_keep": 1} if takes_kwarg(model, "logits_to_keep") else {}
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **keep,
            **_adapter_kwargs(adapters),
            **{kwarg: cache},
        )
        return cls(cache, mask, mask.sum(-1)), out.logits[:, -1, :]

    def row_layers(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``b``'s KV without padding, per layer ``[1, H, n, D]``, in memory of its own."""
        real = self.mask[b].nonzero().flatten()
        return [
            (k[b : b + 1].index_select(2, real), v[b : b + 1].index_select(2, real))
            for k, v in self.layers()
        ]

    def layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cache's per-layer ``(keys, values)``, each [B, H, L, D]."""
        return cache_layers(self.cache)

    def decode(
        self, model: Any, kwarg: str, tokens: torch.Tensor, adapters: list[str] | None = None
    ) -> torch.Tensor:
        """Feed one token per row ([B]); return the next-token logits [B, V]. ``adapters``:
        per row its peft adapter name, as in :meth:`prefill`."""
        ones = torch.ones((self.size, 1), dtype=self.mask.dtype, device=self.mask.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        out = model(
            input_ids=tokens.view(-1, 1),
            attention_mask=self.mask,
            position_ids=self.positions.view(-1, 1),
            use_cache=True,
            **_adapter_kwargs(adapters),
            **{kwarg: self.cache},
        )
        self.positions = self.positions + 1
        return out.logits[:, -1, :]

    def repeat(self, counts: list[int]) -> None:
        """Row ``b`` becomes ``counts[b]`` identical rows (``n`` samples share one prefill)."""
        if all(c == 1 for c in counts):
            return
        index = torch.repeat_interleave(
            torch.arange(len(counts), device=self.mask.device),
            torch.tensor(counts, device=self.mask.device),
        )
        self.select(index)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (in that order), then drop columns that are padding in every row."""
        mask = self.mask.index_select(0, index)
        first = int((mask.cumsum(-1) == 0).sum(-1).min()) if mask.shape[0] else 0
        layers = [
            (k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
            for k, v in cache_layers(self.cache)
        ]
        self.cache = DynamicCache(layers)
        self.mask = mask[:, first:]
        self.positions = self.positions.index_select(0, index)

    def merge(self, other: KVBatch) -> None:
        """Append ``other``'s rows, left-padding whichever cache is shorter."""
        length = max(self.length, other.length)
        layers = [
            (
                torch.cat([_left_pad(k1, length, 2), _left_pad(k2, length, 2)]),
                torch.cat([_left_pad(v1, length, 2), _left_pad(v2, length, 2)]),
            )
            for (k1, v1), (k2, v2) in zip(
                cache_layers(self.cache), cache_layers(other.cache), strict=True
            )
        ]
        self.cache = DynamicCache(layers)
        self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(other.mask, length, 1)])
        self.positions = torch.cat([self.positions, other.positions])
