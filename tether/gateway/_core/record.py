"""What a model call leaves in the store: one call per choice, or a failed / cancelled call.

:class:`Recorder` is the only writer of calls; it takes the :class:`~.context.CallContext`
of the call and what the engine returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from tether.engine import Engine, GenerateResult
from tether.records import Call, CallStatus
from tether.store import Store

from .choices import Choice
from .context import CallContext

__all__ = ["Recorder"]

log = logging.getLogger(__name__)


class Recorder:
    """Commits calls to ``store``; ``log_prompts`` logs each prompt and answer."""

    def __init__(self, store: Store, engine: Engine, *, log_prompts: bool = False) -> None:
        self.store = store
        self.engine = engine
        self.log_prompts = log_prompts

    async def choices(
        self, ctx: CallContext, result: GenerateResult, choices: list[Choice], latency: float
    ) -> list[int]:
        """Commit one call per choice, on the store's writer thread (the event loop serves
        other calls meanwhile); return their seqs once committed."""
        label = ctx.params.constraint.label if ctx.params.constraint else None
        calls = [
            replace(
                _call(ctx, completion.token_ids, completion.logprobs, result.policy_version),
                response=choice.message,
                finish_reason=choice.finish_reason,
                latency_s=latency,
                constraint=label,
            )
            for choice, completion in zip(choices, result.completions, strict=True)
        ]
        seqs = await self.store.in_writer(self._commit, calls)
        if self.log_prompts:
            log.info(
                "rollout %s: prompt %r -> %r",
                ctx.rollout_id,
                ctx.request.get("messages"),
                [c.text for c in choices],
            )
        return seqs

    def _commit(self, calls: list[Call]) -> list[int]:
        return [self.store.record_call(call) for call in calls]

    def failure(
        self,
        ctx: CallContext,
        t0: float,
        error: str,
        *,
        status: CallStatus = CallStatus.FAILED,
        completion: tuple[list[int], list[float]] = ([], []),
    ) -> None:
        """A call that gave no answer (never a training sample): ``failed`` or ``cancelled``,
        with the tokens sampled before it stopped. Written on the event loop: it is
        recorded where nothing can be awaited (a stream closed by its consumer)."""
        try:
            call = _call(ctx, completion[0], completion[1], self.engine.policy_version)
            self.store.record_call(
                replace(call, status=status, error=error[:500], latency_s=time.perf_counter() - t0)
            )
        except Exception:  # the rollout may have ended meanwhile; the error still reaches the agent
            log.warning("could not record the failed call of rollout %s", ctx.rollout_id)


def _call(
    ctx: CallContext, ids: Sequence[int], logprobs: Sequence[float], policy_version: int
) -> Call:
    """The call record of ``ctx`` with these completion tokens (``seq`` set by the store)."""
    return Call(
        rollout_id=ctx.rollout_id,
        seq=-1,
        attempt=ctx.attempt,
        prompt_ids=list(ctx.prompt_ids),
        completion_ids=list(ids),
        logprobs=list(logprobs),
        policy_version=policy_version,
        request=ctx.request,
        finish_reason=None,
        temperature=ctx.params.temperature,
        role=ctx.role,
    )
