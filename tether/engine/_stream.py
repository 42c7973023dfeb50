"""Streamed generation: one :class:`TokenDelta` per sampled token, then the result.

``engine.generate_stream(prompt_ids, params)`` is an async iterator that
yields a :class:`TokenDelta` for every token as it is sampled (the ``n``
completions interleaved, each delta naming its completion) and, last, the
:class:`~tether.engine.GenerateResult` that ``generate`` would have returned
for the same call (the same ids, logprobs and policy version). Closing the
iterator early (``aclose()``, or cancelling the task iterating it) cancels
the request: the engine stops generating it.

:func:`stream_via_generate` builds such an iterator from ``generate`` alone
(all tokens at once, when the call is done); the fake engines use it, and
the gateway falls back to it for an engine without ``generate_stream``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from tether.engine._protocol import GenerateResult, SamplingParams

__all__ = ["TokenDelta", "engine_stream", "stream_via_generate"]


@dataclass(frozen=True)
class TokenDelta:
    """One sampled token of completion ``index``.

    ``finish_reason`` is set on the completion's last token (``"stop"`` or
    ``"length"``), ``None`` before. ``top_logprobs`` maps token id → logprob for
    the k most likely tokens when ``SamplingParams.top_logprobs > 0``.
    """

    index: int
    token_id: int
    logprob: float
    top_logprobs: dict[int, float] | None = None
    finish_reason: str | None = None


def deltas_of(result: GenerateResult) -> list[TokenDelta]:
    """The token deltas of a finished result, completion by completion."""
    out = []
    for i, c in enumerate(result.completions):
        last = len(c.token_ids) - 1
        for k, (tok, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
            top = c.top_logprobs[k] if c.top_logprobs else None
            out.append(TokenDelta(i, tok, lp, top, c.finish_reason if k == last else None))
    return out


async def stream_via_generate(
    engine: Any, prompt_ids: list[int], params: SamplingParams
) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
    """``engine.generate``, then its tokens as deltas and the result (no early tokens)."""
    result = await engine.generate(prompt_ids, params)
    for delta in deltas_of(result):
        yield delta
    yield result


def engine_stream(
    engine: Any, prompt_ids: list[int], params: SamplingParams
) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
    """``engine.generate_stream(...)``, or :func:`stream_via_generate` for an engine without it."""
    method = getattr(engine, "generate_stream", None)
    if method is None:
        return stream_via_generate(engine, prompt_ids, params)
    return method(prompt_ids, params)
