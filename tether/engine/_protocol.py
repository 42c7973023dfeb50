"""The engine contract: token ids in, token ids and logprobs out.

The gateway owns tokenization; an engine never sees text except to check
stop strings. Every engine subclasses :class:`Engine`: the embedded transformers
engine, the remote engine over vLLM or SGLang servers
(:class:`~tether.engine.RemoteEngine`, docs/engines.md) and the fake engines for
tests (:mod:`tether.engine.testing`). What an engine can do (a context length,
grammars, named adapters, the weights it takes, streaming) is declared there with a
default, and callers read it plainly; so is its admission gate (:attr:`Engine.gate`),
the one gate a model call passes.
"""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tether.errors import TetherError

if TYPE_CHECKING:
    from tether.engine._constraint import Constraint
    from tether.engine._gate import AdmissionGate
    from tether.engine._stream import TokenDelta
    from tether.engine._weight_push import WeightPush

__all__ = [
    "BASE_ADAPTER",
    "Completion",
    "Engine",
    "EngineError",
    "EngineFailed",
    "EngineLost",
    "EngineTimeout",
    "EngineUnreachable",
    "GenerateResult",
    "Outage",
    "SamplingParams",
    "UnsupportedParams",
]


class EngineError(TetherError):
    """Base of the engine's errors.

    EngineError
    ├── EngineFailed       the engine raised or died (transport / model fault)
    │   ├── EngineUnreachable  a remote server could not be reached (retried elsewhere)
    │   └── EngineLost     the engine will serve no call any more (see :class:`Outage`)
    ├── EngineTimeout      no result within the deadline
    └── UnsupportedParams  a request the engine cannot serve exactly (checked first)
    """


class EngineFailed(EngineError):
    pass


class EngineUnreachable(EngineFailed):
    """A remote engine's server could not be reached (a replica down): an infrastructure
    fault, so the run retries the rollout's attempt, which then runs on another replica."""


class EngineLost(EngineFailed):
    """The engine is gone for good (:attr:`Outage.lost`): every remote server has been
    unreachable for the engine's grace period, or the embedded engine's worker thread died.
    Calls fail with it at once; a training run stops on it (nothing is retried)."""


class EngineTimeout(EngineError):
    pass


@dataclass(frozen=True)
class Outage:
    """Why an engine cannot serve a call now (:meth:`Engine.outage`).

    ``why`` is one line naming what went away and, where it could be read, the cause:
    ``the vLLM server at http://h:8000 went away (cannot reach it: connection refused)``.
    ``lost`` is False while the engine may still come back by itself (a remote server
    that is down, within the grace period its health checks wait for it), True once it
    will not: then calls fail with :class:`EngineLost` and a run stops. ``fix`` says what
    the user does about it (``restart it``).
    """

    why: str
    lost: bool
    fix: str

    def error(self) -> EngineLost:
        """The error calls fail with once the engine is lost."""
        return EngineLost(f"{self.why}; {self.fix}")


class UnsupportedParams(EngineError):
    """Sampling parameters this engine cannot serve with exact logprobs; ``param`` names
    the request field. Raised by an engine's ``check_params`` before anything runs."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


#: ``SamplingParams.adapter`` of a call served by the base weights alone (a frozen role).
BASE_ADAPTER = "base"


@dataclass(frozen=True)
class SamplingParams:
    """What an OpenAI request asks of the sampler.

    ``temperature == 0`` means greedy. ``stop`` are strings: generation ends
    when the decoded completion contains one; the returned ids then end with
    the token that completed the stop string (the gateway trims the text).
    ``stop_token_ids`` end generation on those ids, in addition to the
    engine's end-of-turn ids (the tokenizer's eos and ``<|im_end|>``) unless
    ``ignore_eos`` is set (then only ``stop_token_ids`` stop it; benchmarks
    use this for fixed-length generations). The stop token is included in
    ``token_ids`` and has a logprob, because the model produced it and the
    trainer must learn it.

    ``constraint`` (a :class:`~tether.engine.Constraint`) restricts every sampled
    token to those its grammar allows; the row stops when the grammar is complete
    (with the end-of-turn token). The logprobs stay the model's unconstrained ones
    (see :class:`Completion`). An engine that cannot honour it raises
    :class:`~tether.engine.UnsupportedConstraint`.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    ignore_eos: bool = False
    constraint: Constraint | None = None
    #: Which conversation the call belongs to (the gateway sets the rollout id): an
    #: engine with several replicas keeps one conversation's calls on one replica, where
    #: its prefix is cached. Sampling does not depend on it.
    affinity: str | None = None
    #: The LoRA adapter that serves the call (an agent role's, set by the gateway from
    #: the run's roles): None the default policy, :data:`BASE_ADAPTER` the base weights
    #: without any adapter (a frozen role). Only the embedded engine built with adapters
    #: serves a name (``TransformersEngine(adapters=...)``); the others refuse one.
    adapter: str | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature ({self.temperature}) must be a finite number >= 0")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p ({self.top_p}) must be in (0, 1]")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be >= 1")
        if self.n < 1:
            raise ValueError(f"n ({self.n}) must be >= 1")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs ({self.top_logprobs}) must be >= 0")
        if isinstance(self.stop, str) or isinstance(self.stop_token_ids, int):
            raise ValueError("stop and stop_token_ids must be sequences (of strings / of ints)")
        object.__setattr__(self, "stop", tuple(self.stop))  # lists are accepted
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass
class Completion:
    """One sampled continuation.

    ``logprobs[i]`` is ``log_softmax(logits / T)[token_ids[i]]`` (T = 1 when
    greedy), before top-p truncation — the quantity the trainer recomputes.
    ``finish_reason`` is ``"stop"`` (stop token or string) or ``"length"``.
    ``top_logprobs[i]`` maps token id → logprob for the k most likely tokens
    when ``SamplingParams.top_logprobs > 0``.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    top_logprobs: list[dict[int, float]] | None = None


@dataclass
class GenerateResult:
    completions: list[Completion]
    policy_version: int  # the weights that produced every completion here
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Engine(Protocol):
    """An inference engine. All methods are safe to call concurrently.

    Besides the calls, an engine declares what it can do; tether's engines subclass
    :class:`Engine` and inherit the defaults below (a plain model's engine that serves
    no grammar, no named adapter, full weights, streams through :meth:`generate`), and
    override what they offer. Callers read these, never probe for them.
    """

    #: The most tokens (prompt + completion) the model takes, or None when unknown.
    max_positions: int | None = None
    #: Whether the engine honours ``SamplingParams.constraint`` (a grammar); the gateway
    #: refuses a constrained request before the call when it does not.
    supports_constraints: bool = False
    #: The LoRA adapters served by name (``SamplingParams.adapter``, agent roles); empty
    #: for a plain model. When not empty, :meth:`update_weights` takes
    #: ``{adapter name: its peft state dict}``.
    adapters: frozenset[str] = frozenset()

    @cached_property
    def gate(self) -> AdmissionGate:
        """The engine's admission gate, the only one a model call passes: the engine admits
        its generations through it and pauses it around a weight update; the gateway admits
        the agents' calls through it (with its admission timeout) and pauses it for a
        training step. By default a gate of the engine's own, made on first use."""
        from tether.engine._gate import AdmissionGate  # _gate imports this module

        return AdmissionGate()

    @property
    def policy_version(self) -> int:
        """Version of the weights now served; starts at 0, +1 per update."""
        ...

    def check_params(self, params: SamplingParams) -> None:
        """Raise :class:`UnsupportedParams` for sampling parameters the engine cannot serve
        with exact logprobs (vLLM's ``top_p``); the gateway asks before the call is admitted
        and answers 400. By default every ``params`` is served."""
        return None

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerateResult:
        """Sample ``params.n`` completions of ``prompt_ids``.

        Concurrent calls are batched together. Raises :class:`EngineError`.
        """
        ...

    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncGenerator[TokenDelta | GenerateResult, None]:
        """Like :meth:`generate`, token by token: a :class:`~tether.engine.TokenDelta` per
        sampled token as it is sampled, then the :class:`GenerateResult`.

        Closing the iterator early cancels the request (see ``tether.engine._stream``).
        By default :meth:`generate`'s tokens all come at the end
        (:func:`~tether.engine.stream_via_generate`).
        """
        from tether.engine._stream import stream_via_generate  # _stream imports this module

        return stream_via_generate(self, prompt_ids, params)

    async def pause(self) -> None:
        """Stop starting new generations; returns when none is in flight."""
        ...

    async def resume(self) -> None:
        """Start generating again."""
        ...

    async def update_weights(
        self, state_dict: dict[str, Any], *, version: int | None = None
    ) -> int:
        """Load new weights (pausing around the swap) and return the new policy version.

        The version rises by one, or becomes ``version`` when given (a run resumed from a
        checkpoint continues at the checkpoint's version).
        """
        ...

    @property
    def weight_push(self) -> WeightPush:
        """How a run pushes the trainer's weights here (``_weight_push.py``): by default
        the full weights through :meth:`update_weights`; an engine that takes an adapter
        (:class:`~tether.engine.AdapterPush`) or one per role
        (:class:`~tether.engine.RoleAdaptersPush`) provides that instead."""
        from tether.engine._weight_push import WeightPush

        return WeightPush(self)

    async def outage(self) -> Outage | None:
        """None while the engine can serve calls; else why it cannot (:class:`Outage`): no
        remote server is up, the worker thread died. Cheap: the engine's own health state
        (a remote engine's health checks keep it), asked by the run every second and by
        the gateway's ``/healthz``. A closed engine has no outage."""
        ...

    async def close(self) -> None: ...
