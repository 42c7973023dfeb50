"""``POST /rollouts/{id}/v1/responses`` (and ``/v1/responses`` in record mode): the
stateless subset of OpenAI's Responses API, served by the chat-completions path.

The body is checked (``_responses_schema``), its items mapped to chat messages
(``_responses_items``), and the call made by :func:`~._openai_routes.chat_call`
exactly as a chat completion is made and recorded (same template, same stored
call, plus ``"api": "responses"`` and the Responses fields in the recorded
request). The answer is a ``response`` object or its event stream
(``_responses_render``). See docs/responses-api.md.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from ._core import Gateway
from ._deltas import Done, TextDelta, ToolCallDelta
from ._errors import ApiError
from ._http import STREAMED, body_schema, gateway, parse, rollout_attempt
from ._openai_routes import chat_call, recording
from ._render import Choice, _chat_logprobs, _pieces, _usage
from ._responses_items import RESPONSES_PARAM, chat_fields
from ._responses_render import (
    ResponseMeta,
    echo,
    events,
    final_status,
    output_items,
    response_body,
)
from ._responses_schema import ResponsesRequest
from ._schemas import ChatCompletionRequest

__all__ = ["router"]

router = APIRouter()


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The equivalent chat-completions request; its refusals name the Responses field."""
    try:
        return ChatCompletionRequest.model_validate(chat_fields(req))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        param = RESPONSES_PARAM.get(loc[0], loc[0]) if loc else None
        raise ApiError(400, f"{param}: {err.get('msg')}", param=param) from None


async def replayed(
    tokenizer: Any, choices: list[Choice], prompt_tokens: int
) -> AsyncIterator[TextDelta | ToolCallDelta | Done]:
    """The deltas of a finished call: its text token by token, each tool call as its
    name then its arguments, then :class:`Done`. (Until the engine streams tokens, a
    streamed Responses call is generated first and replayed from here.)"""
    for i, c in enumerate(choices):
        texts = _pieces(tokenizer, c) if c.parsed is None else [c.message.get("content") or ""]
        for text in texts:
            if text:
                yield TextDelta(i, text)
        for k, call in enumerate(c.message.get("tool_calls") or []):
            yield ToolCallDelta(i, k, call["id"], call["function"]["name"], "")
            yield ToolCallDelta(i, k, None, None, call["function"]["arguments"])
    yield Done(choices, prompt_tokens)


def _event_stream(stream: AsyncIterator[dict[str, Any]]) -> StreamingResponse:
    async def lines():
        async for e in stream:
            yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

    return StreamingResponse(
        lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _responses(gw: Gateway, rollout_id: str, attempt: int, request: Request) -> Any:
    req: ResponsesRequest = await parse(request, ResponsesRequest)
    chat = chat_request(req)
    meta = ResponseMeta(echo=echo(req))
    kept = req.model_dump(exclude={"input", "instructions", "tools"}, exclude_none=True)
    choices, prompt_ids = await chat_call(
        gw, rollout_id, attempt, chat, {"api": "responses", "responses": {"id": meta.id, **kept}}
    )

    def final(done: Done) -> dict[str, Any]:
        choice = done.choices[0]
        logprobs = None
        if req.logprobs:
            logprobs = _chat_logprobs(gw.tokenizer, choice, req.top_logprobs or 0)["content"]
        output = output_items(meta, choice, logprobs)
        usage = _usage(done.prompt_tokens, done.choices)
        return response_body(meta, output, status=final_status(choice), usage=usage)

    if req.stream:
        return _event_stream(events(meta, replayed(gw.tokenizer, choices, len(prompt_ids)), final))
    return JSONResponse(final(Done(choices, len(prompt_ids))))


@router.post(
    "/rollouts/{rollout_id:rid}/v1/responses",
    tags=["openai"],
    openapi_extra=body_schema(ResponsesRequest),
    responses=STREAMED,
)
async def rollout_responses(
    rollout_id: str,
    request: Request,
    gw: Gateway = Depends(gateway),
    attempt: int = Depends(rollout_attempt),
):
    return await _responses(gw, rollout_id, attempt, request)


@router.post(
    "/v1/responses",
    tags=["record"],
    openapi_extra=body_schema(ResponsesRequest),
    responses=STREAMED,
)
async def record_responses(request: Request, gw: Gateway = Depends(gateway)):
    return await recording(gw, request, _responses)
