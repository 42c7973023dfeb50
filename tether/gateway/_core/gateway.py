"""The gateway's logic, apart from HTTP: one :class:`Gateway` over two services.

- :class:`~.rollouts.RolloutLifecycle` (``gw.lifecycle``): rollouts, their tokens,
  their sampling overrides and the seeds of their calls;
- :class:`~.calls.ModelCalls` (``gw.calls``): admission, caps, constraint, render, the
  engine call and its record, each call carried by one :class:`~.context.CallContext`.

:class:`Gateway` is what the routes call, and what an in-process trainer or runner
calls directly (the routes are a thin layer over it: every store access and every
admission change goes through it). It raises the gateway's errors (``tether.gateway._errors``)
and the store's, engine's and chat layer's; only ``_http.status`` maps them to statuses.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator
from typing import Any

from tether.engine import AdmissionGate, Engine
from tether.records import AttemptEnd, Call, Place, RewardSource, Rollout
from tether.store import Store

from .._config import GatewayConfig
from .auth import Keys
from .calls import ModelCalls
from .choices import Choice
from .context import CallContext
from .rollouts import OpenedRollout, RolloutLifecycle

__all__ = ["Gateway", "OpenedRollout"]


class Gateway:
    """Serves model calls for rollouts and records every one of them.

    ``seed`` (the run's; random when None) is the root of the seeds of calls that ask
    for none (:class:`~.rollouts.RolloutLifecycle`). The rollout methods hand over to
    ``gw.lifecycle``, where each is documented; what the services keep (the render
    cache, the context limit, the count of engine calls, the seed) is read from them:
    ``gw.calls``, ``gw.lifecycle``.
    """

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        store: Store,
        config: GatewayConfig,
        *,
        seed: int | None = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.store = store
        self.keys = Keys(config.admin_key, config.record_keys)
        self.calls = ModelCalls(engine, tokenizer, store, config)
        root = secrets.randbits(62) if seed is None else int(seed)
        self.lifecycle = RolloutLifecycle(
            store, self.keys, config, self.calls.end_conversation, root
        )

    # -- what callers read --------------------------------------------------

    @property
    def config(self) -> GatewayConfig:
        return self.calls.config

    @config.setter
    def config(self, config: GatewayConfig) -> None:
        """A new config (a run sets ``public_url`` once its port is known) for both services;
        the keys stay those the gateway was built with."""
        self.lifecycle.config = config
        self.calls.configure(config)

    @property
    def default_run_id(self) -> str | None:
        """The run of rollouts opened without a run id (``tether serve`` sets it)."""
        return self.lifecycle.default_run_id

    @default_run_id.setter
    def default_run_id(self, run_id: str | None) -> None:
        self.lifecycle.default_run_id = run_id

    @property
    def gate(self) -> AdmissionGate:
        """The engine's admission gate, which every model call passes (``Engine.gate``)."""
        return self.engine.gate

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def lost_engine(self, rollout_id: str, attempt: int) -> bool:
        """Whether a model call of this attempt could not reach its inference server (a
        remote replica down): the run retries such an attempt as an infrastructure fault."""
        return (rollout_id, attempt) in self.calls.lost_engine

    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (for logprobs in answers)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    # -- rollouts (RolloutLifecycle) ----------------------------------------

    def open_rollout(
        self,
        task: dict[str, Any] | None = None,
        *,
        rollout_id: str | None = None,
        run_id: str | None = None,
        group_id: str | None = None,
        task_id: str | None = None,
        sampling: dict[str, float] | None = None,
        queued: bool = False,
        place: Place | None = None,
    ) -> OpenedRollout:
        """Create a rollout, start its first attempt and mint its token."""
        return self.lifecycle.open_rollout(
            task, rollout_id=rollout_id, run_id=run_id, group_id=group_id, task_id=task_id,
            sampling=sampling, queued=queued, place=place,
        )  # fmt: skip

    def retry_rollout(
        self, rollout_id: str, *, sampling: dict[str, float] | None = None, queued: bool = False
    ) -> OpenedRollout:
        """Start a new attempt (after a failure or timeout); the old token then gets 409."""
        return self.lifecycle.retry_rollout(rollout_id, sampling=sampling, queued=queued)

    def mark_running(self, rollout_id: str, attempt: int) -> None:
        """A ``queued`` attempt's agent has started (runners call this); no-op if running."""
        self.lifecycle.mark_running(rollout_id, attempt)

    def current_attempt(self, rollout_id: str) -> int:
        """The attempt the rollout is at; UnknownRollout when there is no such rollout."""
        return self.lifecycle.current_attempt(rollout_id)

    def finish_rollout(
        self,
        end: AttemptEnd,
        *,
        reward: float | None = None,
        source: RewardSource = RewardSource.GRADER,
        final_answer: str | None = None,
    ) -> Rollout:
        """End a rollout's attempt as ``end`` says, with an optional final reward."""
        return self.lifecycle.finish_rollout(
            end, reward=reward, source=source, final_answer=final_answer
        )

    def record_reward(
        self,
        rollout_id: str,
        value: float,
        *,
        call_seq: int | None = None,
        attempt: int | None = None,
        source: RewardSource = RewardSource.AGENT,
    ) -> None:
        """Record a reward for the rollout's ``attempt`` (default: its current one)."""
        self.lifecycle.record_reward(
            rollout_id, value, call_seq=call_seq, attempt=attempt, source=source
        )

    def authorize(self, rollout_id: str, token: str | None) -> int:
        """The rollout's current attempt if ``token`` is its own (400/401/403/409 otherwise)."""
        return self.lifecycle.authorize(rollout_id, token)

    def rollouts(
        self, *, run_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[Rollout]:
        """The stored rollouts, newest first, by run and status (a status name)."""
        return self.lifecycle.rollouts(run_id=run_id, status=status, limit=limit)

    def rollout(self, rollout_id: str) -> tuple[Rollout, list[Call]]:
        """One rollout and its calls (404 if there is none)."""
        return self.lifecycle.rollout(rollout_id)

    # -- admission ----------------------------------------------------------

    def admission_state(self) -> dict[str, Any]:
        """``paused``, ``in_flight``, ``held`` now and so far, the engine's
        ``policy_version`` and the gateway's ``engine_calls``."""
        return self.calls.admission_state()

    async def pause(self) -> None:
        """Hold new model calls and return once the calls in flight have finished (the
        engine's gate: a weight update inside leaves it paused, for :meth:`resume`)."""
        await self.gate.pause()

    def resume(self) -> None:
        """Admit model calls again; the held ones go ahead."""
        self.gate.resume()

    # -- model calls --------------------------------------------------------

    def prepare_chat(
        self,
        rollout_id: str,
        attempt: int,
        req: Any,
        recorded: dict[str, Any] | None = None,
        *,
        ceiling: bool = False,
        role: str | None = None,
    ) -> CallContext:
        """Check and render one chat-shaped call (nothing is generated or stored yet);
        ``ceiling``: its max_tokens is an upper bound (``ModelCalls.chat``); ``role``: the
        agent role named in its URL (recorded with the call)."""
        over = self.lifecycle.overrides(rollout_id)
        return self.calls.chat(
            rollout_id, attempt, req, override=over, recorded=recorded, ceiling=ceiling, role=role
        )

    def prompt_tokens(self, req: Any) -> int:
        """How many tokens a chat-shaped request's prompt renders to (nothing is generated
        or stored, no conversation's render cache is touched)."""
        return len(self.calls.render(req.messages, req.tools))

    def prepare_completion(
        self, rollout_id: str, attempt: int, req: Any, *, role: str | None = None
    ) -> CallContext:
        """Check and encode one text completion (nothing is generated or stored yet)."""
        over = self.lifecycle.overrides(rollout_id)
        return self.calls.completion(rollout_id, attempt, req, override=over, role=role)

    async def generate(self, ctx: CallContext) -> tuple[list[Choice], list[int]]:
        """Run the engine, record one call per choice (committed before this returns), and
        return the choices and their seqs; an engine failure is a failed call, raised."""
        return await self.calls.generate(self._seeded(ctx))

    def generate_stream(
        self, ctx: CallContext, *, tokens: bool = False
    ) -> AsyncGenerator[Any, None]:
        """:meth:`generate`, streamed: ``TextDelta`` / ``ToolCallDelta`` pieces as the engine
        samples tokens, then ``Done`` once the calls are committed (``streaming``);
        ``tokens=True`` adds each sampled ``TokenDelta``."""
        return self.calls.stream(self._seeded(ctx), tokens=tokens)

    def _seeded(self, ctx: CallContext) -> CallContext:
        return ctx.with_params(self.lifecycle.seeded(ctx.params, ctx.rollout_id, ctx.attempt))
