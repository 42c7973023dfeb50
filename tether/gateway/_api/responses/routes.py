"""``POST /rollouts/{id}/v1/responses`` (and ``/v1/responses`` in record mode): the
stateless subset of OpenAI's Responses API, served by the chat-completions path.

The body is checked (``schema``), its items mapped to chat messages
(``items``), and the call prepared by :meth:`Gateway.prepare_chat` and
made exactly as a chat completion is made and recorded (same template, same stored
call, plus ``"api": "responses"`` and the Responses fields in the recorded
request). The answer is a ``response`` object or its event stream
(``render``). See docs/responses-api.md.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tether.records import RolloutStatus

from ..._core.deltas import Done
from ..._core.gateway import Gateway
from ..._http.deps import (
    call_role,
    parse,
)
from ..._http.event_stream import event_stream, primed
from ..._http.mount import Route, mount
from ..._http.record_mode import OnEnd
from ..._http.status import ApiError
from ..openai.render import _chat_logprobs, _usage
from ..openai.schema import ChatCompletionRequest
from .items import RESPONSES_PARAM, chat_fields
from .render import (
    ResponseMeta,
    echo,
    events,
    final_status,
    output_items,
    response_body,
)
from .schema import ResponsesRequest

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


def _error_event(err: ApiError, sent: dict[str, Any] | None) -> dict[str, Any]:
    """The Responses API's ``error`` event, numbered after the last event sent."""
    seq = 0 if sent is None else sent["sequence_number"] + 1
    return {"type": "error", "code": None, "message": err.message, "param": None,
            "sequence_number": seq}  # fmt: skip


async def _responses(
    gw: Gateway,
    rollout_id: str,
    attempt: int,
    request: Request,
    on_end: OnEnd | None = None,
) -> Any:
    """``on_end`` hears how the call ended (for a stream: when the stream ends)."""
    req: ResponsesRequest = await parse(request, ResponsesRequest)
    chat = chat_request(req)
    meta = ResponseMeta(echo=echo(req))
    kept = req.model_dump(exclude={"input", "instructions", "tools"}, exclude_none=True)
    recorded = {"api": "responses", "responses": {"id": meta.id, **kept}}

    def final(done: Done) -> dict[str, Any]:
        choice = done.choices[0]
        logprobs = None
        if req.logprobs:
            logprobs = _chat_logprobs(gw.token_text, choice, req.top_logprobs or 0)["content"]
        output = output_items(meta, choice, logprobs)
        usage = _usage(done.prompt_tokens, done.choices)
        return response_body(meta, output, status=final_status(choice), usage=usage)

    ctx = gw.prepare_chat(rollout_id, attempt, chat, recorded, role=call_role(request))
    if req.stream:
        source = gw.generate_stream(ctx)
        deltas = await primed(source)
        return event_stream(
            events(meta, deltas, final), source, on_end,
            last=("response.completed", "response.incomplete"), error_event=_error_event,
        )  # fmt: skip
    choices, _ = await gw.generate(ctx)
    if on_end is not None:
        on_end(RolloutStatus.SUCCEEDED, None)
    return JSONResponse(final(Done(choices, len(ctx.prompt_ids))))


mount(
    router,
    (Route("/v1/responses", "responses", "openai", call=_responses, body=ResponsesRequest),),
)
