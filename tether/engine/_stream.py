"""Streamed generation: one :class:`TokenDelta` per sampled token, then the result.

``engine.generate_stream(prompt_ids, params)`` is an async iterator that
yields a :class:`TokenDelta` for every token as it is sampled (the ``n``
completions interleaved, each delta naming its completion) and, last, the
:class:`~tether.engine.GenerateResult` that ``generate`` would have returned
for the same call (the same ids, logprobs and policy version). Closing the
iterator early (``aclose()``, or cancelling the task iterating it) cancels
the request: the engine stops generating it.

:func:`stream_via_generate` builds such an iterator from ``generate`` alone
(all tokens at once, when the call is done): the protocol's default
``generate_stream``, which the fake engines keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from tether.engine._protocol import GenerateResult, SamplingParams

__all__ = ["TokenDelta", "TokenFeed", "stream_via_generate"]


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


class TokenFeed:
    """A streamed request's tokens, from the worker thread to its event loop's ``queue``.

    Each wake-up of the loop is a GIL hand-off between the worker and the loop
    threads, which on a busy machine stalls the worker for a scheduler slice. So
    :meth:`put` (worker) wakes the loop at most once per ``interval_s``: the first
    token goes at once, later ones in bursts (at most ``interval_s`` plus one
    decode step late); :meth:`flush` (loop, when the request is done) delivers the
    rest. Wake-ups are FIFO with the result's settling on the loop.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float = 0.05):
        self.loop = loop
        self.interval_s = interval_s
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending: list[Any] = []
        self._scheduled = False
        self._sent = float("-inf")
        self._lock = threading.Lock()

    def put(self, item: Any) -> None:
        now = time.monotonic()
        with self._lock:
            self._pending.append(item)
            if self._scheduled or now - self._sent < self.interval_s:
                return
            self._scheduled, self._sent = True, now
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            self.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        with self._lock:
            items, self._pending, self._scheduled = self._pending, [], False
        for item in items:
            self.queue.put_nowait(item)
