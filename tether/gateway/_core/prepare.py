"""The checks of a model call before the engine sees it: caps, sampling, the context.

Pure functions of the request and the gateway's limits; each refusal is an
:class:`~tether.gateway.InvalidRequest` (a 400) naming the field and the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tether.engine import Engine, SamplingParams

from .._config import GatewayConfig
from .._errors import ContextLengthExceeded, InvalidRequest

__all__ = ["UNSET_LENGTH", "check_messages", "context_limit", "fit_context", "sampling_params"]

#: A tokenizer's ``model_max_length`` above this is transformers' "unset" (1e30), not a limit.
UNSET_LENGTH = 10**9


def context_limit(tokenizer: Any, engine: Engine, configured: int | None) -> int | None:
    """The model's context in tokens: the smallest of the tokenizer's ``model_max_length``
    (unless unset), the engine's ``max_positions`` and ``gateway.max_context``; None if
    none is known."""
    limits = [configured, engine.max_positions]
    tok = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok, int | float) and tok <= UNSET_LENGTH:
        limits.append(int(tok))
    known = [int(n) for n in limits if n]
    return min(known) if known else None


def sampling_params(
    cfg: GatewayConfig,
    req: Any,
    *,
    max_tokens: int | None,
    top_logprobs: int,
    override: dict[str, float],
    stop_ids: Sequence[int],
    affinity: str | None = None,
    role: str | None = None,
) -> SamplingParams:
    """Check the caps and build the engine's sampling parameters; ``override`` (the
    rollout's, e.g. greedy evaluation) wins over the request's temperature and top_p;
    ``affinity`` (the rollout id) keeps a rollout's calls on one engine replica;
    ``role`` (named in the call's URL) picks its engine adapter (``role_adapters``)."""
    temperature = override.get("temperature", req.temperature)
    top_p = override.get("top_p", req.top_p)
    if req.n > cfg.max_n:
        raise InvalidRequest(f"n ({req.n}) is above this gateway's cap of {cfg.max_n}", param="n")
    if max_tokens is not None and max_tokens > cfg.max_tokens:
        raise InvalidRequest(
            f"max_tokens ({max_tokens}) is above this gateway's cap of {cfg.max_tokens}",
            param="max_tokens",
        )
    if top_logprobs > cfg.max_top_logprobs:
        raise InvalidRequest(
            f"top_logprobs ({top_logprobs}) is above the cap of {cfg.max_top_logprobs}",
            param="top_logprobs",
        )
    return SamplingParams(
        temperature=1.0 if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        max_tokens=max_tokens or cfg.default_max_tokens,
        n=req.n,
        stop=req.stop_list(),
        stop_token_ids=tuple(stop_ids),
        seed=req.seed,
        top_logprobs=top_logprobs,
        affinity=affinity,
        adapter=cfg.role_adapters.get(role) if role is not None else None,
    )


def check_messages(cfg: GatewayConfig, messages: list[dict], tools: list[dict] | None) -> None:
    if not messages:
        raise InvalidRequest("messages must not be empty", param="messages")
    if len(messages) > cfg.max_messages:
        raise InvalidRequest(
            f"{len(messages)} messages is above the cap of {cfg.max_messages}", param="messages"
        )
    if tools and len(tools) > cfg.max_tools:
        raise InvalidRequest(
            f"{len(tools)} tools is above the cap of {cfg.max_tools}", param="tools"
        )


def fit_context(
    prompt_len: int, params: SamplingParams, limit: int | None, *, asked: bool, param: str
) -> SamplingParams:
    """``params`` for a prompt of ``prompt_len`` tokens within a context of ``limit``.

    The prompt must leave room for one token; with ``max_tokens`` asked for, the prompt and
    it must fit (OpenAI's and vLLM's rule, the same error code); the default
    ``max_tokens`` is cut to what the context leaves (as vLLM does).
    """
    if not prompt_len:
        raise InvalidRequest("the prompt is empty", param=param)
    if limit is None or prompt_len + params.max_tokens <= limit:
        return params
    if prompt_len >= limit:
        raise ContextLengthExceeded(
            f"the prompt ({prompt_len} tokens) exceeds the model's context of {limit} tokens; "
            "shorten the conversation",
            param=param,
        )
    if asked:
        raise ContextLengthExceeded(
            f"prompt ({prompt_len} tokens) + max_tokens ({params.max_tokens}) exceeds the "
            f"model's context of {limit} tokens; shorten the conversation or lower max_tokens",
            param=param,
        )
    return replace(params, max_tokens=limit - prompt_len)
