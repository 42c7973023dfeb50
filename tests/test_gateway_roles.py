"""Roles in the gateway: ``/rollouts/{id}/roles/{role}/v1/...`` serves the same routes as
``/rollouts/{id}/v1/...`` and records the role with every call; a malformed role is a
400, one the gateway does not serve a 404, and neither reaches the engine or the store."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.gateway import GatewayConfig, create_app

from .conftest import ADMIN_KEY

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 4}
MESSAGES = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi", "max_output_tokens": 4}


def _client(gw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    )


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_every_route_records_the_role_of_its_url(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40, 41]), roles=("solver", "critic"))
    a = gw.open_rollout({"q": 1}, rollout_id="r-1")
    base = "/rollouts/r-1"
    posts = [
        (f"{base}/roles/solver/v1/chat/completions", CHAT, "solver"),
        (f"{base}/v1/chat/completions", CHAT, None),
        (f"{base}/roles/critic/v1/completions", {"prompt": "2+3=", "max_tokens": 4}, "critic"),
        (f"{base}/roles/critic/v1/messages", MESSAGES, "critic"),
        (f"{base}/roles/solver/v1/responses", RESPONSES, "solver"),
    ]
    async with _client(gw) as c:
        for path, body, _ in posts:
            r = await c.post(path, json=body, headers=_h(a.token))
            assert r.status_code == 200, (path, r.text)
        stream = {**CHAT, "stream": True}
        r = await c.post(
            f"{base}/roles/critic/v1/chat/completions", json=stream, headers=_h(a.token)
        )
        assert r.status_code == 200 and "[DONE]" in r.text
        r = await c.get(f"{base}/roles/critic/v1/models", headers=_h(a.token))
        assert r.status_code == 200 and r.json()["data"][0]["id"] == "policy"
        r = await c.post(
            f"{base}/roles/critic/v1/messages/count_tokens",
            json={"model": "m", "messages": MESSAGES["messages"]},
            headers={"x-api-key": a.token},
        )
        assert r.status_code == 200 and r.json()["input_tokens"] > 0
    roles = [c.role for c in gw.store.calls("r-1")]
    assert roles == [role for _, _, role in posts] + ["critic"]


@pytest.mark.parametrize(
    ("role", "status", "words"),
    [
        ("judge", 404, "unknown role 'judge': this run serves solver, critic"),
        ("9lives", 400, "invalid role name '9lives'"),
        ("a.b", 400, "invalid role name"),
        ("x" * 65, 400, "invalid role name"),
    ],
)
async def test_a_bad_or_unserved_role_is_refused_and_nothing_recorded(
    make_gateway: Any, role: str, status: int, words: str
) -> None:
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine, roles=("solver", "critic"))
    a = gw.open_rollout({"q": 1}, rollout_id="r-1")
    async with _client(gw) as c:
        path = f"/rollouts/r-1/roles/{role}/v1/chat/completions"
        r = await c.post(path, json=CHAT, headers=_h(a.token))
        assert r.status_code == status and words in r.json()["error"]["message"]
        r = await c.post(f"/rollouts/r-1/roles/{role}/v1/messages", json=MESSAGES,
                         headers={"x-api-key": a.token})  # fmt: skip
        assert r.status_code == status and r.json()["type"] == "error"  # Anthropic's shape
        r = await c.post(path, json=CHAT)  # no token: the credentials are checked first
        assert r.status_code == 401
    assert gw.store.calls("r-1") == []
    assert engine.calls == []


async def test_without_configured_roles_any_role_name_is_served(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]))
    a = gw.open_rollout({"q": 1}, rollout_id="r-1")
    async with _client(gw) as c:
        path = "/rollouts/r-1/roles/planner/v1/chat/completions"
        assert (await c.post(path, json=CHAT, headers=_h(a.token))).status_code == 200
        bad = "/rollouts/r-1/roles/-x/v1/chat/completions"
        assert (await c.post(bad, json=CHAT, headers=_h(a.token))).status_code == 400
    assert [c.role for c in gw.store.calls("r-1")] == ["planner"]


async def test_openapi_lists_the_three_forms(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]))
    async with _client(gw) as c:
        schema = (await c.get("/openapi.json", headers=_h(ADMIN_KEY))).json()
    for suffix in ("chat/completions", "responses", "messages", "messages/count_tokens", "models"):
        assert f"/rollouts/{{rollout_id}}/v1/{suffix}" in schema["paths"]
        assert f"/rollouts/{{rollout_id}}/roles/{{role}}/v1/{suffix}" in schema["paths"]
        assert f"/v1/{suffix}" in schema["paths"]  # the record form
    assert "/v1/completions" not in schema["paths"]  # text completions have no record form


def test_a_route_is_a_call_or_an_answer() -> None:
    """A dialect's route (``_http.mount.Route``) names exactly one way to answer."""
    from tether.gateway._http.mount import Route

    with pytest.raises(ValueError, match="exactly one of call= and answer="):
        Route("/v1/x", "x", "openai")


def test_gateway_roles_must_be_role_names() -> None:
    with pytest.raises(UserError, match=r"gateway.roles: invalid role name 'a b'"):
        GatewayConfig(roles=("solver", "a b"))


async def test_each_roles_calls_reach_the_engine_with_its_adapter(make_gateway: Any) -> None:
    """``role_adapters`` (a run with own adapters / frozen roles) names each role's engine
    adapter; a role without one, and a call without a role, get the policy (None)."""
    engine = NullEngine(token_ids=[40, 41])
    adapters = {"solver": "solver", "critic": "base"}
    gw = make_gateway(engine, roles=("solver", "critic", "helper"), role_adapters=adapters)
    a = gw.open_rollout({"q": 1}, rollout_id="r-1")
    paths = ["roles/solver/v1/chat/completions", "roles/critic/v1/chat/completions",
             "roles/helper/v1/chat/completions", "v1/chat/completions",
             "roles/critic/v1/messages"]  # fmt: skip
    async with _client(gw) as c:
        for path in paths:
            body = MESSAGES if path.endswith("messages") else CHAT
            r = await c.post(f"/rollouts/r-1/{path}", json=body, headers=_h(a.token))
            assert r.status_code == 200, (path, r.text)
    assert [p.adapter for _, p in engine.calls] == ["solver", "base", None, None, "base"]
