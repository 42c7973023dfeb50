"""The gateway's HTTP surface, in-process (ASGI): auth matrix, bad input, rewards, admin."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tether.engine.testing import FaultyEngine, NullEngine
from tether.gateway import Gateway, GatewayConfig, create_app
from tether.records import AttemptEnd, RolloutStatus
from tether.store import Store

from .conftest import ADMIN_KEY

CHAT = {
    "model": "policy",
    "messages": [{"role": "user", "content": "What is 2+3?"}],
    "max_tokens": 8,
}


def _h(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


@pytest.fixture
def gw(make_gateway: Any) -> Any:
    return make_gateway(NullEngine(token_ids=[40, 41, 42]))


@pytest.fixture
async def client(gw: Any):
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        yield c


async def _snapshot(gw: Any) -> list[tuple]:
    rows = gw.store.list_rollouts()
    return [(r.id, r.status, r.reward, len(gw.store.calls(r.id))) for r in rows]


async def test_healthz_is_open(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"


async def test_chat_records_one_call_per_request(client: httpx.AsyncClient, gw: Any) -> None:
    a = gw.open_rollout({"q": 1}, rollout_id="r-1")
    for _ in range(3):
        r = await client.post("/rollouts/r-1/v1/chat/completions", json=CHAT, headers=_h(a.token))
        assert r.status_code == 200, r.text
    calls = gw.store.calls("r-1")
    assert [c.seq for c in calls] == [0, 1, 2]
    assert calls[0].completion_ids == [40, 41, 42] and calls[0].logprobs == [-0.5] * 3
    body = r.json()
    assert body["usage"]["completion_tokens"] == 3
    assert body["choices"][0]["message"]["role"] == "assistant"


ROUTES = [
    ("POST", "/rollouts/{rid}/v1/chat/completions", CHAT),
    ("POST", "/rollouts/{rid}/v1/completions", {"prompt": "2+3=", "max_tokens": 4}),
    ("GET", "/rollouts/{rid}/v1/models", None),
    ("POST", "/rollouts/{rid}/reward", {"value": 1.0}),
    ("POST", "/v1/chat/completions", CHAT),
    ("GET", "/v1/models", None),
    ("POST", "/admin/rollouts", {"task": {}}),
    ("GET", "/admin/rollouts", None),
    ("GET", "/admin/rollouts/{rid}", None),
    ("POST", "/admin/rollouts/{rid}/finish", {"status": "cancelled"}),
    ("POST", "/admin/pause", None),
    ("POST", "/admin/resume", None),
    ("GET", "/admin/state", None),
]

# Documented status per route and credential: own = the rollout's token,
# other = another rollout's token, admin = the admin key.
EXPECTED = {
    # route index: (none, wrong, other, own, admin)
    0: (401, 401, 403, 200, 403),
    1: (401, 401, 403, 200, 403),
    2: (401, 401, 403, 200, 403),
    3: (401, 401, 403, 403, 200),  # agent rewards are off by default
    4: (401, 401, 401, 401, 401),  # record mode needs a record key
    5: (401, 401, 401, 401, 200),
    6: (401, 401, 401, 401, 201),
    7: (401, 401, 401, 401, 200),
    8: (401, 401, 401, 401, 200),
    9: (401, 401, 401, 401, 200),
    10: (401, 401, 401, 401, 200),
    11: (401, 401, 401, 401, 200),
    12: (401, 401, 401, 401, 200),
}


@pytest.mark.parametrize("index", range(len(ROUTES)))
async def test_auth_matrix(index: int, tokenizer: Any, tmp_path: Path) -> None:
    method, path, body = ROUTES[index]
    expected = EXPECTED[index]
    for cred, want in zip(("none", "wrong", "other", "own", "admin"), expected, strict=True):
        engine = NullEngine(token_ids=[40, 41])
        gw = Gateway(
            engine,
            tokenizer,
            Store(tmp_path / f"{cred}.sqlite"),
            GatewayConfig(admin_key=ADMIN_KEY),
        )
        own = gw.open_rollout({}, rollout_id="r-own")
        other = gw.open_rollout({}, rollout_id="r-other")
        token = {
            "none": None,
            "wrong": "tr-nope",
            "other": other.token,
            "own": own.token,
            "admin": ADMIN_KEY,
        }[cred]
        transport = httpx.ASGITransport(app=create_app(gw))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            r = await c.request(method, path.format(rid="r-own"), json=body, headers=_h(token))
            await c.post("/admin/resume", headers=_h(ADMIN_KEY))
        assert r.status_code == want, f"{method} {path} with {cred}: {r.status_code} {r.text}"
        if r.status_code >= 400:
            err = r.json()["error"]
            assert err["message"] and err["type"]
        if want in (401, 403):
            assert engine.num_calls == 0
            assert gw.store.calls("r-own") == [] and gw.store.calls("r-other") == []
        gw.store.close()


async def test_token_cannot_write_to_another_rollout(client: httpx.AsyncClient, gw: Any) -> None:
    a = gw.open_rollout({}, rollout_id="r-a")
    gw.open_rollout({}, rollout_id="r-b")
    r = await client.post("/rollouts/r-b/v1/chat/completions", json=CHAT, headers=_h(a.token))
    assert r.status_code == 403
    assert gw.store.calls("r-b") == [] and gw.store.calls("r-a") == []


async def test_token_stops_working_when_rollout_ends(client: httpx.AsyncClient, gw: Any) -> None:
    a = gw.open_rollout({}, rollout_id="r-end")
    gw.finish_rollout(AttemptEnd("r-end", a.attempt, RolloutStatus.SUCCEEDED), reward=1.0)
    r = await client.post("/rollouts/r-end/v1/chat/completions", json=CHAT, headers=_h(a.token))
    assert r.status_code == 401 and "ended" in r.json()["error"]["message"]


BAD = [
    ("oversized body", {"messages": [{"role": "user", "content": "x" * 5_000_000}]}, 413),
    ("n above cap", {**CHAT, "n": 1000}, 400),
    ("max_tokens above cap", {**CHAT, "max_tokens": 10**7}, 400),
    ("max_completion_tokens above cap", {**CHAT, "max_completion_tokens": 10**7}, 400),
    ("top_logprobs above cap", {**CHAT, "logprobs": True, "top_logprobs": 99}, 400),
    ("negative temperature", {**CHAT, "temperature": -1}, 400),
    ("top_p zero", {**CHAT, "top_p": 0}, 400),
    ("unknown field", {**CHAT, "frobnicate": True}, 400),
    ("missing messages", {"model": "policy"}, 400),
    ("empty messages", {**CHAT, "messages": []}, 400),
    ("bad role", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400),
    ("forced tool", {**CHAT, "tool_choice": "required"}, 400),
    ("json schema output", {**CHAT, "response_format": {"type": "json_schema"}}, 400),
    ("penalty", {**CHAT, "frequency_penalty": 0.5}, 400),
    ("too many messages", {**CHAT, "messages": [{"role": "user", "content": "a"}] * 600}, 400),
]


@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
async def test_bad_input_is_4xx_and_changes_nothing(case: tuple, make_gateway: Any) -> None:
    _, body, status = case
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine)
    a = gw.open_rollout({}, rollout_id="r-bad")
    before = await _snapshot(gw)
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.post("/rollouts/r-bad/v1/chat/completions", json=body, headers=_h(a.token))
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    assert engine.num_calls == 0
    assert await _snapshot(gw) == before


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[1, 2]", b'{"model": "p", "messages": [], "temperature": NaN}']
)
async def test_invalid_json_and_nan(raw: bytes, client: httpx.AsyncClient, gw: Any) -> None:
    a = gw.open_rollout({}, rollout_id="r-json")
    r = await client.post(
        "/rollouts/r-json/v1/chat/completions",
        content=raw,
        headers={**_h(a.token), "Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert gw.store.calls("r-json") == []


@pytest.mark.parametrize("rid", ["a%0d%0aFORGED", "..%2f..%2fetc", "a%00b", "x" * 300])
async def test_bad_rollout_ids_are_400(rid: str, client: httpx.AsyncClient) -> None:
    r = await client.post(f"/rollouts/{rid}/v1/chat/completions", json=CHAT, headers=_h("tr-x"))
    assert r.status_code in (400, 404), r.text
    assert "FORGED" not in r.text.replace("%0d%0aFORGED", "")


async def test_unknown_rollout_is_401_not_a_probe(client: httpx.AsyncClient) -> None:
    r = await client.post("/rollouts/r-none/v1/chat/completions", json=CHAT, headers=_h("tr-x"))
    assert r.status_code == 401


async def test_agent_reward_when_allowed_and_duplicate_refused(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(), allow_agent_rewards=True)
    a = gw.open_rollout({}, rollout_id="r-rew")
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r1 = await c.post("/rollouts/r-rew/reward", json={"value": 0.75}, headers=_h(a.token))
        r2 = await c.post("/rollouts/r-rew/reward", json={"value": 1.0}, headers=_h(a.token))
        r3 = await c.post("/rollouts/r-rew/reward", content=b'{"value": NaN}', headers=_h(a.token))
    assert r1.status_code == 200 and r2.status_code == 409 and r3.status_code == 400
    rewards = gw.store.rewards("r-rew")
    assert [(w.value, w.source.value) for w in rewards] == [(0.75, "agent")]


async def test_admin_flow_create_read_finish(client: httpx.AsyncClient, gw: Any) -> None:
    r = await client.post(
        "/admin/rollouts", json={"task": {"q": "2+2"}, "rollout_id": "r-adm"}, headers=_h(ADMIN_KEY)
    )
    assert r.status_code == 201
    opened = r.json()
    assert opened["base_url"].endswith("/rollouts/r-adm/v1") and opened["token"].startswith("tr-")
    dup = await client.post("/admin/rollouts", json={"rollout_id": "r-adm"}, headers=_h(ADMIN_KEY))
    assert dup.status_code == 409
    await client.post("/rollouts/r-adm/v1/chat/completions", json=CHAT, headers=_h(opened["token"]))
    got = (await client.get("/admin/rollouts/r-adm", headers=_h(ADMIN_KEY))).json()
    assert got["status"] == "running" and len(got["calls"]) == 1
    assert got["calls"][0]["completion_ids"] == [40, 41, 42]
    fin = await client.post(
        "/admin/rollouts/r-adm/finish",
        json={"reward": 1.0, "final_answer": "4"},
        headers=_h(ADMIN_KEY),
    )
    assert (
        fin.status_code == 200
        and fin.json()["reward"] == 1.0
        and fin.json()["status"] == "succeeded"
    )
    again = await client.post(
        "/admin/rollouts/r-adm/finish", json={"reward": 0.0}, headers=_h(ADMIN_KEY)
    )
    assert again.status_code == 409
    assert gw.store.get_rollout("r-adm").reward == 1.0


async def test_record_mode_with_record_key(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]), record_keys=("rec-key",))
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=_h("rec-key"))
    assert r.status_code == 200
    (rollout,) = gw.store.list_rollouts()
    assert rollout.status is RolloutStatus.SUCCEEDED and len(gw.store.calls(rollout.id)) == 1


async def test_pause_holds_calls_until_resume(client: httpx.AsyncClient, gw: Any) -> None:
    a = gw.open_rollout({}, rollout_id="r-p")
    await client.post("/admin/pause", headers=_h(ADMIN_KEY))
    call = asyncio.create_task(
        client.post("/rollouts/r-p/v1/chat/completions", json=CHAT, headers=_h(a.token))
    )
    await asyncio.sleep(0.2)
    assert not call.done() and gw.gate.held == 1
    assert gw.store.calls("r-p") == []
    await client.post("/admin/resume", headers=_h(ADMIN_KEY))
    r = await asyncio.wait_for(call, 5)
    assert r.status_code == 200 and len(gw.store.calls("r-p")) == 1


async def test_a_call_held_past_the_admission_timeout_is_a_503(make_gateway: Any) -> None:
    """Not a 500 on Python 3.10, where wait_for's TimeoutError is not the builtin one."""
    gw = make_gateway(NullEngine(token_ids=[40]), admission_timeout_s=0.2)
    a = gw.open_rollout({}, rollout_id="r-h")
    await gw.pause()
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await asyncio.wait_for(
            c.post("/rollouts/r-h/v1/chat/completions", json=CHAT, headers=_h(a.token)), 5
        )
    assert r.status_code == 503, r.text
    assert "admission timeout" in r.json()["error"]["message"]
    state = gw.admission_state()
    assert state["held"] == 0 and state["held_total"] == 1 and state["held_seconds"] >= 0.2
    assert gw.store.calls("r-h") == [] and gw.engine.num_calls == 0


@pytest.mark.parametrize("fault,status", [("raise", 502), ("hang", 504)])
async def test_engine_fault_is_5xx_recorded_as_failed(
    fault: str, status: int, make_gateway: Any
) -> None:
    gw = make_gateway(FaultyEngine(fault=fault), engine_timeout_s=0.5)
    a = gw.open_rollout({}, rollout_id="r-f")
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await asyncio.wait_for(
            c.post("/rollouts/r-f/v1/chat/completions", json=CHAT, headers=_h(a.token)), 5
        )
    assert r.status_code == status, r.text
    (call,) = gw.store.calls("r-f")
    assert call.status.value == "failed" and call.completion_ids == []
    await gw.engine.close()


async def test_openapi_schema_lists_request_bodies(client: httpx.AsyncClient) -> None:
    assert (await client.get("/openapi.json")).status_code == 401
    schema = (await client.get("/openapi.json", headers=_h(ADMIN_KEY))).json()
    op = schema["paths"]["/rollouts/{rollout_id}/v1/chat/completions"]["post"]
    props = op["requestBody"]["content"]["application/json"]["schema"]["properties"]
    assert {"messages", "tools", "temperature"} <= set(props)
    assert json.dumps(schema)  # serializable


def test_the_gateway_config_imports_without_fastapi_or_uvicorn() -> None:
    code = (
        "import tether.gateway as g; g.GatewayConfig; g.Gateway; import sys; "
        "assert 'fastapi' not in sys.modules and 'uvicorn' not in sys.modules, "
        "[m for m in ('fastapi', 'uvicorn') if m in sys.modules]; "
        "g.create_app, g.make_server, g.LoopServer; assert 'uvicorn' in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
