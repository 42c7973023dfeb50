"""A model call streamed as the engine samples it: :func:`stream_call`
(``ModelCalls.stream``, ``Gateway.generate_stream``).

It yields, in order:

- :class:`TextDelta` pieces of a choice's content as soon as they are certain
  to begin the final content (:class:`tether.chat.LiveText`: split characters,
  possible stop strings and possible tool-call markup wait);
- when the engine is done and the calls are **committed to the store**: the
  rest of each choice's content and its tool calls (:class:`ToolCallDelta`:
  first ``id`` and ``name`` with empty arguments, then the arguments), then
  :class:`Done` with the same choices a non-streamed call returns.

So an agent that saw the end of a stream (``finish_reason`` / ``[DONE]``) saw a
recorded call, and the pieces it saw reassemble to the recorded message.
With ``tokens=True`` the engine's :class:`~tether.engine.TokenDelta` of each
sampled token comes too, before the text it completes (for per-token logprobs).

How a stream that does not finish is recorded (never as a training sample):
the engine failed or timed out → a ``failed`` call, and the error is raised;
the consumer stopped (client disconnect: the task is cancelled, or the
iterator closed) → a ``cancelled`` call per choice with the tokens sampled so
far, and the engine request is cancelled (it stops generating).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

from tether.chat import LiveText
from tether.engine import EngineFailed, GenerateResult, TokenDelta
from tether.records import CallStatus

from .deltas import Done, TextDelta, ToolCallDelta

if TYPE_CHECKING:
    from .calls import ModelCalls
    from .context import CallContext

__all__ = ["stream_call"]

log = logging.getLogger(__name__)


async def _next(stream: AsyncIterator[Any], deadline: float) -> Any:
    """The stream's next item, or ``asyncio.TimeoutError`` past ``deadline`` (monotonic)."""
    left = max(deadline - time.monotonic(), 0.0)
    try:
        if sys.version_info >= (3, 11):
            async with asyncio.timeout(left):
                return await anext(stream)
        return await asyncio.wait_for(anext(stream), left)  # pragma: no cover - 3.10
    except StopAsyncIteration:
        raise EngineFailed("the engine's stream ended without a result") from None


async def stream_call(
    calls: ModelCalls, ctx: CallContext, *, tokens: bool = False
) -> AsyncGenerator[Any, None]:
    """See the module docstring. Raises what :meth:`ModelCalls.generate` raises."""
    t0 = time.perf_counter()
    params = ctx.params
    parser = calls.parser if ctx.parse_tools else None
    live = [
        LiveText(
            calls.tokenizer,
            stop_token_ids=params.stop_token_ids,
            stop=params.stop,
            parser_name=parser.name if parser is not None else None,
        )
        for _ in range(params.n)
    ]
    sampled: list[tuple[list[int], list[float]]] = [([], []) for _ in range(params.n)]

    def failed(error: str) -> None:
        calls.recorder.failure(ctx, t0, error)

    async with calls.admitted():  # the record too: a pause waits for it (ModelCalls.admitted)
        async with calls.engine_errors(ctx, failed):
            deadline = time.monotonic() + calls.config.engine_timeout_s
            stream = calls.engine.generate_stream(list(ctx.prompt_ids), params)
            result: GenerateResult | None = None
            try:
                while result is None:
                    item = await _next(stream, deadline)
                    if isinstance(item, GenerateResult):
                        result = item
                        break
                    assert isinstance(item, TokenDelta)
                    sampled[item.index][0].append(item.token_id)
                    sampled[item.index][1].append(item.logprob)
                    if tokens:
                        yield item
                    piece = live[item.index].feed(item.token_id)
                    if piece:
                        yield TextDelta(item.index, piece)
            except (asyncio.CancelledError, GeneratorExit):
                for ids, lps in sampled:
                    calls.recorder.failure(
                        ctx, t0, "the client left before the stream ended",
                        status=CallStatus.CANCELLED, completion=(ids, lps),
                    )  # fmt: skip
                raise
            finally:
                await stream.aclose()  # cancels the engine request unless it finished
        choices = calls.choices(ctx, result)
        await calls.recorder.choices(ctx, result, choices, time.perf_counter() - t0)
    for i, choice in enumerate(choices):
        rest = live[i].rest(choice.message.get("content"))
        if rest is None:  # not for the known parsers; the Done choices are what was stored
            log.warning(
                "streamed text of rollout %s is not a prefix of its content", ctx.rollout_id
            )
        elif rest:
            yield TextDelta(i, rest)
        for j, call in enumerate(choice.message.get("tool_calls") or []):
            yield ToolCallDelta(i, j, call["id"], call["function"]["name"], "")
            yield ToolCallDelta(i, j, None, None, call["function"]["arguments"])
    yield Done(choices, len(ctx.prompt_ids))
