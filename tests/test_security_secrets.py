"""Secrets, engine faults, bad rewards and untrusted agents (SECURITY.md, cases 5, 6, 10, 12).

A real uvicorn server on loopback with the official ``openai`` client, a real
SQLite file and real agent processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from tether.engine.testing import FaultyEngine, NullEngine
from tether.gateway import LoopServer, create_app
from tether.records import Phase, RolloutStatus, Split, Task
from tether.run import collect_groups
from tether.runner import Launch, RunnerConfig, agent_env, make_runner
from tether.trainer.samples import build_samples

from .conftest import ADMIN_KEY

MARKER = "PROMPT-MARKER-7f3a"
MESSAGES = [{"role": "user", "content": f"{MARKER}: what is 2+3?"}]
RECORD_KEY = "rec-key-5e2b9c0d1a"


def _h(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Live:
    """The app on a real socket, uvicorn's access log on, logging left to the test."""

    def __init__(self, gw: Any):
        self.gw = gw
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        gw.config.public_url = self.url
        cfg = uvicorn.Config(
            create_app(gw), log_config=None, access_log=True, log_level="debug", lifespan="off"
        )
        self.server = uvicorn.Server(cfg)

    async def __aenter__(self) -> Live:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        while not self.server.started:
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await self.task
        self.sock.close()


def _client(base_url: str, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=10)


# -- 5. secrets -------------------------------------------------------------------------


@pytest.mark.parametrize("log_prompts", [False, True])
async def test_secrets_stay_out_of_logs_traces_and_error_bodies(
    log_prompts: bool, make_gateway: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FaultyEngine(NullEngine(token_ids=[40, 41]), fault=None)
    gw = make_gateway(
        engine, record_keys=(RECORD_KEY,), allow_agent_rewards=True, log_prompts=log_prompts
    )
    caplog.set_level(logging.DEBUG)
    live = Live(gw)
    a = gw.open_rollout({"q": 1}, rollout_id="r-a")
    b = gw.open_rollout({"q": 2}, rollout_id="r-b")
    secrets = {"admin": ADMIN_KEY, "record": RECORD_KEY, "a": a.token, "b": b.token}
    bodies: list[str] = []
    async with live, _client(a.base_url, a.token) as ca:
        await ca.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
        engine.fault = "raise"
        with pytest.raises(openai.APIStatusError) as failed:
            await ca.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
        bodies.append(failed.value.response.text)
        engine.fault = None
        async with httpx.AsyncClient(base_url=live.url) as c:
            probes = [
                ("POST", "/rollouts/r-a/v1/chat/completions", b.token),  # another's token
                (
                    "POST",
                    "/rollouts/r-a/v1/chat/completions",
                    ADMIN_KEY,
                ),  # admin key on agent route
                ("POST", "/rollouts/r-a/v1/chat/completions", RECORD_KEY),
                ("POST", "/rollouts/r-a/v1/chat/completions", a.token + "x"),
                ("GET", "/admin/state", a.token),
                ("GET", "/admin/state", ADMIN_KEY + "x"),
                ("POST", "/v1/chat/completions", ADMIN_KEY),
                ("POST", "/v1/chat/completions", RECORD_KEY),  # record mode, stores a call
                ("POST", "/rollouts/r-a/reward", a.token),
                ("POST", "/admin/rollouts/r-b/finish", ADMIN_KEY),
                ("POST", "/rollouts/r-b/v1/chat/completions", b.token),  # ended: 401
            ]
            for method, path, token in probes:
                body = {"value": 1.0} if path.endswith("reward") else {}
                if "completions" in path:
                    body = {"model": "policy", "messages": MESSAGES, "max_tokens": 4}
                r = await c.request(method, path, json=body, headers=_h(token))
                bodies.append(r.text)
    gw.store.close()  # flush the WAL so the main file holds everything too
    for body in bodies:
        for name, secret in secrets.items():
            assert secret not in body, f"{name} secret in an error body: {body}"
    client_side = ("openai", "httpx", "httpcore")  # the agent's own client libraries
    logged = "\n".join(
        rec.getMessage() + (rec.exc_text or "") + str(rec.args)
        for rec in caplog.records
        if not rec.name.startswith(client_side)
    )
    assert "/rollouts/r-a/v1/chat/completions" in logged  # uvicorn's access log was captured
    for name, secret in secrets.items():
        assert secret not in logged, f"{name} secret logged"
    assert (MARKER in logged) is log_prompts
    files = sorted(tmp_path.glob("traces.sqlite*"))  # the conftest store, WAL included
    raw = b"".join(p.read_bytes() for p in files)
    assert MARKER.encode() in raw  # the scan sees the stored prompts
    for name, secret in secrets.items():
        assert secret.encode() not in raw, f"{name} secret stored in {files}"


def test_run_config_is_stored_without_secrets(store: Any, tmp_path: Path) -> None:
    config = {
        "gateway": {"admin_key": ADMIN_KEY, "record_keys": [RECORD_KEY], "max_tokens": 64},
        "agent": {"extra_env": {"SEARCH_API_KEY": "sk-search-123", "MODE": "fast"}},
    }
    run = store.create_run(config)
    stored = store.get_run(run.id).config
    assert stored["gateway"]["max_tokens"] == 64 and stored["agent"]["extra_env"]["MODE"] == "fast"
    text = json.dumps(stored)
    assert ADMIN_KEY not in text and RECORD_KEY not in text and "sk-search-123" not in text


def test_agent_env_holds_its_own_token_and_no_other_secret() -> None:
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "TETHER_ADMIN_KEY": ADMIN_KEY,
        "OPENAI_API_KEY": "sk-real-openai-key",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "TETHER_ROLLOUT_TOKEN_OTHER": "tr-other-rollout",
    }
    launch = Launch("r-1", 1, "http://gw/rollouts/r-1/v1", "tr-own-token", {"q": 1})
    env = agent_env(launch, parent_env=parent)
    values = "\n".join(env.values())
    assert env["OPENAI_API_KEY"] == "tr-own-token"
    for secret in (ADMIN_KEY, "sk-real-openai-key", "aws-secret", "tr-other-rollout"):
        assert secret not in values


# -- 6. engine faults -------------------------------------------------------------------


class FakeBuggyEngine(NullEngine):
    """An engine with a bug: raises a plain exception (not an EngineError)."""

    def _complete(self, prompt_ids: list[int], params: Any, index: int) -> list[int]:
        raise KeyError("bug in the engine")


@pytest.mark.parametrize(
    "make_engine,status",
    [
        (lambda: FaultyEngine(fault="hang"), 504),
        (lambda: FaultyEngine(fault="raise"), 502),
        (lambda: FaultyEngine(fault="raise", error=RuntimeError("CUDA error")), 502),
        (FakeBuggyEngine, 502),
    ],
    ids=["hang", "raise", "raise-other", "bug"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_engine_fault_is_a_5xx_openai_error_recorded_failed(
    make_engine: Any, status: int, stream: bool, make_gateway: Any
) -> None:
    engine = make_engine()
    gw = make_gateway(engine, engine_timeout_s=0.5)
    live = Live(gw)
    a = gw.open_rollout({}, rollout_id="r-f")
    async with live, _client(a.base_url, a.token) as client:
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as err:
            await asyncio.wait_for(
                client.chat.completions.create(
                    model="policy", messages=MESSAGES, max_tokens=4, stream=stream
                ),
                10,
            )
        elapsed = time.monotonic() - t0
    assert err.value.status_code == status
    assert err.value.body["type"] in ("engine_error", "timeout_error")  # an OpenAI error body
    assert elapsed < 5  # the configured 0.5 s timeout, not a hang
    (call,) = gw.store.calls("r-f")
    assert call.status.value == "failed" and call.completion_ids == [] and call.logprobs == []
    samples, stats = build_samples([[call]], [1.0])
    assert samples == [] and stats.failed_calls == 1  # never a (truncated) training sample
    await engine.close()


async def test_other_rollouts_are_served_while_one_call_hangs(make_gateway: Any) -> None:
    engine = FaultyEngine(NullEngine(token_ids=[40, 41]), fault="hang", on_calls={0})
    gw = make_gateway(engine, engine_timeout_s=4.0)
    live = Live(gw)
    stuck = gw.open_rollout({}, rollout_id="r-stuck")
    others = [gw.open_rollout({}, rollout_id=f"r-ok{i}") for i in range(4)]
    chat = {"model": "policy", "messages": MESSAGES, "max_tokens": 4}
    async with live, _client(stuck.base_url, stuck.token) as client:
        hung = asyncio.create_task(
            client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
        )
        while engine.num_calls == 0:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as c:
            served = await asyncio.gather(
                *(
                    c.post(f"{o.base_url}/chat/completions", json=chat, headers=_h(o.token))
                    for o in others
                    for _ in range(3)
                )
            )
        assert not hung.done()  # still hanging while 12 other calls were answered
        with pytest.raises(openai.InternalServerError) as err:
            await hung
        assert err.value.status_code == 504
        again = await client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=4
        )
    assert [r.status_code for r in served] == [200] * 12
    assert again.choices[0].message.content is not None
    assert [c.status.value for c in gw.store.calls("r-stuck")] == ["failed", "ok"]
    assert all(len(gw.store.calls(o.rollout_id)) == 3 for o in others)
    await engine.close()


async def test_engine_closed_mid_call_and_paused_gateway_answer_in_time(make_gateway: Any) -> None:
    engine = FaultyEngine(fault="hang")
    gw = make_gateway(engine, engine_timeout_s=60, admission_timeout_s=0.3)
    live = Live(gw)
    a = gw.open_rollout({}, rollout_id="r-dies")
    async with live, _client(a.base_url, a.token) as client:
        call = asyncio.create_task(
            client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=4)
        )
        while engine.num_calls == 0:
            await asyncio.sleep(0.01)
        await engine.close()  # the engine dies under a call in flight
        with pytest.raises(openai.InternalServerError) as err:
            await asyncio.wait_for(call, 5)
        assert err.value.status_code == 502
        async with httpx.AsyncClient(base_url=live.url) as c:
            await c.post("/admin/pause", headers=_h(ADMIN_KEY))
            # one gate, the engine's: a closed engine refuses at once (502), paused or not
            with pytest.raises(openai.APIStatusError) as refused:
                await asyncio.wait_for(
                    client.chat.completions.create(model="policy", messages=MESSAGES), 5
                )
            assert refused.value.status_code == 502
    assert [c.status.value for c in gw.store.calls("r-dies")] == ["failed"]


# -- 10. bad rewards --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"value": NaN}',
        b'{"value": Infinity}',
        b'{"value": -Infinity}',
        b'{"value": 1e999}',
        b'{"value": "1.0"}',
        b'{"value": true}',
        b'{"value": null}',
        b"{}",
        b'{"value": [1]}',
    ],
)
async def test_bad_agent_reward_is_400_and_stores_nothing(raw: bytes, make_gateway: Any) -> None:
    gw = make_gateway(NullEngine(), allow_agent_rewards=True)
    a = gw.open_rollout({}, rollout_id="r-rw")
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.post(
            "/rollouts/r-rw/reward",
            content=raw,
            headers={**_h(a.token), "Content-Type": "application/json"},
        )
        fin = await c.post(
            "/admin/rollouts/r-rw/finish",
            content=raw.replace(b'"value"', b'"reward"'),
            headers={**_h(ADMIN_KEY), "Content-Type": "application/json"},
        )
    assert r.status_code == 400, r.text
    assert gw.store.rewards("r-rw") == []
    if raw in (b"{}", b'{"value": null}'):  # finishing without a reward is allowed: unusable
        assert fin.status_code == 200 and not gw.store.get_rollout("r-rw").usable
    else:
        assert fin.status_code == 400 and gw.store.get_rollout("r-rw").status.value == "running"


async def test_reward_is_kept_as_float64(make_gateway: Any) -> None:
    value = 1.0 + 2**-40  # not representable in float32 or bf16
    gw = make_gateway(NullEngine(), allow_agent_rewards=True)
    a = gw.open_rollout({}, rollout_id="r-f64")
    transport = httpx.ASGITransport(app=create_app(gw))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.post("/rollouts/r-f64/reward", json={"value": value}, headers=_h(a.token))
    assert r.status_code == 200
    assert gw.store.rewards("r-f64")[0].value == value
    assert gw.store.get_rollout("r-f64").reward == value


GRADES = [float("nan"), float("inf"), -float("inf"), "1.0", None, True, 10**400, "boom", 0.5]


async def test_bad_grades_are_counted_and_excluded(make_gateway: Any, tmp_path: Path) -> None:
    """Through the trainer's collection path: only the finite reward becomes a signal."""
    agent = tmp_path / "agent.py"
    agent.write_text("async def agent(task, client):\n    return str(task['i'])\n")

    def grade(task: dict, answer: str | None) -> Any:
        value = GRADES[task["i"]]
        if value == "boom":
            raise ValueError("grader bug")
        return value

    gw = make_gateway(NullEngine())
    run = gw.store.create_run({"grader": "grade"})
    server = await LoopServer(create_app(gw)).start()
    gw.config.public_url = server.url
    runner = make_runner(RunnerConfig(mode="inprocess", entry=f"{agent}:agent"))
    tasks = [Task(id=f"t{i}", data={"i": i}, split=Split.TRAIN) for i in range(len(GRADES))]
    try:
        got = await collect_groups(
            gw, runner, tasks, 1, grader=grade, run_id=run.id, phase=Phase.TRAIN, step=0
        )
    finally:
        await runner.close()
        await server.stop()
    assert [o.status for o in got.outcomes] == [RolloutStatus.SUCCEEDED] * len(GRADES)
    assert [o.usable for o in got.outcomes] == [False] * (len(GRADES) - 1) + [True]
    assert [o.reward for o in got.outcomes][-1] == 0.5
    counts = gw.store.counts()
    assert (counts["usable"], counts["unusable_reward"]) == (1, len(GRADES) - 1)
    kept = [g for g in got.groups() if all(o.usable for o in g)]  # what train_step keeps
    assert len(kept) == 1 and kept[0][0].reward == 0.5


# -- 12. untrusted agents ---------------------------------------------------------------

PROBE_AGENT = """
    import json, os, urllib.request, urllib.error
    base = os.environ["OPENAI_BASE_URL"].split("/rollouts/")[0]
    token = os.environ["OPENAI_API_KEY"]
    def call(method, path, body=None):
        req = urllib.request.Request(base + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    chat = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    print(json.dumps({
        "admin_list": call("GET", "/admin/rollouts"),
        "admin_read_other": call("GET", "/admin/rollouts/r-victim"),
        "admin_pause": call("POST", "/admin/pause"),
        "admin_create": call("POST", "/admin/rollouts", {"task": {}}),
        "admin_finish_self": call("POST", "/admin/rollouts/r-agent/finish", {"reward": 1.0}),
        "openapi": call("GET", "/openapi.json"),
        "other_chat": call("POST", "/rollouts/r-victim/v1/chat/completions", chat),
        "other_reward": call("POST", "/rollouts/r-victim/reward", {"value": 1.0}),
        "record_mode": call("POST", "/v1/chat/completions", chat),
        "own_chat": call("POST", "/rollouts/r-agent/v1/chat/completions", chat),
        "env_has_admin_key": any(%r in v for v in os.environ.values()),
    }))
"""


async def test_agent_process_cannot_reach_admin_or_other_rollouts(
    make_gateway: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_ADMIN_KEY", ADMIN_KEY)  # in the trainer's environment
    engine = NullEngine(token_ids=[40])
    gw = make_gateway(engine)
    gw.open_rollout({}, rollout_id="r-victim")
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(PROBE_AGENT % ADMIN_KEY))
    server = await LoopServer(create_app(gw)).start()
    gw.config.public_url = server.url
    opened = gw.open_rollout({}, rollout_id="r-agent")
    runner = make_runner(RunnerConfig(command=[sys.executable, str(agent)], timeout_s=60))
    try:
        result = await runner.run(
            Launch("r-agent", opened.attempt, opened.base_url, opened.token, {})
        )
    finally:
        await runner.close()
        await server.stop()
    assert result.status is RolloutStatus.SUCCEEDED, result.output_tail
    seen = json.loads(result.final_answer)
    assert seen.pop("own_chat") == 200 and seen.pop("env_has_admin_key") is False
    assert {k: v for k, v in seen.items() if k.startswith(("admin", "openapi", "record"))} == {
        k: 401 for k in seen if k.startswith(("admin", "openapi", "record"))
    }
    assert seen["other_chat"] == 403 and seen["other_reward"] == 403
    assert gw.store.calls("r-victim") == [] and len(gw.store.calls("r-agent")) == 1
    assert not gw.gate.paused and [r.id for r in gw.store.list_rollouts()] == [
        "r-victim",
        "r-agent",
    ]
