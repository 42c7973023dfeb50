"""Attack tests of the gateway (SECURITY.md, cases 1-4): closed by default,
rollout isolation, no self-rewarding, parameter caps.

Every refused request must leave the engine uncalled and the store unchanged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tether.engine.testing import NullEngine
from tether.errors import UserError
from tether.gateway import GatewayConfig, create_app, resolve_admin_key
from tether.records import AttemptEnd, RolloutStatus

from .conftest import ADMIN_KEY

CHAT = {"model": "policy", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 4}
COMPLETION = {"model": "policy", "prompt": "2+3=", "max_tokens": 4}


def _h(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _client(gw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    )


def _snapshot(gw: Any) -> list[tuple]:
    rows = gw.store.list_rollouts()
    return [
        (
            r.id,
            r.status,
            r.attempt,
            r.reward,
            len(gw.store.calls(r.id)),
            len(gw.store.rewards(r.id)),
        )
        for r in rows
    ]


# -- 1. closed by default --------------------------------------------------------------


def test_default_bind_is_loopback_and_open_bind_needs_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TETHER_ADMIN_KEY", raising=False)
    assert GatewayConfig().host == "127.0.0.1"
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):  # tether keeps a key file
        key = resolve_admin_key(host, tmp_path)
        assert key.path == tmp_path / "admin_key" and key.how == f"cat {key.path}"
        assert key.value == key.path.read_text().strip() and len(key.value) >= 32
    for host in ("0.0.0.0", "::", "192.168.1.5", "gateway.example.com"):
        with pytest.raises(UserError) as err:
            resolve_admin_key(host, tmp_path / host)
        message = str(err.value)
        assert "\n" not in message and "TETHER_ADMIN_KEY" in message and host in message
        assert not (tmp_path / host).exists()  # no key invented that nobody is told about
        given = resolve_admin_key(host, tmp_path, "k" * 32)
        assert (given.value, given.how, given.path) == (
            "k" * 32,
            "gateway.admin_key of the config",
            None,
        )


def test_the_environments_admin_key_wins_over_the_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/serve.md, docs/dashboard.md: TETHER_ADMIN_KEY, else gateway.admin_key, else the
    file; the same for tether train, serve and dashboard."""
    monkeypatch.setenv("TETHER_ADMIN_KEY", "e" * 32)
    for host in ("127.0.0.1", "0.0.0.0"):
        key = resolve_admin_key(host, tmp_path, "c" * 32)
        assert (key.value, key.how, key.path) == ("e" * 32, "$TETHER_ADMIN_KEY", None)
    assert "e" * 32 not in repr(key)
    assert not (tmp_path / "admin_key").exists()


def _every_route(app: Any) -> list[tuple[str, str]]:
    out = []

    def walk(routes: list[Any]) -> None:
        for route in routes:
            # FastAPI >= 0.16x keeps an included router as one entry over its routes
            inner = getattr(route, "original_router", None)
            if inner is not None:
                walk(inner.routes)
                continue
            for method in sorted(getattr(route, "methods", None) or ()):
                if method != "HEAD":
                    out.append((method, route.path))

    walk(app.routes)
    return out


async def test_every_route_but_healthz_refuses_without_a_valid_key(make_gateway: Any) -> None:
    """Enumerated from the app itself, so a route added later without auth fails here."""
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine, record_keys=("rec-key-0123",))
    gw.open_rollout({}, rollout_id="r-own")
    routes = _every_route(create_app(gw))
    assert len(routes) >= 14 and ("GET", "/openapi.json") in routes
    before = _snapshot(gw)
    async with _client(gw) as c:
        for method, path in routes:
            url = re.sub(r"\{rollout_id(:\w+)?\}", "r-own", path)
            body = json.dumps(CHAT if "completions" in url else {"value": 1.0, "task": {}})
            for headers in ({}, _h("tr-wrong"), {"Authorization": "Basic " + ADMIN_KEY}):
                r = await c.request(
                    method,
                    url,
                    content=body,
                    headers={**headers, "Content-Type": "application/json"},
                )
                if path == "/healthz":
                    assert r.status_code == 200
                    continue
                assert r.status_code == 401, f"{method} {path} {headers}: {r.status_code}"
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"]["type"] == "authentication_error"
    assert engine.num_calls == 0 and _snapshot(gw) == before
    assert not gw.gate.paused


# -- 2. rollout isolation ---------------------------------------------------------------


async def test_another_rollouts_token_is_403_and_stores_nothing(make_gateway: Any) -> None:
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine, allow_agent_rewards=True)
    a = gw.open_rollout({}, rollout_id="r-a")
    b = gw.open_rollout({}, rollout_id="r-b")
    before = _snapshot(gw)
    async with _client(gw) as c:
        answers = []
        for rid in ("r-a", "r-unknown"):  # same answer whether the rollout exists or not
            for path, body in (
                ("v1/chat/completions", CHAT),
                ("v1/completions", COMPLETION),
                ("reward", {"value": 1.0}),
            ):
                r = await c.post(f"/rollouts/{rid}/{path}", json=body, headers=_h(b.token))
                assert r.status_code == 403, r.text
                answers.append((path, r.status_code, r.json()))
            r = await c.get(f"/rollouts/{rid}/v1/models", headers=_h(b.token))
            assert r.status_code == 403
        assert answers[:3] == answers[3:]
        # The owner's token still works; the intruder's attempts left nothing behind.
        assert engine.num_calls == 0 and _snapshot(gw) == before
        ok = await c.post("/rollouts/r-a/v1/chat/completions", json=CHAT, headers=_h(a.token))
        assert ok.status_code == 200 and len(gw.store.calls("r-a")) == 1


BAD_IDS = ["a%0d%0aFORGED%20line", "..%2f..%2fetc%2fpasswd", "a%2f..%2fb", "a%00b", "x" * 257,
           "%2e%2e", "-leading-dash", "a%20b"]  # fmt: skip


@pytest.mark.parametrize("rid", BAD_IDS, ids=range(len(BAD_IDS)))
async def test_bad_rollout_ids_are_400_everywhere(rid: str, make_gateway: Any) -> None:
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine)
    async with _client(gw) as c:
        for method, path, token in (
            ("POST", f"/rollouts/{rid}/v1/chat/completions", "tr-x"),
            ("POST", f"/rollouts/{rid}/v1/completions", "tr-x"),
            ("GET", f"/rollouts/{rid}/v1/models", "tr-x"),
            ("POST", f"/rollouts/{rid}/reward", "tr-x"),
            ("GET", f"/admin/rollouts/{rid}", ADMIN_KEY),
            ("POST", f"/admin/rollouts/{rid}/finish", ADMIN_KEY),
        ):
            r = await c.request(method, path, json=CHAT, headers=_h(token))
            assert r.status_code == 400, f"{method} {path}: {r.status_code} {r.text}"
            assert r.json()["error"]["param"] == "rollout_id"
        r = await c.post("/admin/rollouts", json={"rollout_id": "a\r\nb"}, headers=_h(ADMIN_KEY))
        assert r.status_code == 400
    assert engine.num_calls == 0 and gw.store.list_rollouts() == []


async def test_bad_rollout_ids_forge_no_log_line(
    make_gateway: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A real server with uvicorn's access log on: the CRLF id stays one encoded line."""
    gw = make_gateway(NullEngine(token_ids=[40]))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        create_app(gw), log_config=None, access_log=True, log_level="debug", lifespan="off"
    )
    server = uvicorn.Server(config)
    caplog.set_level(logging.DEBUG)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        port = sock.getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            for rid in BAD_IDS[:4]:
                r = await c.post(f"/rollouts/{rid}/v1/chat/completions", json=CHAT)
                assert r.status_code == 400
    finally:
        server.should_exit = True
        await task
        sock.close()
    lines = [rec.getMessage() for rec in caplog.records]
    assert any("/rollouts/" in line for line in lines)  # the access log did run
    for line in lines:
        assert "\r" not in line and "\n" not in line and "\x00" not in line, line


# -- 3. no self-rewarding ---------------------------------------------------------------


async def test_agent_rewards_refused_unless_allowed(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]))
    a = gw.open_rollout({}, rollout_id="r-self")
    async with _client(gw) as c:
        r = await c.post("/rollouts/r-self/reward", json={"value": 1.0}, headers=_h(a.token))
    assert r.status_code == 403 and "allow_agent_rewards" in r.json()["error"]["message"]
    assert gw.store.rewards("r-self") == [] and gw.store.get_rollout("r-self").reward is None


async def test_second_final_reward_is_409_and_ended_token_is_401(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]), allow_agent_rewards=True)
    a = gw.open_rollout({}, rollout_id="r-twice")
    async with _client(gw) as c:
        first = await c.post("/rollouts/r-twice/reward", json={"value": 0.5}, headers=_h(a.token))
        again = await c.post("/rollouts/r-twice/reward", json={"value": 1.0}, headers=_h(a.token))
        admin = await c.post(
            "/admin/rollouts/r-twice/finish", json={"reward": 1.0}, headers=_h(ADMIN_KEY)
        )
        assert (first.status_code, again.status_code, admin.status_code) == (200, 409, 409)
        gw.finish_rollout(
            AttemptEnd("r-twice", gw.current_attempt("r-twice"), RolloutStatus.SUCCEEDED)
        )
        for method, path, body in (
            ("POST", "v1/chat/completions", CHAT),
            ("POST", "reward", {"value": 1.0}),
            ("GET", "v1/models", None),
        ):
            r = await c.request(method, f"/rollouts/r-twice/{path}", json=body, headers=_h(a.token))
            assert r.status_code == 401 and "ended" in r.json()["error"]["message"], path
    done = gw.store.get_rollout("r-twice")
    assert (done.reward, done.status) == (0.5, RolloutStatus.SUCCEEDED)
    assert gw.store.calls("r-twice") == []


async def test_retry_refuses_the_previous_attempts_token(make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]))
    first = gw.open_rollout({}, rollout_id="r-retry")
    gw.finish_rollout(AttemptEnd("r-retry", first.attempt, RolloutStatus.FAILED))
    second = gw.retry_rollout("r-retry")
    async with _client(gw) as c:
        old = await c.post(
            "/rollouts/r-retry/v1/chat/completions", json=CHAT, headers=_h(first.token)
        )
        new = await c.post(
            "/rollouts/r-retry/v1/chat/completions", json=CHAT, headers=_h(second.token)
        )
    # A stale attempt's late write is refused (409, docs/design.md) and stores nothing.
    assert old.status_code == 409 and new.status_code == 200, (old.text, new.text)
    assert gw.store.calls("r-retry", attempt=1) == []
    assert [c.attempt for c in gw.store.calls("r-retry")] == [2]


# -- 4. parameter caps ------------------------------------------------------------------

NUMS = {"NaN": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
CAPS = [
    *[(f"temperature {k}", f'"temperature": {v}') for k, v in NUMS.items()],
    *[(f"top_p {k}", f'"top_p": {v}') for k, v in NUMS.items()],
    ("temperature negative", '"temperature": -0.5'),
    ("temperature above 2", '"temperature": 2.5'),
    ("top_p negative", '"top_p": -0.1'),
    ("top_p zero", '"top_p": 0'),
    ("top_p above 1", '"top_p": 1.5'),
    ("n zero", '"n": 0'),
    ("n negative", '"n": -3'),
    ("n above cap", '"n": 17'),
    ("n huge", '"n": 1' + "0" * 40),
    ("max_tokens zero", '"max_tokens": 0'),
    ("max_tokens above cap", '"max_tokens": 4097'),
    ("max_tokens huge", '"max_tokens": 1' + "0" * 400),
    ("max_tokens float", '"max_tokens": 1e9'),
    ("stop too many", '"stop": ["a", "b", "c", "d", "e"]'),
    ("seed not int", '"seed": "x"'),
]
CHAT_ONLY = [
    ("top_logprobs above cap", '"logprobs": true, "top_logprobs": 21'),
    ("top_logprobs without logprobs", '"top_logprobs": 2'),
    ("max_completion_tokens above cap", '"max_completion_tokens": 100000'),
    ("too many messages", '"messages": ' + json.dumps([{"role": "user", "content": "a"}] * 513)),
    ("too many tools", '"tools": ' + json.dumps([{"type": "function", "function": {"name": "f"}}] * 129)),
]  # fmt: skip
COMPLETION_ONLY = [
    ("logprobs above cap", '"logprobs": 21'),
    ("prompt id out of vocab", '"prompt": [1, 2, 99999999]'),
    ("prompt id negative", '"prompt": [-1]'),
]


def _with(base: dict, extra: str) -> bytes:
    return (json.dumps(base)[:-1] + ", " + extra + "}").encode()


CASES = [("chat", n, e) for n, e in CAPS + CHAT_ONLY] + [
    ("completions", n, e) for n, e in CAPS + COMPLETION_ONLY
]


@pytest.mark.parametrize("route,name,extra", CASES, ids=[f"{r}-{n}" for r, n, _ in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_caps_are_4xx_with_zero_engine_calls(
    route: str, name: str, extra: str, stream: bool, make_gateway: Any
) -> None:
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine)
    a = gw.open_rollout({}, rollout_id="r-cap")
    base = {**(CHAT if route == "chat" else COMPLETION), "stream": stream}
    body = _with(base, extra)
    before = _snapshot(gw)
    async with _client(gw) as c:
        r = await c.post(
            f"/rollouts/r-cap/v1/{route.replace('chat', 'chat/completions')}",
            content=body,
            headers={**_h(a.token), "Content-Type": "application/json"},
        )
    assert 400 <= r.status_code < 500, f"{name}: {r.status_code} {r.text}"
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["message"]
    assert engine.num_calls == 0 and _snapshot(gw) == before


async def test_body_cap_with_and_without_content_length(make_gateway: Any) -> None:
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine, max_body_bytes=64 * 1024)
    a = gw.open_rollout({}, rollout_id="r-body")
    big = _with(CHAT, '"user": "' + "x" * 70_000 + '"')

    async def chunked():
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    async with _client(gw) as c:
        for content in (big, chunked()):
            r = await c.post(
                "/rollouts/r-body/v1/chat/completions",
                content=content,
                headers={**_h(a.token), "Content-Type": "application/json"},
            )
            assert r.status_code == 413, r.text
            assert "65536" in r.json()["error"]["message"]
        ok = await c.post("/rollouts/r-body/v1/chat/completions", json=CHAT, headers=_h(a.token))
    assert ok.status_code == 200 and engine.num_calls == 1


def test_an_agent_killed_mid_request_leaves_no_traceback(make_gateway: Any) -> None:
    """A client gone before its body arrived (an agent killed by Ctrl-C) is not a server error."""
    from tether.gateway import BackgroundServer

    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine)
    a = gw.open_rollout({}, rollout_id="r-gone")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    server = BackgroundServer(create_app(gw)).start()
    logger = logging.getLogger("uvicorn.error")  # after the start: uvicorn configures it there
    logger.addHandler(handler)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            head = (
                "POST /rollouts/r-gone/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {a.token}\r\nContent-Type: application/json\r\n"
                "Content-Length: 1000\r\n\r\n"
            )
            s.sendall(head.encode() + b'{"messages": [')
        ok = httpx.post(
            f"{server.url}/rollouts/r-gone/v1/chat/completions", json=CHAT, headers=_h(a.token)
        )
        assert ok.status_code == 200, ok.text
    finally:
        server.stop()
        logger.removeHandler(handler)
    errors = [r.getMessage() for r in records if r.levelno >= logging.ERROR]
    assert errors == [], errors
    assert engine.num_calls == 1
