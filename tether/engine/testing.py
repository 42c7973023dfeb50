"""Fake engines for tests: instant, scripted and faulty.

They implement the :class:`~tether.engine.Engine` protocol without a model,
so gateway, runner and trainer tests (tether's and users') run in
milliseconds::

    NullEngine(token_ids=[5, 6, 7], logprob=-0.5)     # the same ids every call
    ScriptedEngine(["Hi!", '<tool_call>{"name": "calc"}</tool_call>'], tokenizer=tok)
    ScriptedEngine([[5, 6], [7, 8]])                  # token-id lists, in order
    FaultyEngine(fault="raise")                       # or "hang", or "delay"

Every fake honours ``n``, ``max_tokens``, ``stop_token_ids`` (and ``stop``
strings when it has a tokenizer), records its calls in ``.calls``, and has
the real engines' pause/resume semantics: ``pause()`` waits for in-flight
generations, ``generate`` calls made while paused wait for ``resume()``.
``update_weights`` records the state dict and bumps ``policy_version``;
``close`` makes every later or waiting call fail with ``EngineFailed``.
A fake cannot honour a grammar: a call with ``SamplingParams.constraint``
raises :class:`~tether.engine.UnsupportedConstraint` (``supports_constraints``
is False, the protocol's default, which the gateway checks first). The fakes
stream through ``generate`` (the protocol's default ``generate_stream``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal

from tether.engine._constraint import UnsupportedConstraint
from tether.engine._protocol import (
    Completion,
    Engine,
    EngineError,
    EngineFailed,
    GenerateResult,
    Outage,
    SamplingParams,
)
from tether.engine._stream import TokenDelta, deltas_of, stream_via_generate
from tether.engine._turns import end_of_turn_ids

__all__ = ["FakeEngine", "FaultyEngine", "NullEngine", "ScriptedEngine"]


def refuse_constraint(engine: Any, params: SamplingParams) -> None:
    """Raise :class:`UnsupportedConstraint` when ``params`` carries a grammar constraint."""
    if params.constraint is not None:
        raise UnsupportedConstraint(
            f"{type(engine).__name__} cannot honour a grammar constraint "
            f"({params.constraint.label}); use TransformersEngine for structured outputs"
        )


class FakeEngine(Engine):
    """Shared machinery of the fakes; subclasses implement :meth:`_complete`.

    ``calls`` holds ``(prompt_ids, params)`` of every admitted generate call;
    ``weights`` holds the state dicts given to :meth:`update_weights`.
    ``delay_s`` makes every call take that long (an awaited sleep).
    """

    def __init__(self, *, logprob: float = -0.5, tokenizer: Any = None, delay_s: float = 0.0):
        self.logprob = float(logprob)
        self.tokenizer = tokenizer
        self.delay_s = float(delay_s)
        self.calls: list[tuple[list[int], SamplingParams]] = []
        self.weights: list[dict[str, Any]] = []
        self._version = 0

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    @property
    def paused(self) -> bool:
        return self.gate.paused

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        refuse_constraint(self, params)
        async with self.gate.admit():
            self.calls.append((list(prompt_ids), params))
            version = self._version
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            completions = [
                self._finish(self._complete(list(prompt_ids), params, i), params)
                for i in range(params.n)
            ]
            return GenerateResult(completions, version, {"engine": type(self).__name__})

    def _complete(self, prompt_ids: list[int], params: SamplingParams, index: int) -> list[int]:
        raise NotImplementedError

    def _finish(self, ids: list[int], params: SamplingParams) -> Completion:
        """Cut ``ids`` at a stop token, a stop string or ``max_tokens``."""
        out: list[int] = []
        reason = "stop"
        for tok in ids:
            if len(out) == params.max_tokens:
                reason = "length"
                break
            out.append(tok)
            if tok in params.stop_token_ids or self._has_stop_string(out, params):
                break
        lps = [self.logprob] * len(out)
        top = [{t: self.logprob} for t in out] if params.top_logprobs else None
        return Completion(out, lps, reason, top)

    def _has_stop_string(self, ids: list[int], params: SamplingParams) -> bool:
        if not params.stop or self.tokenizer is None:
            return False
        text = self.tokenizer.decode(ids)
        return any(s in text for s in params.stop)

    async def pause(self) -> None:
        await self.gate.pause()

    async def resume(self) -> None:
        self.gate.resume()

    async def outage(self) -> Outage | None:
        """A fake is never down (``FaultyEngine`` fails calls, not the engine)."""
        return None

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        async with self.gate.paused_for_update():
            self.weights.append(state_dict)
            self._version = self._version + 1 if version is None else int(version)
            return self._version

    async def close(self) -> None:
        self.gate.close()


class NullEngine(FakeEngine):
    """Returns the same token ids for every completion, instantly.

    Without ``token_ids`` it emits token ``fill_id`` ``max_tokens`` times
    (``finish_reason="length"``). With ``token_ids`` the completion is those
    ids, cut at the first stop token / stop string / ``max_tokens``; ids that
    run out first end with ``finish_reason="stop"`` (as if the model had
    stopped). Every token gets logprob ``logprob``.
    """

    def __init__(
        self,
        token_ids: Sequence[int] | None = None,
        *,
        logprob: float = -0.5,
        fill_id: int = 0,
        tokenizer: Any = None,
        delay_s: float = 0.0,
    ):
        super().__init__(logprob=logprob, tokenizer=tokenizer, delay_s=delay_s)
        self.token_ids = None if token_ids is None else [int(t) for t in token_ids]
        self.fill_id = int(fill_id)

    def _complete(self, prompt_ids: list[int], params: SamplingParams, index: int) -> list[int]:
        if self.token_ids is None:
            return [self.fill_id] * (params.max_tokens + 1)
        return list(self.token_ids)


ScriptItem = Sequence[int] | str | BaseException


class ScriptedEngine(FakeEngine):
    """Returns scripted completions in order, one script item per completion.

    An item is a list of token ids, a text (encoded with ``tokenizer``, without
    special tokens; then ``end_token_id`` is appended, by default the
    tokenizer's ``<|im_end|>`` or eos, so the completion ends like a chat
    turn), or an exception, which the call raises (wrapped in EngineFailed
    unless it already is an EngineError). A call with ``n=k`` takes ``k``
    items. When the script runs out the call fails with EngineFailed, unless
    ``cycle=True``.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem],
        tokenizer: Any = None,
        *,
        logprob: float = -0.5,
        end_token_id: int | None = None,
        cycle: bool = False,
        delay_s: float = 0.0,
    ):
        super().__init__(logprob=logprob, tokenizer=tokenizer, delay_s=delay_s)
        self.script: list[ScriptItem] = list(script)
        self.cycle = cycle
        self.position = 0
        ends = end_of_turn_ids(tokenizer)
        self.end_token_id = end_token_id if end_token_id is not None else (ends or (None,))[0]

    def assert_exhausted(self) -> None:
        """Raise AssertionError unless every script item was used (for ``cycle=True``: unless
        the last pass through the script ended at its last item)."""
        left = len(self.script) - self.position
        if left:
            raise AssertionError(
                f"ScriptedEngine: {left} of {len(self.script)} script items were never used"
            )

    def _complete(self, prompt_ids: list[int], params: SamplingParams, index: int) -> list[int]:
        if self.position >= len(self.script):
            if not (self.cycle and self.script):
                raise EngineFailed(f"ScriptedEngine: script exhausted after {self.position} items")
            self.position = 0
        item = self.script[self.position]
        self.position += 1
        if isinstance(item, EngineError):
            raise item
        if isinstance(item, BaseException):
            raise EngineFailed(f"scripted fault: {item!r}") from item
        if isinstance(item, str):
            if self.tokenizer is None:
                raise EngineFailed("ScriptedEngine: a text item needs a tokenizer")
            ids = list(self.tokenizer.encode(item, add_special_tokens=False))
            if self.end_token_id is not None:
                ids.append(self.end_token_id)
            return ids
        return [int(t) for t in item]

    def _finish(self, ids: list[int], params: SamplingParams) -> Completion:
        end = self.end_token_id
        if end is not None and not params.ignore_eos and end not in params.stop_token_ids:
            params = _with_stop_id(params, end)
        return super()._finish(ids, params)


FaultMode = Literal["raise", "hang", "delay", "break"]


class FaultyEngine(FakeEngine):
    """Wraps an engine (a NullEngine by default) and injects faults.

    ``fault``: ``"raise"`` fails with ``error`` (default EngineFailed) after
    ``delay_s``; ``"hang"`` never returns until :meth:`close` (then
    EngineFailed) — for timeout tests; ``"delay"`` waits ``delay_s`` and then
    answers from ``inner``; ``"break"`` streams the first half of ``inner``'s
    tokens, then fails with EngineFailed (a generate call just fails);
    ``None`` passes every call through. ``on_calls``
    limits the fault to those 0-based call indices. ``fault`` may be changed
    at any time.
    """

    def __init__(
        self,
        inner: Engine | None = None,
        *,
        fault: FaultMode | None = "raise",
        delay_s: float = 0.0,
        on_calls: Iterable[int] | None = None,
        error: BaseException | None = None,
    ):
        super().__init__()
        self.inner = inner if inner is not None else NullEngine()
        self.max_positions = self.inner.max_positions
        self.fault = fault
        self.fault_delay_s = float(delay_s)
        self.on_calls = None if on_calls is None else set(on_calls)
        self.error = error

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        refuse_constraint(self, params)
        async with self.gate.admit():
            index = len(self.calls)
            self.calls.append((list(prompt_ids), params))
            faulty = self.fault is not None and (self.on_calls is None or index in self.on_calls)
            if faulty and self.fault == "hang":
                while not self.gate.closed:
                    await asyncio.sleep(0.02)
                raise EngineFailed("engine closed while the call hung")
            if faulty and self.fault_delay_s:
                await asyncio.sleep(self.fault_delay_s)
            if faulty and self.fault in ("raise", "break"):
                err = self.error or EngineFailed(f"injected fault on call {index}")
                if isinstance(err, EngineError):
                    raise err
                raise EngineFailed(f"injected fault: {err!r}") from err
            return await self.inner.generate(prompt_ids, params)

    async def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        index = len(self.calls)
        if self.fault != "break" or (self.on_calls is not None and index not in self.on_calls):
            async for item in stream_via_generate(self, prompt_ids, params):
                yield item
            return
        async with self.gate.admit():
            self.calls.append((list(prompt_ids), params))
            deltas = deltas_of(await self.inner.generate(prompt_ids, params))
            for delta in deltas[: len(deltas) // 2]:
                yield delta
            if self.fault_delay_s:
                await asyncio.sleep(self.fault_delay_s)
            raise EngineFailed(f"injected fault in the stream of call {index}")

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        async with self.gate.paused_for_update():
            self.weights.append(state_dict)
            return await self.inner.update_weights(state_dict, version=version)

    async def close(self) -> None:
        self.gate.close()
        await self.inner.close()


def _with_stop_id(params: SamplingParams, token_id: int) -> SamplingParams:
    return replace(params, stop_token_ids=(*params.stop_token_ids, token_id))
