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

from tether.engine import Engine
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
    for none (:class:`~.rollouts.RolloutLifecycle`). The rollout methods
    (``open_rollout``, ``retry_rollout``, ``mark_running``, ``current_attempt``, ``finish_rollout``,
    ``record_reward``, ``authorize``, ``rollouts``, ``rollout``) are the lifecycle's own,
    bound here (one signature each, in ``rollouts``); what the services keep (the render
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
        lc = self.lifecycle  # the public rollout methods, not copies of their signatures
        self.open_rollout = lc.open_rollout
        self.retry_rollout = lc.retry_rollout
        self.mark_running = lc.mark_running
        self.current_attempt = lc.current_attempt
        self.finish_rollout = lc.finish_rollout
        self.record_reward = lc.record_reward
        self.authorize = lc.authorize
        self.rollouts = lc.rollouts
        self.rollout = lc.rollout
        self.admission_state = self.calls.admission_state

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
    def gate(self) -> Any:
        return self.calls.gate

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

    # -- admission ----------------------------------------------------------

    async def pause(self) -> None:
        """Hold new model calls and return once the calls in flight have finished."""
        await self.calls.gate.pause()

    def resume(self) -> None:
        """Admit model calls again; the held ones go ahead."""
        self.calls.gate.resume()

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
