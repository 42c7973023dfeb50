"""Per-row sampling for a batch, and stop-string checks.

:func:`sample_rows` is pure tensor math: each row has its own temperature,
top-p and random draw, so a seeded request samples the same tokens whatever
it is batched with. The logprob returned for a token is
``log_softmax(logits / T)[token]`` in fp32 (T = 1 for greedy rows), taken
before top-p truncation — exactly what the trainer recomputes. Rows under a
grammar constraint are drawn from ``sample_logits`` (the logits with the
disallowed tokens at -inf); their logprob is still the unmasked one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["SampleOut", "StopChecker", "sample_rows"]


@dataclass
class SampleOut:
    tokens: list[int]
    logprobs: list[float]
    top: list[dict[int, float]] | None  # per row, only when top_k > 0


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor,
    top_k: int = 0,
    sample_logits: torch.Tensor | None = None,
) -> SampleOut:
    """Sample one token per row.

    Shapes: ``logits`` [B, V] (any float dtype); ``temperature``, ``top_p``,
    ``uniforms`` [B] fp32 on the logits' device. ``temperature[b] == 0``
    means greedy (argmax). ``uniforms[b]`` in [0, 1) is row ``b``'s random
    draw, inverted through the (top-p truncated) CDF. ``sample_logits`` [B, V],
    when given, is what the token is drawn from (greedy: its argmax; top-p
    applies to its renormalized distribution); the returned logprobs and top
    logprobs are always those of ``logits``.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / scale.unsqueeze(-1), dim=-1)  # [B, V]
    if sample_logits is None:
        drawn_from = logits
        probs = logp.exp()
    else:
        drawn_from = sample_logits.float()
        probs = torch.softmax(drawn_from / scale.unsqueeze(-1), dim=-1)
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p.unsqueeze(-1)
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.cumsum(-1)
    draw = (uniforms * cdf[:, -1]).unsqueeze(-1)
    sampled = torch.searchsorted(cdf, draw, right=True).squeeze(-1)
    sampled = sampled.clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, drawn_from.argmax(-1), sampled)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    top = None
    if top_k > 0:
        values, ids = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
        top = [
            dict(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)
        ]
    return SampleOut(tokens.tolist(), chosen.tolist(), top)


class StopChecker:
    """Detects stop strings in a completion decoded incrementally.

    Only the tail of the completion is decoded each step: enough tokens to
    hold the longest stop string (each token yields at least one character)
    plus a margin for multi-byte characters split over tokens.
    """

    def __init__(self, stop: Sequence[str], tokenizer: Any):
        self.stop = tuple(s for s in stop if s)
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in self.stop), default=0) + 4

    def __bool__(self) -> bool:
        return bool(self.stop)

    def hit(self, token_ids: list[int]) -> bool:
        """Whether the completion ``token_ids`` now contains a stop string."""
        if not self.stop:
            return False
        text = self.tokenizer.decode(token_ids[-self.window :], skip_special_tokens=False)
        return any(s in text for s in self.stop)
