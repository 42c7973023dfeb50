"""The gateway in front of a remote engine: what it refuses before the servers are called."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tether.engine import RemoteEngine, server_api
from tether.gateway import create_app
from tether.records import AttemptEnd, RolloutStatus

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 4}


@pytest.mark.parametrize(("kind", "status"), [("vllm", 400), ("sglang", 502)])
async def test_top_p_below_1_is_refused_for_vllm_only(
    kind: str, status: int, make_gateway: Any
) -> None:
    """vLLM's logprobs under top_p < 1 are renormalised over the nucleus, not what tether
    records: a 400 naming top_p, nothing sent. SGLang's are exact, so the call goes to the
    server (none listens at port 9 here: 502, cannot reach)."""
    engine = RemoteEngine(server_api(kind), ["http://127.0.0.1:9"])
    gw = make_gateway(engine)
    rollout = gw.open_rollout({}, rollout_id="r-1")
    transport = httpx.ASGITransport(app=create_app(gw))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            r = await client.post(
                "/rollouts/r-1/v1/chat/completions",
                json={**CHAT, "top_p": 0.9},
                headers={"Authorization": f"Bearer {rollout.token}"},
            )
    finally:
        await engine.close()
    assert r.status_code == status, r.text
    if kind == "vllm":
        assert r.json()["error"]["param"] == "top_p"
        assert "top_p (0.9) < 1 cannot be served by vLLM" in r.json()["error"]["message"]
        assert gw.store.calls("r-1") == []  # refused before anything was recorded
    else:
        assert "cannot reach the SGLang server at http://127.0.0.1:9" in r.text


async def test_a_call_that_cannot_reach_its_server_marks_the_attempt_until_it_ends(
    make_gateway: Any,
) -> None:
    """The run asks ``lost_engine`` to retry such an attempt on another replica; ending the
    attempt forgets the mark (a long ``tether serve`` keeps no mark per dead call)."""
    engine = RemoteEngine(server_api("sglang"), ["http://127.0.0.1:9"])
    gw = make_gateway(engine)
    rollout = gw.open_rollout({}, rollout_id="r-1")
    transport = httpx.ASGITransport(app=create_app(gw))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            r = await client.post(
                "/rollouts/r-1/v1/chat/completions",
                json=CHAT,
                headers={"Authorization": f"Bearer {rollout.token}"},
            )
    finally:
        await engine.close()
    assert r.status_code == 502, r.text
    assert gw.lost_engine("r-1", rollout.attempt)
    gw.finish_rollout(AttemptEnd("r-1", rollout.attempt, RolloutStatus.FAILED))
    assert not gw.lost_engine("r-1", rollout.attempt)
    assert gw.calls.lost_engine == set()
