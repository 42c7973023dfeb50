"""The agents' routes: OpenAI-compatible chat and completions per rollout, the reward
route, and record mode (``/v1/...`` without a rollout, with a record key).

Each route checks its credentials, parses its body and calls :class:`Gateway`
(prepare the call, then generate or stream it); the response bodies are built in
``render`` and ``sse``, record mode's rollouts in ``_http.record_mode``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from tether.records import RewardSource, RolloutStatus

from ..._core.auth import bearer, check_rollout_id
from ..._core.gateway import Gateway
from ..._errors import EngineDown
from ..._http.deps import (
    body_schema,
    call_role,
    gateway,
    parse,
    request_key,
    rollout_attempt,
)
from ..._http.mount import Route, mount
from ..._http.record_mode import OnEnd
from ..._http.status import ApiError, http_error
from .render import chat_body, completion_body
from .schema import ChatCompletionRequest, CompletionRequest, RewardRequest
from .sse import stream_response

__all__ = ["router"]

router = APIRouter()


async def _chat(
    gw: Gateway, rollout_id: str, attempt: int, request: Request, on_end: OnEnd | None = None
) -> Any:
    """``on_end`` hears how the call ended (for a stream: when the stream ends)."""
    req: ChatCompletionRequest = await parse(request, ChatCompletionRequest)
    ctx = gw.prepare_chat(rollout_id, attempt, req, role=call_role(request))
    top = req.top_logprobs or 0
    if req.stream:
        return await stream_response(
            gw.generate_stream(ctx, tokens=True),
            token_text=gw.token_text,
            model=req.model,
            policy_version=gw.policy_version,
            chat=True,
            logprobs=bool(req.logprobs),
            top_logprobs=top,
            include_usage=bool((req.stream_options or {}).get("include_usage")),
            on_end=on_end,
        )
    choices, _ = await gw.generate(ctx)
    if on_end is not None:
        on_end(RolloutStatus.SUCCEEDED, None)
    body = chat_body(
        gw.token_text,
        req.model,
        len(ctx.prompt_ids),
        choices,
        logprobs=bool(req.logprobs),
        top_logprobs=top,
        policy_version=gw.policy_version,
    )
    return JSONResponse(body)


def _models(name: str) -> dict[str, Any]:
    """The served model, as the ``openai`` and the ``anthropic`` clients both read a model list."""
    model = {"id": name, "object": "model", "created": 0, "owned_by": "tether"}
    model |= {"type": "model", "display_name": name, "created_at": "1970-01-01T00:00:00Z"}
    return {"object": "list", "data": [model], "has_more": False, "first_id": name, "last_id": name}


@router.get("/healthz", tags=["health"])
async def healthz(gw: Gateway = Depends(gateway)) -> Any:
    """200 ``{"status": "ok"}`` while the engine can serve calls; 503 ``{"status": "down"}``
    (no inference server up: calls wait for one) or ``"lost"`` (gone for good: calls fail),
    with ``error`` saying which server went away and why (``Engine.outage``)."""
    outage = await gw.engine.outage()
    if outage is None:
        return {"status": "ok"}
    api = http_error(EngineDown(outage.why))
    assert api is not None
    status = "lost" if outage.lost else "down"
    return JSONResponse({"status": status, "error": api.message}, status_code=api.status)


async def _completions(
    gw: Gateway, rollout_id: str, attempt: int, request: Request, on_end: OnEnd | None = None
) -> Any:
    req: CompletionRequest = await parse(request, CompletionRequest)
    ctx = gw.prepare_completion(rollout_id, attempt, req, role=call_role(request))
    if req.stream:
        return await stream_response(
            gw.generate_stream(ctx, tokens=True),
            token_text=gw.token_text,
            model=req.model,
            policy_version=gw.policy_version,
            chat=False,
            logprobs=req.logprobs,
            include_usage=bool((req.stream_options or {}).get("include_usage")),
        )
    choices, _ = await gw.generate(ctx)
    body = completion_body(
        gw.token_text,
        req.model,
        len(ctx.prompt_ids),
        choices,
        logprobs=req.logprobs,
        policy_version=gw.policy_version,
    )
    return JSONResponse(body)


async def _model_list(gw: Gateway, request: Request) -> dict[str, Any]:
    return _models(gw.config.served_model_name)


def _recorder_or_admin(gw: Gateway, request: Request) -> None:
    token = request_key(request)
    if not (gw.keys.is_recorder(token) or gw.keys.is_admin(token)):
        raise ApiError(401, "missing or invalid key")


mount(
    router,
    (
        Route("/v1/chat/completions", "chat", "openai", call=_chat, body=ChatCompletionRequest),
        Route(
            "/v1/completions", "completions", "openai", call=_completions,
            body=CompletionRequest, record=False,
        ),
        Route(
            "/v1/models", "models", "openai", answer=_model_list, record_name="models",
            record_check=_recorder_or_admin, response_model=dict[str, Any],
        ),
    ),
)  # fmt: skip


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
