"""The gateway's logic, apart from HTTP: model calls (rollouts in ``_rollouts``).

:class:`Gateway` is what the routes call, and what an in-process trainer or
runner calls directly (the routes are a thin layer over it: every store
access and every admission change goes through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from tether.chat import HistoryCache, PromptEncoder, get_parser, render_text
from tether.engine import (
    AdmissionGate,
    Engine,
    EngineError,
    EngineFailed,
    EngineTimeout,
    SamplingParams,
    end_of_turn_ids,
)
from tether.records import Call, CallStatus
from tether.store import Store

from ._auth import Keys
from ._config import GatewayConfig
from ._errors import ApiError
from ._render import Choice, choices_from
from ._rollouts import OpenedRollout, Rollouts
from ._streaming import stream_call

__all__ = ["Gateway", "OpenedRollout"]

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):

    async def _within(awaitable: Any, timeout_s: float) -> Any:
        """``asyncio.wait_for`` without its extra task (and event-loop turn) per call."""
        async with asyncio.timeout(timeout_s):
            return await awaitable

else:  # pragma: no cover - Python 3.10
    _within = asyncio.wait_for


class Gateway(Rollouts):
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
        self.stop_ids = end_of_turn_ids(tokenizer)
        self.prompts = PromptEncoder(tokenizer)
        self.history = HistoryCache(tokenizer)
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

    def seeded(self, params: SamplingParams, rollout_id: str, attempt: int) -> SamplingParams:
        """``params`` with the derived seed of the attempt's next call, if it samples unseeded."""
        if params.seed is None and params.temperature > 0:
            return replace(params, seed=self.derived_seed(rollout_id, attempt))
        return params

    @contextlib.asynccontextmanager
    async def engine_call(self, failed: Callable[[str], None]) -> AsyncIterator[None]:
        """One engine call (plain or streamed): admitted through the gate and counted.

        An engine failure inside is recorded with ``failed(error)`` (a failed call,
        never a training sample) and raised as an :class:`EngineError`: a timeout as
        :class:`EngineTimeout`, an unexpected exception (an engine bug) as
        :class:`EngineFailed`, so that it becomes neither a hang nor a bare 500.
        """
        async with self.gate.admit(self.config.admission_timeout_s):
            self.engine_calls += 1
            try:
                yield
            # asyncio.TimeoutError: what wait_for raises on Python 3.10 (not the builtin there)
            except (asyncio.TimeoutError, EngineTimeout) as exc:
                failed("timeout")
                raise EngineTimeout(f"no answer within {self.config.engine_timeout_s:g} s") from exc
            except EngineError as exc:
                failed(str(exc))
                raise
            except Exception as exc:
                log.exception("engine raised")
                failed(repr(exc))
                raise EngineFailed(type(exc).__name__) from exc

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

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        *,
        conversation: tuple[str, int] | None = None,
    ) -> list[int]:
        """The prompt ids (400 beyond a cap). ``conversation`` (rollout id, attempt): render
        and encode only what extends that conversation's previous prompt (``HistoryCache``)."""
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
        if conversation is not None and self.config.render_cache:
            return self.history.render(conversation, messages, tools or None, self._render_full)
        return self._render_full(messages, tools or None)[1]

    def _render_full(self, messages: Any, tools: Any) -> tuple[str, list[int]]:
        # render_prompt(), with the encoding of a prefix seen before reused (token-exact).
        text = render_text(self.tokenizer, messages, tools)
        return text, self.prompts.encode(text)

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
        params = self.seeded(params, rollout_id, attempt)

        def failed(error: str) -> None:
            self._record_failure(rollout_id, attempt, prompt_ids, params, request, t0, error)

        async with self.engine_call(failed):
            result = await _within(
                self.engine.generate(prompt_ids, params), self.config.engine_timeout_s
            )
        latency = time.perf_counter() - t0
        choices = choices_from(
            self.tokenizer,
            result,
            params,
            self.parser if parse_tools else None,
            max_tool_calls=max_tool_calls,
        )
        seqs = self.record_choices(
            rollout_id, attempt, prompt_ids, params, request, result, choices, latency
        )
        return choices, seqs

    #: :meth:`generate`, streamed: ``TextDelta`` / ``ToolCallDelta`` pieces as the engine
    #: samples tokens, then ``Done`` once the calls are committed (``_streaming.stream_call``,
    #: which takes the same arguments, ``tokens=True`` adding each sampled ``TokenDelta``).
    generate_stream = stream_call

    def record_choices(
        self,
        rollout_id: str,
        attempt: int,
        prompt_ids: list[int],
        params: SamplingParams,
        request: dict[str, Any],
        result: Any,
        choices: list[Choice],
        latency: float,
    ) -> list[int]:
        """Commit one call per choice; return their seqs."""
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
                        constraint=params.constraint.label if params.constraint else None,
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
        return seqs

    def _record_failure(
        self,
        rollout_id,
        attempt,
        prompt_ids,
        params,
        request,
        t0,
        error,
        *,
        status: CallStatus = CallStatus.FAILED,
        completion: tuple[list[int], list[float]] = ([], []),
    ) -> None:
        try:
            self.store.record_call(
                Call(
                    rollout_id=rollout_id,
                    seq=-1,
                    attempt=attempt,
                    prompt_ids=list(prompt_ids),
                    completion_ids=list(completion[0]),
                    logprobs=list(completion[1]),
                    policy_version=self.engine.policy_version,
                    request=request,
                    finish_reason=None,
                    temperature=params.temperature,
                    status=status,
                    error=error[:500],
                    latency_s=time.perf_counter() - t0,
                )
            )
        except Exception:  # the rollout may have ended meanwhile; the error still reaches the agent
            log.warning("could not record the failed call of rollout %s", rollout_id)
