"""The gateway's logic, apart from HTTP: rollouts, tokens and model calls.

:class:`Gateway` is what the routes call, and what an in-process trainer or
runner calls directly (the admin routes are a thin layer over it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from tether.chat import get_parser, render_text
from tether.engine import (
    AdmissionGate,
    Engine,
    EngineError,
    EngineFailed,
    EngineTimeout,
    SamplingParams,
)
from tether.records import Call, CallStatus, Reward, RewardSource, Rollout, RolloutStatus
from tether.store import Store

from ._auth import Keys, check_rollout_id, hash_token, new_token
from ._config import GatewayConfig
from ._errors import ApiError
from ._prompt import PromptEncoder
from ._render import Choice, choices_from, stop_token_ids

__all__ = ["Gateway", "OpenedRollout"]

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):

    async def _within(awaitable: Any, timeout_s: float) -> Any:
        """``asyncio.wait_for`` without its extra task (and event-loop turn) per call."""
        async with asyncio.timeout(timeout_s):
            return await awaitable

else:  # pragma: no cover - Python 3.10
    _within = asyncio.wait_for


@dataclass(frozen=True)
class OpenedRollout:
    """What an agent needs: give it ``base_url`` and ``token`` (never the admin key)."""

    rollout_id: str
    attempt: int
    token: str
    base_url: str
    reward_url: str

    def as_json(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "attempt": self.attempt,
            "token": self.token,
            "base_url": self.base_url,
            "reward_url": self.reward_url,
        }


class Gateway:
    """Serves model calls for rollouts and records every one of them.

    A sampled call whose request carries no ``seed`` gets one derived from
    ``seed`` (the run's; random when None), the rollout's id within its run
    (the ``{run_id}-`` prefix removed), the attempt and the call's index in
    the attempt (its ``seq`` for an agent that calls one at a time). What a
    rollout samples then depends neither on the order in which concurrent
    agents' calls reach the engine nor on the run id, so a rerun or a resumed
    run with the same seed samples the same tokens from the same weights.
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
        self.config = config
        self.keys = Keys(config.admin_key, config.record_keys)
        self.parser = get_parser(config.tool_parser)
        self.gate = AdmissionGate()
        self.stop_ids = stop_token_ids(tokenizer)
        self.prompts = PromptEncoder(tokenizer)
        self.max_context = int(getattr(tokenizer, "model_max_length", 0) or 0)
        self.engine_calls = 0
        # Per-rollout sampling overrides set by the trainer (e.g. greedy evaluation);
        # in memory only: they matter while the rollout runs in this process.
        self._sampling: dict[str, dict[str, float]] = {}
        # Rollouts created without a run id belong to this run (``tether serve`` sets it).
        self.default_run_id: str | None = None
        self.seed = secrets.randbits(62) if seed is None else int(seed)
        # rollout id -> (attempt, base of its derived seeds, calls made so far in the attempt)
        self._draws: dict[str, tuple[int, bytes, int]] = {}

    # -- rollouts -----------------------------------------------------------

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
    ) -> OpenedRollout:
        """Create a rollout, start its first attempt and mint its token.

        ``sampling`` overrides what the agent asks for (``temperature``,
        ``top_p``) on every call of this rollout: the trainer uses it to
        evaluate an unchanged agent greedily. ``queued``: the attempt waits
        for a runner, which calls :meth:`mark_running` when it starts the
        agent (the agent's first call does it too); else it is running now.
        """
        rid = check_rollout_id(rollout_id) if rollout_id else f"r-{uuid.uuid4().hex[:16]}"
        if self.store.get_rollout(rid) is not None:
            raise ApiError(409, f"rollout {rid!r} already exists", param="rollout_id")
        self.store.create_rollout(
            Rollout(
                id=rid,
                run_id=run_id or self.default_run_id,
                task_id=task_id,
                group_id=group_id,
                task=task or {},
            )
        )
        if sampling:
            unknown = set(sampling) - {"temperature", "top_p"}
            if unknown:
                raise ApiError(
                    400, f"sampling overrides {sorted(unknown)} are not supported", param="sampling"
                )
            self._sampling[rid] = dict(sampling)
        return self._start(rid, queued)

    def retry_rollout(
        self, rollout_id: str, *, sampling: dict[str, float] | None = None, queued: bool = False
    ) -> OpenedRollout:
        """Start a new attempt (after a failure or timeout); the old token then gets 409.

        ``sampling`` restores the overrides given to :meth:`open_rollout`
        (finishing the failed attempt dropped them).
        """
        if sampling:
            self._sampling[rollout_id] = dict(sampling)
        return self._start(rollout_id, queued)

    def mark_running(self, rollout_id: str, attempt: int) -> None:
        """A ``queued`` attempt's agent has started (runners call this); no-op if running."""
        self.store.mark_running(rollout_id, attempt)

    def _start(self, rollout_id: str, queued: bool = False) -> OpenedRollout:
        token = new_token()
        previous = self.store.rollout_auth(rollout_id)
        attempt = self.store.start_attempt(rollout_id, hash_token(token), queued=queued)
        if previous is not None and previous[2]:
            self.keys.supersede(previous[2], hash_token(token))
        base = self.config.base_url
        return OpenedRollout(
            rollout_id=rollout_id,
            attempt=attempt,
            token=token,
            base_url=f"{base}/rollouts/{rollout_id}/v1",
            reward_url=f"{base}/rollouts/{rollout_id}/reward",
        )

    def finish_rollout(
        self,
        rollout_id: str,
        status: RolloutStatus,
        *,
        attempt: int | None = None,
        reward: float | None = None,
        source: RewardSource = RewardSource.GRADER,
        final_answer: str | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        output_tail: str = "",
        success: bool | None = None,
    ) -> Rollout:
        """End a rollout's attempt (its token stops working) with an optional final reward.

        ``exit_code``, ``output_tail`` (what the agent printed) and ``success``
        are kept with the attempt (:meth:`Store.attempts`)."""
        self._sampling.pop(rollout_id, None)
        self._draws.pop(rollout_id, None)
        auth = self.store.rollout_auth(rollout_id)
        if attempt is None:
            if auth is None:
                raise ApiError(404, f"no rollout {rollout_id!r}")
            attempt = auth[1]
        if (
            auth is not None
            and auth[0] is RolloutStatus.QUEUED
            and auth[1] == attempt >= 1
            and RolloutStatus(status) is not RolloutStatus.CANCELLED
        ):  # its runner ran it without saying so: queued → running → final, never a jump
            self.store.mark_running(rollout_id, attempt)
        return self.store.finish_rollout(
            rollout_id,
            status,
            attempt=attempt,
            reward=reward,
            reward_source=source if reward is not None else None,
            final_answer=final_answer,
            error=error,
            exit_code=exit_code,
            output_tail=output_tail,
            success=success,
        )

    def record_agent_reward(
        self, rollout_id: str, attempt: int, value: float, call_seq: int | None
    ) -> None:
        if not self.config.allow_agent_rewards:
            raise ApiError(
                403,
                "this run does not accept rewards from agents (gateway.allow_agent_rewards is off)",
            )
        self.store.record_reward(
            Reward(
                rollout_id=rollout_id,
                value=float(value),
                source=RewardSource.AGENT,
                attempt=attempt,
                call_seq=call_seq,
            )
        )

    # -- admission ----------------------------------------------------------

    async def pause(self) -> None:
        """Hold new model calls and return once the calls in flight have finished."""
        await self.gate.pause()

    def resume(self) -> None:
        """Admit model calls again; the held ones go ahead."""
        self.gate.resume()

    def admission_state(self) -> dict[str, Any]:
        """``paused``, ``in_flight``, ``held`` now, ``held_total`` and ``held_seconds`` so far,
        the engine's ``policy_version`` and the gateway's ``engine_calls``."""
        return {
            **self.gate.state(),
            "policy_version": self.engine.policy_version,
            "engine_calls": self.engine_calls,
        }

    # -- model calls --------------------------------------------------------

    def sampling_params(
        self, req: Any, *, max_tokens: int | None, top_logprobs: int, rollout_id: str | None = None
    ) -> SamplingParams:
        """Check the caps and build the engine's sampling parameters (400 beyond a cap)."""
        cfg = self.config
        override = self._sampling.get(rollout_id, {}) if rollout_id else {}
        temperature = override.get("temperature", req.temperature)
        top_p = override.get("top_p", req.top_p)
        if req.n > cfg.max_n:
            raise ApiError(
                400, f"n ({req.n}) is above this gateway's cap of {cfg.max_n}", param="n"
            )
        if max_tokens is not None and max_tokens > cfg.max_tokens:
            raise ApiError(
                400,
                f"max_tokens ({max_tokens}) is above this gateway's cap of {cfg.max_tokens}",
                param="max_tokens",
            )
        if top_logprobs > cfg.max_top_logprobs:
            raise ApiError(
                400,
                f"top_logprobs ({top_logprobs}) is above the cap of {cfg.max_top_logprobs}",
                param="top_logprobs",
            )
        return SamplingParams(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            max_tokens=max_tokens or cfg.default_max_tokens,
            n=req.n,
            stop=req.stop_list(),
            stop_token_ids=self.stop_ids,
            seed=req.seed,
            top_logprobs=top_logprobs,
        )

    def derived_seed(self, rollout_id: str, attempt: int) -> int:
        """The seed of the attempt's next call (see the class docstring); counts the call."""
        state = self._draws.get(rollout_id)
        if state is None or state[0] != attempt:
            rollout = self.store.get_rollout(rollout_id)
            run_id = rollout.run_id if rollout is not None else None
            name = rollout_id.removeprefix(f"{run_id}-") if run_id else rollout_id
            state = (attempt, f"{self.seed}\0{name}\0{attempt}".encode(), 0)
        attempt, base, index = state
        self._draws[rollout_id] = (attempt, base, index + 1)
        digest = hashlib.blake2b(base + b"\0%d" % index, digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 2

    def check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="messages")
        if self.max_context and len(prompt_ids) + params.max_tokens > self.max_context:
            raise ApiError(
                400,
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model's context of {self.max_context} tokens; shorten the conversation or lower max_tokens",
                param="messages",
            )

    def render(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        cfg = self.config
        if not messages:
            raise ApiError(400, "messages must not be empty", param="messages")
        if len(messages) > cfg.max_messages:
            raise ApiError(
                400,
                f"{len(messages)} messages is above the cap of {cfg.max_messages}",
                param="messages",
            )
        if tools and len(tools) > cfg.max_tools:
            raise ApiError(
                400, f"{len(tools)} tools is above the cap of {cfg.max_tools}", param="tools"
            )
        # render_prompt(), with the encoding of a prefix seen before reused (token-exact).
        return self.prompts.encode(render_text(self.tokenizer, messages, tools or None))

    async def generate(
        self,
        rollout_id: str,
        attempt: int,
        prompt_ids: list[int],
        params: SamplingParams,
        request: dict[str, Any],
        *,
        parse_tools: bool,
        max_tool_calls: int | None = None,
    ) -> tuple[list[Choice], list[int]]:
        """Run the engine, record one call per choice, and return the choices and their seqs.

        ``max_tool_calls=1`` (``parallel_tool_calls: false``) keeps only the first
        parsed tool call in the answer and in the recorded response.

        The calls are committed before this returns, so an agent never sees an
        answer that is not stored. An engine failure is recorded as a failed
        call (never as a training sample) and raised.
        """
        t0 = time.perf_counter()
        if params.seed is None and params.temperature > 0:
            params = replace(params, seed=self.derived_seed(rollout_id, attempt))
        async with self.gate.admit(self.config.admission_timeout_s):
            self.engine_calls += 1
            try:
                result = await _within(
                    self.engine.generate(prompt_ids, params), self.config.engine_timeout_s
                )
            # asyncio.TimeoutError: what wait_for raises on Python 3.10 (not the builtin there)
            except (asyncio.TimeoutError, EngineTimeout) as exc:
                self._record_failure(
                    rollout_id, attempt, prompt_ids, params, request, t0, "timeout"
                )
                raise EngineTimeout(f"no answer within {self.config.engine_timeout_s:g} s") from exc
            except EngineError as exc:
                self._record_failure(rollout_id, attempt, prompt_ids, params, request, t0, str(exc))
                raise
            except (
                Exception
            ) as exc:  # an engine bug must not become a hang or a 500 without a record
                log.exception("engine raised")
                self._record_failure(
                    rollout_id, attempt, prompt_ids, params, request, t0, repr(exc)
                )
                raise EngineFailed(type(exc).__name__) from exc
        latency = time.perf_counter() - t0
        choices = choices_from(
            self.tokenizer,
            result,
            params,
            self.parser if parse_tools else None,
            max_tool_calls=max_tool_calls,
        )
        seqs = []
        for choice, completion in zip(choices, result.completions, strict=True):
            seqs.append(
                self.store.record_call(
                    Call(
                        rollout_id=rollout_id,
                        seq=-1,
                        attempt=attempt,
                        prompt_ids=list(prompt_ids),
                        completion_ids=list(completion.token_ids),
                        logprobs=list(completion.logprobs),
                        policy_version=result.policy_version,
                        request=request,
                        response=choice.message,
                        finish_reason=choice.finish_reason,
                        temperature=params.temperature,
                        latency_s=latency,
                    )
                )
            )
        if self.config.log_prompts:
            log.info(
                "rollout %s: prompt %r -> %r",
                rollout_id,
                request.get("messages"),
                [c.text for c in choices],
            )
        return choices, seqs

    def _record_failure(self, rollout_id, attempt, prompt_ids, params, request, t0, error) -> None:
        try:
            self.store.record_call(
                Call(
                    rollout_id=rollout_id,
                    seq=-1,
                    attempt=attempt,
                    prompt_ids=list(prompt_ids),
                    completion_ids=[],
                    logprobs=[],
                    policy_version=self.engine.policy_version,
                    request=request,
                    finish_reason=None,
                    temperature=params.temperature,
                    status=CallStatus.FAILED,
                    error=error[:500],
                    latency_s=time.perf_counter() - t0,
                )
            )
        except Exception:  # the rollout may have ended meanwhile; the error still reaches the agent
            log.warning("could not record the failed call of rollout %s", rollout_id)
