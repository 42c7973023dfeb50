"""Model calls: admission, caps, constraint, render, the engine call and its record.

:class:`ModelCalls` is the half of :class:`~tether.gateway.Gateway` that serves calls
(the other half, ``rollouts``, manages rollouts). A call is prepared into a
:class:`~.context.CallContext` (:meth:`ModelCalls.chat`, :meth:`ModelCalls.completion`:
checked and rendered, nothing generated or stored), then generated whole
(:meth:`ModelCalls.generate`) or streamed (:meth:`ModelCalls.stream`, ``streaming``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from tether.chat import HistoryCache, PromptEncoder, get_parser, render_text
from tether.engine import (
    Engine,
    EngineError,
    EngineFailed,
    EngineTimeout,
    EngineUnreachable,
    GenerateResult,
    end_of_turn_ids,
)
from tether.store import Store

from .._config import GatewayConfig
from .._errors import InvalidRequest
from .choices import Choice, choices_from
from .constrain import constrain, constraint_for
from .context import CallContext
from .prepare import check_messages, context_limit, fit_context, sampling_params
from .record import Recorder
from .streaming import stream_call

__all__ = ["ModelCalls"]

log = logging.getLogger(__name__)

if sys.version_info >= (3, 11):

    async def _within(awaitable: Any, timeout_s: float) -> Any:
        """``asyncio.wait_for`` without its extra task (and event-loop turn) per call."""
        async with asyncio.timeout(timeout_s):
            return await awaitable

else:  # pragma: no cover - Python 3.10
    _within = asyncio.wait_for


class ModelCalls:
    """Serves and records the model calls of every rollout through the engine's admission
    gate (``engine.gate``: one gate per call, the engine's own; the gateway adds its
    admission timeout and pauses it for a training step)."""

    def __init__(self, engine: Engine, tokenizer: Any, store: Store, config: GatewayConfig):
        self.engine = engine
        self.tokenizer = tokenizer
        self.stop_ids = end_of_turn_ids(tokenizer)
        self.prompts = PromptEncoder(tokenizer)
        self.history = HistoryCache(tokenizer)
        self.recorder = Recorder(store, engine)
        self.engine_calls = 0
        #: (rollout id, attempt) of the attempts whose engine call could not reach a server
        self.lost_engine: set[tuple[str, int]] = set()
        self.configure(config)

    def end_conversation(self, key: tuple[str, int]) -> None:
        """Forget what was kept for an attempt that ended: its rendered history, and the
        mark of a lost server (read by the run before it ends the attempt)."""
        self.history.forget(key)
        self.lost_engine.discard(key)

    def configure(self, config: GatewayConfig) -> None:
        """Serve by ``config`` from now on (caps, tool parser, context, prompt logging)."""
        self.config = config
        self.parser = get_parser(config.tool_parser)
        self.max_context = context_limit(self.tokenizer, self.engine, config.max_context)
        self.recorder.log_prompts = config.log_prompts

    # -- admission ----------------------------------------------------------

    def admission_state(self) -> dict[str, Any]:
        """``paused``, ``in_flight``, ``held`` now, ``held_total`` and ``held_seconds`` so far,
        the engine's ``policy_version`` and the gateway's ``engine_calls``."""
        return {
            **self.engine.gate.state(),
            "policy_version": self.engine.policy_version,
            "engine_calls": self.engine_calls,
        }

    # -- preparing a call ---------------------------------------------------

    def chat(
        self,
        rollout_id: str,
        attempt: int,
        req: Any,
        *,
        override: dict[str, float],
        recorded: dict[str, Any] | None = None,
        ceiling: bool = False,
        role: str | None = None,
    ) -> CallContext:
        """Check and render one chat-shaped call (a ``ChatCompletionRequest``; the Responses
        and Messages routes map their requests onto one first); ``recorded`` adds keys to
        its recorded request. ``ceiling``: the asked ``max_tokens`` is an upper bound (the
        Messages API requires one, so clients send large ones): lowered to the gateway's
        cap and cut to what the context leaves, as an unasked one is, instead of a 400."""
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        asked = req.max_completion_tokens or req.max_tokens
        if ceiling and asked is not None:
            asked = min(asked, self.config.max_tokens)
        params = sampling_params(
            self.config, req, max_tokens=asked, top_logprobs=top, override=override,
            stop_ids=self.stop_ids, affinity=rollout_id, role=role,
        )  # fmt: skip
        constraint = constraint_for(
            response_format=req.response_format,
            tools=req.tools,
            tool_choice=req.tool_choice,
            parallel_tool_calls=req.parallel_tool_calls,
            tool_parser=self.config.tool_parser,
        )
        params = constrain(self.engine, params, constraint)
        prompt_ids = self.render(req.messages, req.tools, conversation=(rollout_id, attempt))
        params = fit_context(
            len(prompt_ids), params, self.max_context, asked=asked is not None and not ceiling,
            param="messages",
        )  # fmt: skip
        record = {
            "messages": req.messages,
            "tools": req.tools,
            "params": req.model_dump(exclude={"messages", "tools"}, exclude_none=True),
            **(recorded or {}),
        }
        return CallContext(
            rollout_id, attempt, tuple(prompt_ids), params, record,
            parse_tools=bool(req.tools) and req.tool_choice != "none",
            max_tool_calls=1 if req.parallel_tool_calls is False else None, role=role,
        )  # fmt: skip

    def completion(
        self,
        rollout_id: str,
        attempt: int,
        req: Any,
        *,
        override: dict[str, float],
        role: str | None = None,
    ) -> CallContext:
        """Check and encode one text completion (a ``CompletionRequest``: text or token ids)."""
        params = sampling_params(
            self.config, req, max_tokens=req.max_tokens, top_logprobs=req.logprobs or 0,
            override=override, stop_ids=self.stop_ids, affinity=rollout_id, role=role,
        )  # fmt: skip
        params = constrain(self.engine, params, None)
        if isinstance(req.prompt, str):
            prompt_ids = self.tokenizer.encode(req.prompt, add_special_tokens=False)
        else:
            vocab = len(self.tokenizer)
            if any(not 0 <= t < vocab for t in req.prompt):
                raise InvalidRequest(f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
            prompt_ids = list(req.prompt)
        params = fit_context(
            len(prompt_ids), params, self.max_context, asked=req.max_tokens is not None,
            param="messages",
        )  # fmt: skip
        record = {
            "prompt": req.prompt,
            "params": req.model_dump(exclude={"prompt"}, exclude_none=True),
        }
        return CallContext(rollout_id, attempt, tuple(prompt_ids), params, record, role=role)

    def render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        *,
        conversation: tuple[str, int] | None = None,
    ) -> list[int]:
        """The prompt ids (400 beyond a cap). ``conversation`` (rollout id, attempt): render
        and encode only what extends that conversation's previous prompt (``HistoryCache``)."""
        check_messages(self.config, messages, tools)
        if conversation is not None and self.config.render_cache:
            return self.history.render(conversation, messages, tools or None, self._render_full)
        return self._render_full(messages, tools or None)[1]

    def _render_full(self, messages: Any, tools: Any) -> tuple[str, list[int]]:
        # render_prompt(), with the encoding of a prefix seen before reused (token-exact).
        text = render_text(self.tokenizer, messages, tools)
        return text, self.prompts.encode(text)

    # -- the engine call ----------------------------------------------------

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """One call (plain or streamed) admitted through the engine's gate and counted.

        The engine call *and its record* run inside: a pause (an async update) waits for
        both, so when it returns every call served so far is stored.
        """
        async with self.engine.gate.admit(self.config.admission_timeout_s):
            self.engine_calls += 1
            yield

    @contextlib.asynccontextmanager
    async def engine_errors(
        self, ctx: CallContext, failed: Callable[[str], None]
    ) -> AsyncIterator[None]:
        """An engine failure inside is recorded with ``failed(error)`` (a failed call,
        never a training sample) and raised as an :class:`EngineError`: a timeout as
        :class:`EngineTimeout`, an unexpected exception (an engine bug) as
        :class:`EngineFailed`, so that it becomes neither a hang nor a bare 500. An
        :class:`EngineUnreachable` (a remote replica down) also marks the call's attempt
        in :attr:`lost_engine`, so the run retries it as an infrastructure fault.
        """
        try:
            yield
        # asyncio.TimeoutError: what wait_for raises on Python 3.10 (not the builtin there)
        except (asyncio.TimeoutError, EngineTimeout) as exc:
            failed("timeout")
            raise EngineTimeout(f"no answer within {self.config.engine_timeout_s:g} s") from exc
        except EngineError as exc:
            failed(str(exc))
            if isinstance(exc, EngineUnreachable):
                self.lost_engine.add(ctx.conversation)
            raise
        except Exception as exc:
            log.exception("engine raised")
            failed(repr(exc))
            raise EngineFailed(type(exc).__name__) from exc

    async def generate(self, ctx: CallContext) -> tuple[list[Choice], list[int]]:
        """Run the engine, record one call per choice, and return the choices and their seqs.

        The calls are committed before this returns (and before a pause can begin), so an
        agent never sees an answer that is not stored. An engine failure is recorded as a
        failed call (never as a training sample) and raised.
        """
        t0 = time.perf_counter()
        async with self.admitted():
            async with self.engine_errors(ctx, lambda e: self.recorder.failure(ctx, t0, e)):
                result = await _within(
                    self.engine.generate(list(ctx.prompt_ids), ctx.params),
                    self.config.engine_timeout_s,
                )
            choices = self.choices(ctx, result)
            took = time.perf_counter() - t0
            return choices, await self.recorder.choices(ctx, result, choices, took)

    def stream(self, ctx: CallContext, *, tokens: bool = False) -> AsyncGenerator[Any, None]:
        """:meth:`generate`, streamed (``_streaming.stream_call``)."""
        return stream_call(self, ctx, tokens=tokens)

    def choices(self, ctx: CallContext, result: GenerateResult) -> list[Choice]:
        """The engine's completions as answers (decoded, stop strings cut, tools parsed)."""
        parser = self.parser if ctx.parse_tools else None
        return choices_from(
            self.tokenizer, result, ctx.params, parser, max_tool_calls=ctx.max_tool_calls
        )
