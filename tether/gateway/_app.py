"""The ASGI app: OpenAI-compatible routes per rollout, the reward route, record mode, admin.

Order of checks on every route: rollout id shape (400) → credentials
(401/403) → body size (413) → body shape and caps (400) → engine. A request
that fails a check never reaches the engine and changes nothing stored.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.convertors import Convertor, register_url_convertor

from tether.records import Reward, RewardSource, RolloutStatus

from ._auth import bearer, check_rollout_id, check_rollout_token
from ._core import Gateway
from ._errors import ApiError, install_handlers
from ._openapi import install_openapi
from ._render import chat_body, chat_chunks, completion_body
from ._schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    CreateRolloutRequest,
    FinishRolloutRequest,
    RewardRequest,
)
from ._views import call_view, rollout_view

__all__ = ["create_app"]

log = logging.getLogger(__name__)


class _AnyRolloutId(Convertor):
    """Matches any text, "/", CR, LF and NUL included, so that every bad id
    reaches :func:`check_rollout_id` (a 400) instead of missing the route (404)."""

    regex = r"[\s\S]+?"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("rid", _AnyRolloutId())


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")
                }
            },
        }
    }


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is above the cap of {limit} bytes")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"request body is above the cap of {limit} bytes")
        parts.append(part)
    return b"".join(parts)


async def _parse(request: Request, model: type[BaseModel], limit: int) -> Any:
    body = await _read_body(request, limit)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err.get("loc", ())) or None
        if err.get("type") == "extra_forbidden":
            raise ApiError(
                400,
                f"unsupported field '{param}': tether does not implement it; remove it",
                param=param,
            ) from None
        raise ApiError(
            400, f"{param}: {err.get('msg')}" if param else str(err.get("msg")), param=param
        ) from None


def _sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


def create_app(gw: Gateway) -> FastAPI:
    """Build the FastAPI app over a :class:`Gateway`."""
    app = FastAPI(
        title="tether gateway", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.gateway = gw
    install_handlers(app)
    install_openapi(app)
    cfg = gw.config

    def rollout_attempt(rollout_id: str, request: Request) -> int:
        check_rollout_id(rollout_id)
        auth = gw.store.rollout_auth(rollout_id)
        attempt = check_rollout_token(
            bearer(request.headers.get("authorization")), auth, gw.keys, gw.store.token_in_use
        )
        if auth is not None and auth[0] is RolloutStatus.QUEUED:  # the agent is evidently running
            gw.mark_running(rollout_id, attempt)
        return attempt

    def admin(request: Request) -> None:
        gw.keys.require_admin(bearer(request.headers.get("authorization")))

    async def chat(rollout_id: str, attempt: int, request: Request) -> Any:
        req: ChatCompletionRequest = await _parse(
            request, ChatCompletionRequest, cfg.max_body_bytes
        )
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        params = gw.sampling_params(
            req,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            top_logprobs=top,
            rollout_id=rollout_id,
        )
        prompt_ids = gw.render(req.messages, req.tools)
        gw.check_prompt(prompt_ids, params)
        record = {
            "messages": req.messages,
            "tools": req.tools,
            "params": req.model_dump(exclude={"messages", "tools"}, exclude_none=True),
        }
        choices, _ = await gw.generate(
            rollout_id,
            attempt,
            prompt_ids,
            params,
            record,
            parse_tools=bool(req.tools) and req.tool_choice != "none",
            max_tool_calls=1 if req.parallel_tool_calls is False else None,
        )
        body = chat_body(
            gw.tokenizer,
            req.model,
            len(prompt_ids),
            choices,
            logprobs=bool(req.logprobs),
            top_logprobs=top,
            policy_version=gw.engine.policy_version,
        )
        if req.stream:
            include_usage = bool((req.stream_options or {}).get("include_usage"))
            return _sse(chat_chunks(gw.tokenizer, body, choices, include_usage=include_usage))
        return JSONResponse(body)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> dict[str, Any]:
        admin(request)
        return app.openapi()

    @app.post(
        "/rollouts/{rollout_id:rid}/v1/chat/completions",
        tags=["openai"],
        openapi_extra=_body_schema(ChatCompletionRequest),
    )
    async def rollout_chat(rollout_id: str, request: Request):
        return await chat(rollout_id, rollout_attempt(rollout_id, request), request)

    @app.post(
        "/rollouts/{rollout_id:rid}/v1/completions",
        tags=["openai"],
        openapi_extra=_body_schema(CompletionRequest),
    )
    async def rollout_completions(rollout_id: str, request: Request):
        attempt = rollout_attempt(rollout_id, request)
        req: CompletionRequest = await _parse(request, CompletionRequest, cfg.max_body_bytes)
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
        record = {
            "prompt": req.prompt,
            "params": req.model_dump(exclude={"prompt"}, exclude_none=True),
        }
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
        if req.stream:
            base = {k: body[k] for k in ("id", "object", "created", "model")}
            return _sse([{**base, "choices": [c]} for c in body["choices"]])
        return JSONResponse(body)

    @app.get("/rollouts/{rollout_id:rid}/v1/models", tags=["openai"])
    async def rollout_models(rollout_id: str, request: Request) -> dict[str, Any]:
        rollout_attempt(rollout_id, request)
        return _models(cfg.served_model_name)

    @app.post(
        "/rollouts/{rollout_id:rid}/reward",
        tags=["rollouts"],
        openapi_extra=_body_schema(RewardRequest),
    )
    async def rollout_reward(rollout_id: str, request: Request) -> dict[str, Any]:
        check_rollout_id(rollout_id)
        token = bearer(request.headers.get("authorization"))
        if gw.keys.is_admin(token):
            req: RewardRequest = await _parse(request, RewardRequest, cfg.max_body_bytes)
            auth = gw.store.rollout_auth(rollout_id)
            if auth is None:
                raise ApiError(404, f"no rollout {rollout_id!r}")
            gw.store.record_reward(
                Reward(
                    rollout_id=rollout_id,
                    value=req.value,
                    source=RewardSource.ADMIN,
                    attempt=auth[1],
                    call_seq=req.call_seq,
                )
            )
            return {"ok": True}
        attempt = rollout_attempt(rollout_id, request)
        req = await _parse(request, RewardRequest, cfg.max_body_bytes)
        gw.record_agent_reward(rollout_id, attempt, req.value, req.call_seq)
        return {"ok": True}

    @app.post(
        "/v1/chat/completions", tags=["record"], openapi_extra=_body_schema(ChatCompletionRequest)
    )
    async def record_chat(request: Request):
        token = bearer(request.headers.get("authorization"))
        if token is None:
            raise ApiError(401, "missing bearer token: record mode needs a record key")
        if not gw.keys.is_recorder(token):
            raise ApiError(
                401,
                "invalid key for record mode (tether serve --record-key KEY, or gateway.record_keys)",
            )
        opened = gw.open_rollout({}, run_id=None)
        try:
            return await chat(opened.rollout_id, opened.attempt, request)
        finally:
            gw.finish_rollout(opened.rollout_id, RolloutStatus.SUCCEEDED, attempt=opened.attempt)

    @app.get("/v1/models", tags=["record"])
    async def models(request: Request) -> dict[str, Any]:
        token = bearer(request.headers.get("authorization"))
        if not (gw.keys.is_recorder(token) or gw.keys.is_admin(token)):
            raise ApiError(401, "missing or invalid key")
        return _models(cfg.served_model_name)

    # -- admin ----------------------------------------------------------------

    @app.post(
        "/admin/rollouts",
        tags=["admin"],
        status_code=201,
        openapi_extra=_body_schema(CreateRolloutRequest),
    )
    async def create_rollout(request: Request) -> JSONResponse:
        admin(request)
        req: CreateRolloutRequest = await _parse(request, CreateRolloutRequest, cfg.max_body_bytes)
        opened = gw.open_rollout(
            req.task,
            rollout_id=req.rollout_id,
            run_id=req.run_id,
            group_id=req.group_id,
            task_id=req.task_id,
        )
        return JSONResponse(opened.as_json(), status_code=201)

    @app.get("/admin/rollouts", tags=["admin"])
    async def list_rollouts(
        request: Request,
        run_id: str | None = None,
        status: str | None = None,
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        admin(request)
        try:
            st = RolloutStatus(status) if status else None
        except ValueError:
            raise ApiError(400, f"unknown status {status!r}", param="status") from None
        rows = gw.store.list_rollouts(run_id=run_id, status=st, limit=limit)
        return {"data": [rollout_view(r) for r in rows]}

    @app.get("/admin/rollouts/{rollout_id:rid}", tags=["admin"])
    async def get_rollout(rollout_id: str, request: Request) -> dict[str, Any]:
        admin(request)
        check_rollout_id(rollout_id)
        rollout = gw.store.get_rollout(rollout_id)
        if rollout is None:
            raise ApiError(404, f"no rollout {rollout_id!r}")
        return {
            **rollout_view(rollout),
            "calls": [call_view(c) for c in gw.store.calls(rollout_id)],
        }

    @app.post(
        "/admin/rollouts/{rollout_id:rid}/finish",
        tags=["admin"],
        openapi_extra=_body_schema(FinishRolloutRequest),
    )
    async def finish(rollout_id: str, request: Request) -> dict[str, Any]:
        admin(request)
        check_rollout_id(rollout_id)
        req: FinishRolloutRequest = await _parse(request, FinishRolloutRequest, cfg.max_body_bytes)
        if gw.store.rollout_auth(rollout_id) is None:
            raise ApiError(404, f"no rollout {rollout_id!r}")
        rollout = gw.finish_rollout(
            rollout_id,
            RolloutStatus(req.status),
            reward=req.reward,
            source=RewardSource.ADMIN,
            final_answer=req.final_answer,
            error=req.error,
        )
        return rollout_view(rollout)

    @app.post("/admin/pause", tags=["admin"])
    async def pause(request: Request) -> dict[str, Any]:
        admin(request)
        await gw.pause()
        return gw.admission_state()

    @app.post("/admin/resume", tags=["admin"])
    async def resume(request: Request) -> dict[str, Any]:
        admin(request)
        gw.resume()
        return gw.admission_state()

    @app.get("/admin/state", tags=["admin"])
    async def state(request: Request) -> dict[str, Any]:
        admin(request)
        return gw.admission_state()

    return app


def _models(name: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": "tether"}],
    }
