"""The agents' routes: OpenAI-compatible chat and completions per rollout, the reward
route, and record mode (``/v1/...`` without a rollout, with a record key).

Each route checks its credentials, parses its body and calls :class:`Gateway`;
the response bodies are built in ``_render``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from tether.engine import SamplingParams
from tether.records import RewardSource, RolloutStatus

from ._auth import bearer, check_rollout_id
from ._constrain import constrain, constraint_for
from ._core import Gateway
from ._errors import ApiError
from ._http import STREAMED, body_schema, gateway, parse, rollout_attempt
from ._render import Choice, chat_body, completion_body
from ._schemas import ChatCompletionRequest, CompletionRequest, RewardRequest
from ._sse import stream_response

__all__ = ["ChatCall", "chat_call", "recording", "router"]

router = APIRouter()

OnEnd = Callable[[], None] | None


@dataclass
class ChatCall:
    """A chat-shaped call made ready: sampling, constraint, prompt and what is recorded."""

    params: SamplingParams
    prompt_ids: list[int]
    record: dict[str, Any]
    parse_tools: bool
    max_tool_calls: int | None


def prepare_chat(
    gw: Gateway,
    rollout_id: str,
    attempt: int,
    req: ChatCompletionRequest,
    recorded: dict[str, Any] | None = None,
) -> ChatCall:
    """Check and render one chat-shaped call (nothing is generated or stored yet).

    Shared by chat completions and the Responses API (``_responses``), which maps its
    items, tools and ``text.format`` onto a :class:`ChatCompletionRequest` first;
    ``recorded`` adds keys to the call's recorded request.
    """
    top = req.top_logprobs or 0
    if top and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    params = gw.sampling_params(
        req,
        max_tokens=req.max_completion_tokens or req.max_tokens,
        top_logprobs=top,
        rollout_id=rollout_id,
    )
    constraint = constraint_for(
        response_format=req.response_format,
        tools=req.tools,
        tool_choice=req.tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        tool_parser=gw.config.tool_parser,
    )
    params = constrain(gw.engine, params, constraint)
    prompt_ids = gw.render(req.messages, req.tools, conversation=(rollout_id, attempt))
    gw.check_prompt(prompt_ids, params)
    record = {
        "messages": req.messages,
        "tools": req.tools,
        "params": req.model_dump(exclude={"messages", "tools"}, exclude_none=True),
        **(recorded or {}),
    }
    return ChatCall(
        params,
        prompt_ids,
        record,
        parse_tools=bool(req.tools) and req.tool_choice != "none",
        max_tool_calls=1 if req.parallel_tool_calls is False else None,
    )


async def chat_call(
    gw: Gateway,
    rollout_id: str,
    attempt: int,
    req: ChatCompletionRequest,
    recorded: dict[str, Any] | None = None,
) -> tuple[list[Choice], list[int]]:
    """One chat-shaped model call, recorded: the choices and the prompt ids."""
    call = prepare_chat(gw, rollout_id, attempt, req, recorded)
    choices, _ = await gw.generate(
        rollout_id, attempt, call.prompt_ids, call.params, call.record,
        parse_tools=call.parse_tools, max_tool_calls=call.max_tool_calls,
    )  # fmt: skip
    return choices, call.prompt_ids


def chat_stream(gw: Gateway, rollout_id: str, attempt: int, call: ChatCall, *, tokens: bool):
    """The call of :func:`prepare_chat`, streamed (``Gateway.generate_stream``)."""
    return gw.generate_stream(
        rollout_id, attempt, call.prompt_ids, call.params, call.record,
        parse_tools=call.parse_tools, max_tool_calls=call.max_tool_calls, tokens=tokens,
    )  # fmt: skip


async def _chat(
    gw: Gateway, rollout_id: str, attempt: int, request: Request, on_end: OnEnd = None
) -> Any:
    """``on_end`` runs when the call is over (for a stream: when the stream ends)."""
    req: ChatCompletionRequest = await parse(request, ChatCompletionRequest)
    top = req.top_logprobs or 0
    if req.stream:
        call = prepare_chat(gw, rollout_id, attempt, req)
        return await stream_response(
            chat_stream(gw, rollout_id, attempt, call, tokens=True),
            tokenizer=gw.tokenizer,
            model=req.model,
            policy_version=gw.engine.policy_version,
            chat=True,
            logprobs=bool(req.logprobs),
            top_logprobs=top,
            include_usage=bool((req.stream_options or {}).get("include_usage")),
            on_end=on_end,
        )
    try:
        choices, prompt_ids = await chat_call(gw, rollout_id, attempt, req)
    finally:
        if on_end is not None:
            on_end()
    body = chat_body(
        gw.tokenizer,
        req.model,
        len(prompt_ids),
        choices,
        logprobs=bool(req.logprobs),
        top_logprobs=top,
        policy_version=gw.engine.policy_version,
    )
    return JSONResponse(body)


def _models(name: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "tether"}],
    }


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.post(
    "/rollouts/{rollout_id:rid}/v1/chat/completions",
    tags=["openai"],
    openapi_extra=body_schema(ChatCompletionRequest),
    responses=STREAMED,
)
async def rollout_chat(
    rollout_id: str,
    request: Request,
    gw: Gateway = Depends(gateway),
    attempt: int = Depends(rollout_attempt),
):
    return await _chat(gw, rollout_id, attempt, request)


@router.post(
    "/rollouts/{rollout_id:rid}/v1/completions",
    tags=["openai"],
    openapi_extra=body_schema(CompletionRequest),
    responses=STREAMED,
)
async def rollout_completions(
    rollout_id: str,
    request: Request,
    gw: Gateway = Depends(gateway),
    attempt: int = Depends(rollout_attempt),
):
    req: CompletionRequest = await parse(request, CompletionRequest)
    top = req.logprobs or 0
    params = gw.sampling_params(
        req, max_tokens=req.max_tokens, top_logprobs=top, rollout_id=rollout_id
    )
    if isinstance(req.prompt, str):
        prompt_ids = gw.tokenizer.encode(req.prompt, add_special_tokens=False)
    else:
        vocab = len(gw.tokenizer)
        if any(not 0 <= t < vocab for t in req.prompt):
            raise ApiError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        prompt_ids = list(req.prompt)
    gw.check_prompt(prompt_ids, params)
    record = {"prompt": req.prompt, "params": req.model_dump(exclude={"prompt"}, exclude_none=True)}
    if req.stream:
        return await stream_response(
            gw.generate_stream(
                rollout_id, attempt, prompt_ids, params, record, parse_tools=False, tokens=True
            ),
            tokenizer=gw.tokenizer,
            model=req.model,
            policy_version=gw.engine.policy_version,
            chat=False,
            logprobs=req.logprobs,
            include_usage=bool((req.stream_options or {}).get("include_usage")),
        )
    choices, _ = await gw.generate(
        rollout_id, attempt, prompt_ids, params, record, parse_tools=False
    )
    body = completion_body(
        gw.tokenizer,
        req.model,
        len(prompt_ids),
        choices,
        logprobs=req.logprobs,
        policy_version=gw.engine.policy_version,
    )
    return JSONResponse(body)


@router.get("/rollouts/{rollout_id:rid}/v1/models", tags=["openai"])
async def rollout_models(
    gw: Gateway = Depends(gateway), _: int = Depends(rollout_attempt)
) -> dict[str, Any]:
    return _models(gw.config.served_model_name)


@router.post(
    "/rollouts/{rollout_id:rid}/reward", tags=["rollouts"], openapi_extra=body_schema(RewardRequest)
)
async def rollout_reward(
    rollout_id: str, request: Request, gw: Gateway = Depends(gateway)
) -> dict[str, Any]:
    """The agent's reward with its rollout token, or the admin's with the admin key."""
    check_rollout_id(rollout_id)
    if gw.keys.is_admin(bearer(request.headers.get("authorization"))):
        req: RewardRequest = await parse(request, RewardRequest)
        gw.record_reward(rollout_id, req.value, call_seq=req.call_seq, source=RewardSource.ADMIN)
        return {"ok": True}
    attempt = rollout_attempt(rollout_id, request)
    req = await parse(request, RewardRequest)
    gw.record_reward(rollout_id, req.value, call_seq=req.call_seq, attempt=attempt)
    return {"ok": True}


@router.post(
    "/v1/chat/completions",
    tags=["record"],
    openapi_extra=body_schema(ChatCompletionRequest),
    responses=STREAMED,
)
async def record_chat(request: Request, gw: Gateway = Depends(gateway)):
    return await recording(gw, request, _chat)


async def recording(gw: Gateway, request: Request, handler: Any) -> Any:
    """Record mode: check the record key, answer with ``handler`` in a rollout of its own."""
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise ApiError(401, "missing bearer token: record mode needs a record key")
    if not gw.keys.is_recorder(token):
        raise ApiError(
            401,
            "invalid key for record mode (tether serve --record-key KEY, or gateway.record_keys)",
        )
    opened = gw.open_rollout({}, run_id=None)
    ended = []

    def finish() -> None:  # once: when the answer (or the stream) is over, or failed
        if not ended:
            ended.append(True)
            gw.finish_rollout(opened.rollout_id, RolloutStatus.SUCCEEDED, attempt=opened.attempt)

    try:
        return await handler(gw, opened.rollout_id, opened.attempt, request, on_end=finish)
    except BaseException:
        finish()
        raise


@router.get("/v1/models", tags=["record"])
async def models(request: Request, gw: Gateway = Depends(gateway)) -> dict[str, Any]:
    token = bearer(request.headers.get("authorization"))
    if not (gw.keys.is_recorder(token) or gw.keys.is_admin(token)):
        raise ApiError(401, "missing or invalid key")
    return _models(gw.config.served_model_name)
