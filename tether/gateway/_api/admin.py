"""The admin routes (admin key): rollouts for agents started elsewhere, reading
rollouts and calls, finishing one, pause / resume / state, the OpenAPI schema.

The admin key is checked once, as a dependency of the whole router.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from tether.records import AttemptEnd, RewardSource, RolloutStatus

from .._core.auth import check_rollout_id
from .._core.gateway import Gateway
from .._http.deps import body_schema, gateway, parse, require_admin
from .openai.schema import CreateRolloutRequest, FinishRolloutRequest
from .views import call_view, rollout_view

__all__ = ["router"]

router = APIRouter(dependencies=[Depends(require_admin)])


@router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> dict[str, Any]:
    return request.app.openapi()


@router.post(
    "/admin/rollouts",
    tags=["admin"],
    status_code=201,
    openapi_extra=body_schema(CreateRolloutRequest),
)
async def create_rollout(request: Request, gw: Gateway = Depends(gateway)) -> JSONResponse:
    req: CreateRolloutRequest = await parse(request, CreateRolloutRequest)
    opened = gw.open_rollout(
        req.task,
        rollout_id=req.rollout_id,
        run_id=req.run_id,
        group_id=req.group_id,
        task_id=req.task_id,
    )
    return JSONResponse(opened.as_json(), status_code=201)


@router.get("/admin/rollouts", tags=["admin"])
async def list_rollouts(
    run_id: str | None = None,
    status: str | None = None,
    limit: int = Query(100, ge=1, le=10_000),
    gw: Gateway = Depends(gateway),
) -> dict[str, Any]:
    rows = gw.rollouts(run_id=run_id, status=status, limit=limit)
    return {"data": [rollout_view(r) for r in rows]}


@router.get("/admin/rollouts/{rollout_id:rid}", tags=["admin"])
async def get_rollout(rollout_id: str, gw: Gateway = Depends(gateway)) -> dict[str, Any]:
    rollout, calls = gw.rollout(rollout_id)
    return {**rollout_view(rollout), "calls": [call_view(c) for c in calls]}


@router.post(
    "/admin/rollouts/{rollout_id:rid}/finish",
    tags=["admin"],
    openapi_extra=body_schema(FinishRolloutRequest),
)
async def finish(rollout_id: str, request: Request, gw: Gateway = Depends(gateway)) -> dict:
    check_rollout_id(rollout_id)
    req: FinishRolloutRequest = await parse(request, FinishRolloutRequest)
    attempt = gw.current_attempt(rollout_id)  # 404 for an unknown rollout
    rollout = gw.finish_rollout(
        AttemptEnd(rollout_id, attempt, RolloutStatus(req.status), error=req.error),
        reward=req.reward,
        source=RewardSource.ADMIN,
        final_answer=req.final_answer,
    )
    return rollout_view(rollout)


@router.post("/admin/pause", tags=["admin"])
async def pause(gw: Gateway = Depends(gateway)) -> dict[str, Any]:
    await gw.pause()
    return gw.admission_state()


@router.post("/admin/resume", tags=["admin"])
async def resume(gw: Gateway = Depends(gateway)) -> dict[str, Any]:
    gw.resume()
    return gw.admission_state()


@router.get("/admin/state", tags=["admin"])
async def state(gw: Gateway = Depends(gateway)) -> dict[str, Any]:
    return gw.admission_state()
