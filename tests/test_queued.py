"""Rollouts are ``queued`` until their runner starts the agent, then ``running``: the store's
transitions, a real in-process runner with a concurrency limit, and the gateway's fallback
(an agent's first call moves a rollout its runner did not report)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tether.engine.testing import NullEngine
from tether.gateway import create_app
from tether.records import AttemptEnd, Rollout, RolloutStatus
from tether.runner import InProcessRunner, Launch, RunnerConfig
from tether.store import IllegalRolloutTransition, StaleAttempt

Q, R = RolloutStatus.QUEUED, RolloutStatus.RUNNING


def test_store_queued_attempts_and_their_transitions(store: Any) -> None:
    store.create_rollout(Rollout(id="r1"))
    assert store.start_attempt("r1", "h1", queued=True) == 1
    assert store.rollout_auth("r1") == (Q, 1, "h1")
    assert store.token_in_use("h1")  # a queued attempt's token is someone's: 403, not 401
    with pytest.raises(StaleAttempt):
        store.mark_running("r1", 2)
    # queued → succeeded skips running: refused, and nothing changes
    with pytest.raises(IllegalRolloutTransition, match="'queued' to 'succeeded'"):
        store.finish_rollout(AttemptEnd("r1", 1, RolloutStatus.SUCCEEDED))
    assert store.mark_running("r1", 1) is True
    assert store.mark_running("r1", 1) is False  # already running
    store.finish_rollout(AttemptEnd("r1", 1, RolloutStatus.FAILED))
    assert store.start_attempt("r1", "h2", queued=True) == 2  # a retry waits its turn too
    assert store.rollout_auth("r1") == (Q, 2, "h2")
    store.finish_rollout(AttemptEnd("r1", 2, RolloutStatus.CANCELLED))  # never started: cancelled
    with pytest.raises(IllegalRolloutTransition):
        store.mark_running("r1", 2)
    store.create_rollout(Rollout(id="r2"))
    with pytest.raises(IllegalRolloutTransition, match="no attempt yet"):
        store.mark_running("r2", 0)


async def test_rollouts_wait_queued_behind_the_runners_concurrency(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40, 41]))
    release = asyncio.Event()

    async def agent(task, client):
        await release.wait()
        return "42"

    runner = InProcessRunner(
        RunnerConfig(mode="inprocess", entry="x:agent", concurrency=2), agent=agent
    )
    runner.on_start = lambda launch: gw.mark_running(launch.rollout_id, launch.attempt)
    opened = [gw.open_rollout({"i": i}, rollout_id=f"q{i}", queued=True) for i in range(5)]
    assert {gw.store.get_rollout(o.rollout_id).status for o in opened} == {Q}
    launches = [
        Launch(
            rollout_id=o.rollout_id, attempt=o.attempt, base_url=o.base_url, token=o.token, task={}
        )
        for o in opened
    ]
    tasks = [asyncio.create_task(runner.run(la)) for la in launches]
    await asyncio.sleep(0.2)
    statuses = [gw.store.get_rollout(o.rollout_id).status for o in opened]
    assert statuses.count(R) == 2 and statuses.count(Q) == 3, statuses
    release.set()
    results = await asyncio.gather(*tasks)
    await runner.close()
    for o, res in zip(opened, results, strict=True):
        gw.finish_rollout(AttemptEnd(o.rollout_id, o.attempt, res.status))
    assert {gw.store.get_rollout(o.rollout_id).status for o in opened} == {RolloutStatus.SUCCEEDED}


async def test_an_agents_first_call_moves_an_unreported_rollout_to_running(
    make_gateway: Any,
) -> None:
    gw = make_gateway(NullEngine(token_ids=[40, 41]))
    o = gw.open_rollout({}, rollout_id="q-call", queued=True)
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.post(
            "/rollouts/q-call/v1/chat/completions",
            json={
                "model": "policy",
                "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"Authorization": f"Bearer {o.token}"},
        )
    assert r.status_code == 200, r.text
    assert gw.store.get_rollout("q-call").status is R and len(gw.store.calls("q-call")) == 1
    # A runner that never reported the start still ends the rollout through running.
    o2 = gw.open_rollout({}, rollout_id="q-quiet", queued=True)
    done = gw.finish_rollout(AttemptEnd("q-quiet", o2.attempt, RolloutStatus.FAILED))
    assert done.status is RolloutStatus.FAILED
    # The admin route (bring your own runner) opens rollouts running, as before.
    assert gw.open_rollout({}, rollout_id="byo").attempt == 1
    assert gw.store.get_rollout("byo").status is R
