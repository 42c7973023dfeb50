"""Tokens as the rollout page shows them: text pieces, logprob colour buckets, the top
alternatives the agent asked for, and the training samples the trainer would build.

Pure functions over stored calls; the text of a token comes from the run's
tokenizer when one is at hand, else from the ``logprobs`` the gateway returned
(when the agent asked for them), else it is shown as ``#id``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tether.records import Call, CallStatus

__all__ = [
    "Piece",
    "SampleView",
    "bucket",
    "call_pieces",
    "sample_views",
    "top_alternatives",
]

#: Most tokens shown per call or sample; the rest is summarized ("… N more tokens").
MAX_TOKENS = 4000

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Piece:
    """One token (``trained`` or a completion token) or a run of masked tokens."""

    text: str
    token_id: int | None = None  # None: a run of masked (prompt / tool) tokens
    logprob: float | None = None
    bucket: int | None = None  # 0..9: the probability exp(logprob) in tenths
    top: tuple[tuple[str, float], ...] = ()

    @property
    def masked(self) -> bool:
        return self.token_id is None


@dataclass(frozen=True)
class SampleView:
    """One training sample: ``num_calls`` merged calls, its pieces, its advantage."""

    index: int
    num_calls: int
    tokens: int
    trained: int
    advantage: float
    pieces: tuple[Piece, ...]
    cut: int  # tokens not shown


def bucket(logprob: float) -> int:
    """The colour bucket of a token: ``floor(10 · p)`` of its probability, 0..9."""
    if not math.isfinite(logprob):
        return 0
    return min(9, max(0, int(math.exp(min(logprob, 0.0)) * 10)))


def top_alternatives(response: dict[str, Any]) -> list[tuple[str, list[tuple[str, float]]]]:
    """``(token text, [(alternative, logprob), ...])`` per completion token of the first
    choice, from the ``logprobs`` the gateway returned (chat or completions shape);
    empty when the agent did not ask for logprobs."""
    try:
        choice = (response.get("choices") or [])[0]
        lp = choice.get("logprobs") or {}
    except (AttributeError, IndexError, TypeError):
        return []
    if not isinstance(lp, dict):
        return []
    out: list[tuple[str, list[tuple[str, float]]]] = []
    if isinstance(lp.get("content"), list):  # chat.completions
        for entry in lp["content"]:
            if not isinstance(entry, dict):
                return []
            alts = [
                (str(a.get("token", "")), float(a.get("logprob", 0.0)))
                for a in entry.get("top_logprobs") or []
                if isinstance(a, dict)
            ]
            out.append((str(entry.get("token", "")), alts))
    elif isinstance(lp.get("tokens"), list):  # completions
        tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
        for token, top in zip(lp["tokens"], tops, strict=False):
            alts = [(str(k), float(v)) for k, v in (top or {}).items()]
            out.append((str(token), sorted(alts, key=lambda kv: -kv[1])))
    return out


def _texts(ids: Sequence[int], decode: Decode | None, known: list[str] | None) -> list[str]:
    if decode is not None:
        return [decode([i]) for i in ids]
    if known is not None and len(known) == len(ids):
        return known
    return [f"#{i}" for i in ids]


def call_pieces(call: Call, decode: Decode | None) -> tuple[list[Piece], int]:
    """The completion tokens of ``call`` as pieces (at most :data:`MAX_TOKENS`), and how
    many were left out."""
    ids = call.completion_ids[:MAX_TOKENS]
    alts = top_alternatives(call.response)
    texts = _texts(ids, decode, [t for t, _ in alts] if alts else None)
    pieces = []
    for i, (tid, lp, text) in enumerate(zip(ids, call.logprobs, texts, strict=False)):
        top = tuple(alts[i][1]) if i < len(alts) and len(alts) == len(call.completion_ids) else ()
        pieces.append(Piece(text, tid, float(lp), bucket(lp), top))
    return pieces, len(call.completion_ids) - len(ids)


def sample_views(
    calls: Sequence[Call], advantage: float | Mapping[int, float], decode: Decode | None
) -> tuple[list[SampleView], Any]:
    """The samples the trainer builds from one rollout's calls (its own code:
    :func:`tether.trainer.build_samples`) and its stats: masked runs as one piece,
    trained tokens one by one with their recorded logprob."""
    from tether.trainer import build_samples

    usable = [c for c in calls if c.status is CallStatus.OK and c.prompt_ids]
    skipped = len(calls) - len(usable)
    samples, stats = build_samples([usable], [advantage])
    views = []
    for n, s in enumerate(samples):
        pieces: list[Piece] = []
        shown = min(len(s.input_ids), MAX_TOKENS)
        start = 0
        while start < shown:
            end = start
            if not s.loss_mask[start]:
                while end < shown and not s.loss_mask[end]:
                    end += 1
                ids = s.input_ids[start:end]
                text = decode(ids) if decode else f"[{len(ids)} masked tokens]"
                pieces.append(Piece(text))
            else:
                tid, lp = s.input_ids[start], s.old_logprobs[start]
                text = _texts([tid], decode, None)[0]
                pieces.append(Piece(text, tid, float(lp), bucket(lp)))
                end = start + 1
            start = end
        views.append(
            SampleView(
                n,
                s.num_calls,
                len(s.input_ids),
                sum(s.loss_mask),
                s.advantage,
                tuple(pieces),
                len(s.input_ids) - shown,
            )
        )
    return views, (stats, skipped)
