"""``POST /rollouts/{id}/v1/messages`` (and ``/v1/messages`` in record mode), and
``…/v1/messages/count_tokens``: Anthropic's Messages API, served by the chat-completions path.

The rollout's base URL without its ``/v1`` is the Anthropic base URL (the SDK adds
``/v1/messages``). The key comes as ``x-api-key`` (``ANTHROPIC_API_KEY``) or as a
bearer token (``ANTHROPIC_AUTH_TOKEN``); ``anthropic-version`` / ``anthropic-beta``
headers are accepted and read by nothing.

The body is checked (``schema``), its blocks mapped to chat messages
(``items``), and the call prepared by :meth:`Gateway.prepare_chat` and made
exactly as a chat completion is made and recorded (same template, same stored call,
plus ``"api": "messages"`` and the Messages fields in the recorded request).
``max_tokens`` is an upper bound (lowered to ``gateway.max_tokens`` and to what the
context leaves). The answer is a ``message`` object or its event stream
(``render``); errors have Anthropic's shape (``_http.deps``). See docs/anthropic.md.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from tether.chat import decode_completion
from tether.records import RolloutStatus

from ..._core.choices import Choice
from ..._core.context import CallContext
from ..._core.deltas import Done
from ..._core.gateway import Gateway
from ..._http.deps import (
    call_role,
    parse,
)
from ..._http.event_stream import event_stream, primed
from ..._http.mount import Route, mount
from ..._http.record_mode import OnEnd
from ..._http.status import ApiError, anthropic_error_body
from ..openai.schema import ChatCompletionRequest
from .items import ANTHROPIC_PARAM, chat_fields
from .render import MessageMeta, content_blocks, events, message_body, stop_reason
from .schema import CountTokensRequest, MessagesRequest

__all__ = ["router"]


router = APIRouter()


class _CountRequest(BaseModel):
    """What a token count needs of the equivalent chat request."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


def chat_request(req: MessagesRequest | CountTokensRequest) -> Any:
    """The equivalent chat request; its refusals name the Messages field."""
    model = ChatCompletionRequest if isinstance(req, MessagesRequest) else _CountRequest
    fields = chat_fields(req)
    if model is _CountRequest:
        fields = {"messages": fields["messages"], "tools": fields.get("tools")}
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ())]
        param = ANTHROPIC_PARAM.get(loc[0], loc[0]) if loc else None
        raise ApiError(400, f"{param}: {err.get('msg')}", param=param) from None


def _stop_sequence(gw: Gateway, ctx: CallContext, choice: Choice) -> str | None:
    """The stop sequence that ended ``choice``, or None (ended otherwise)."""
    stops = ctx.params.stop
    if choice.finish_reason != "stop" or not stops:
        return None
    text = decode_completion(
        gw.tokenizer, choice.token_ids, stop_token_ids=ctx.params.stop_token_ids
    )
    found = [(i, s) for s in stops if (i := text.find(s)) >= 0]
    return min(found)[1] if found else None


async def _messages(
    gw: Gateway,
    rollout_id: str,
    attempt: int,
    request: Request,
    on_end: OnEnd | None = None,
) -> Any:
    """``on_end`` hears how the call ended (for a stream: when the stream ends)."""
    req: MessagesRequest = await parse(request, MessagesRequest)
    chat = chat_request(req)
    meta = MessageMeta(model=req.model)
    kept = req.model_dump(exclude={"messages", "system", "tools"}, exclude_none=True)
    recorded = {"api": "messages", "anthropic": {"id": meta.id, **kept}}
    ctx = gw.prepare_chat(
        rollout_id, attempt, chat, recorded, ceiling=True, role=call_role(request)
    )
    meta.input_tokens = len(ctx.prompt_ids)

    def final(done: Done) -> dict[str, Any]:
        choice = done.choices[0]
        stop = _stop_sequence(gw, ctx, choice)
        return message_body(
            meta,
            content_blocks(choice),
            stop_reason=stop_reason(choice, stop),
            stop_sequence=stop,
            output_tokens=len(choice.token_ids),
        )

    if req.stream:
        source = gw.generate_stream(ctx)
        deltas = await primed(source)
        return event_stream(
            events(meta, deltas, final), source, on_end, last=("message_stop",),
            error_event=lambda err, _sent: anthropic_error_body(err.status, err.message),
        )  # fmt: skip
    choices, _ = await gw.generate(ctx)
    if on_end is not None:
        on_end(RolloutStatus.SUCCEEDED, None)
    return JSONResponse(final(Done(choices, len(ctx.prompt_ids))))


async def _count(gw: Gateway, request: Request) -> dict[str, int]:
    req: CountTokensRequest = await parse(request, CountTokensRequest)
    return {"input_tokens": gw.prompt_tokens(chat_request(req))}


mount(
    router,
    (
        Route("/v1/messages", "messages", "anthropic", call=_messages, body=MessagesRequest),
        Route(
            "/v1/messages/count_tokens", "count_tokens", "anthropic", answer=_count,
            body=CountTokensRequest, response_model=dict[str, int],
        ),
    ),
)  # fmt: skip
