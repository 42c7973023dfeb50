"""How rollouts end at the gateway: record-mode outcomes, duplicate ids, history dropped."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import httpx
import pytest

from tether.engine.testing import FaultyEngine, NullEngine
from tether.gateway import create_app
from tether.records import AttemptEnd, RolloutStatus
from tether.store import InvalidRecord

from .conftest import ADMIN_KEY

RECORD_KEY = "rec-key-0123"
CHAT = {"model": "policy", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 4}
RESPONSES = {"model": "policy", "input": "2+3?", "max_output_tokens": 4}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSES)]


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _client(gw: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(gw)), base_url="http://gw"
    )


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_a_failed_record_mode_call_leaves_its_rollout_failed(
    make_gateway: Any, path: str, body: dict, stream: bool
) -> None:
    gw = make_gateway(FaultyEngine(fault="raise"), record_keys=(RECORD_KEY,))
    async with _client(gw) as c:
        r = await c.post(path, json={**body, "stream": stream}, headers=_h(RECORD_KEY))
    assert r.status_code == 502, r.text
    (rollout,) = gw.store.list_rollouts()
    assert rollout.status is RolloutStatus.FAILED
    assert "injected fault" in (rollout.error or "")


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_a_refused_record_mode_call_leaves_its_rollout_failed(
    make_gateway: Any, path: str, body: dict
) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]), record_keys=(RECORD_KEY,), max_n=1)
    bad = {**body, "temperature": -1}
    async with _client(gw) as c:
        r = await c.post(path, json=bad, headers=_h(RECORD_KEY))
    assert r.status_code == 400, r.text
    (rollout,) = gw.store.list_rollouts()
    assert rollout.status is RolloutStatus.FAILED and rollout.error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_a_record_mode_call_that_answers_leaves_its_rollout_succeeded(
    make_gateway: Any, path: str, body: dict, stream: bool
) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]), record_keys=(RECORD_KEY,))
    async with _client(gw) as c:
        r = await c.post(path, json={**body, "stream": stream}, headers=_h(RECORD_KEY))
    assert r.status_code == 200, r.text
    (rollout,) = gw.store.list_rollouts()
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.error is None


async def test_a_duplicate_rollout_id_past_the_precheck_is_a_409(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gw = make_gateway(NullEngine())
    gw.open_rollout({}, rollout_id="r-dup")
    monkeypatch.setattr(gw.store, "get_rollout", lambda rid: None)  # the race: the check passed
    async with _client(gw) as c:
        with caplog.at_level(logging.WARNING):
            r = await c.post(
                "/admin/rollouts", json={"task": {}, "rollout_id": "r-dup"}, headers=_h(ADMIN_KEY)
            )
    assert r.status_code == 409, r.text
    assert r.json()["error"]["type"] == "conflict_error" and "r-dup" in r.json()["error"]["message"]
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


async def test_a_record_the_store_refuses_is_a_400(
    make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]))
    opened = gw.open_rollout({}, rollout_id="r-inv")

    def refuse(call: Any) -> int:
        raise InvalidRecord("logprobs: 2 values for 1 completion token")

    monkeypatch.setattr(gw.store, "record_call", refuse)
    async with _client(gw) as c:
        r = await c.post("/rollouts/r-inv/v1/chat/completions", json=CHAT, headers=_h(opened.token))
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("end", ["finish", "fail", "cancel", "record"])
async def test_a_finished_rollouts_history_is_forgotten(make_gateway: Any, end: str) -> None:
    gw = make_gateway(NullEngine(token_ids=[40]), record_keys=(RECORD_KEY,))
    async with _client(gw) as c:
        if end == "record":
            r = await c.post("/v1/chat/completions", json=CHAT, headers=_h(RECORD_KEY))
        else:
            opened = gw.open_rollout({}, rollout_id="r-h")
            r = await c.post(
                "/rollouts/r-h/v1/chat/completions", json=CHAT, headers=_h(opened.token)
            )
        assert r.status_code == 200, r.text
    if end != "record":  # a record-mode rollout ends with its call
        assert len(gw.calls.history._entries) == 1
        status = {"finish": "succeeded", "fail": "failed", "cancel": "cancelled"}[end]
        gw.finish_rollout(AttemptEnd("r-h", opened.attempt, RolloutStatus(status)))
    assert len(gw.calls.history._entries) == 0


def test_a_replaced_config_reaches_both_services(make_gateway: Any) -> None:
    """A run replaces the config once its port is known: agents get that URL."""
    gw = make_gateway(NullEngine())
    gw.config = dataclasses.replace(gw.config, public_url="http://127.0.0.1:5555", max_context=64)
    assert gw.open_rollout({}).base_url.startswith("http://127.0.0.1:5555/rollouts/")
    assert gw.calls.max_context == 64


#: The store's reads of one rollout (its state, token or row).
ROLLOUT_READS = ("rollout_auth", "get_rollout", "token_in_use")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_call_looks_its_rollout_up_once(
    make_gateway: Any, store: Any, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Authorization, the rollout's sampling overrides and its derived seed come from one
    read of the store per call, also on an attempt's first call and after a retry."""
    gw = make_gateway(NullEngine(token_ids=[40, 41]))
    opened = gw.open_rollout({"q": 1}, rollout_id="r-1", sampling={"top_p": 0.5})
    reads: list[str] = []
    for name in ROLLOUT_READS:
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            reads.append(_name)
            return _real(*args)

        monkeypatch.setattr(store, name, counted)
    body = {**CHAT, "temperature": 1.0, "stream": stream}  # unseeded: the seed is derived
    async with _client(gw) as c:
        for _ in range(2):
            reads.clear()
            r = await c.post(f"/rollouts/{opened.rollout_id}/v1/chat/completions", json=body,
                             headers=_h(opened.token))  # fmt: skip
            assert r.status_code == 200, r.text
            assert reads == ["rollout_auth"]
        gw.finish_rollout(AttemptEnd(opened.rollout_id, opened.attempt, RolloutStatus.FAILED))
        again = gw.retry_rollout(opened.rollout_id, sampling={"top_p": 0.5})
        reads.clear()
        r = await c.post(f"/rollouts/{opened.rollout_id}/v1/chat/completions", json=body,
                         headers=_h(again.token))  # fmt: skip
        assert r.status_code == 200, r.text
        assert reads == ["rollout_auth"]


def test_a_restarted_gateway_derives_the_same_seeds(store: Any, tokenizer: Any) -> None:
    """Seeds derived from what the gateway kept when the attempt started equal those a
    gateway over the same store (after a restart) derives from the stored rollout."""
    from tether.gateway import Gateway, GatewayConfig

    def gateway() -> Any:
        return Gateway(NullEngine(), tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY), seed=7)

    first = gateway()
    o = first.open_rollout({}, rollout_id="r-1")
    later = gateway()
    seeds = [first.lifecycle.derived_seed("r-1", o.attempt) for _ in range(3)]
    assert [later.lifecycle.derived_seed("r-1", o.attempt) for _ in range(3)] == seeds
    assert len(set(seeds)) == 3


ROLLOUT_METHODS = [
    "open_rollout", "retry_rollout", "mark_running", "current_attempt", "finish_rollout",
    "record_reward", "authorize", "rollouts", "rollout",
]  # fmt: skip


def test_the_gateway_rollout_methods_are_its_own_and_keep_the_lifecycle_signatures(
    make_gateway: Any,
) -> None:
    gw = make_gateway(NullEngine())
    for name in [*ROLLOUT_METHODS, "admission_state"]:
        assert name not in vars(gw), f"{name} is copied onto the instance"
        assert callable(getattr(type(gw), name)), name
    for name in ROLLOUT_METHODS:
        mine, theirs = getattr(type(gw), name), getattr(type(gw.lifecycle), name)
        assert inspect.signature(mine) == inspect.signature(theirs), name
    opened = gw.open_rollout({}, rollout_id="r-own")
    assert gw.current_attempt("r-own") == opened.attempt == gw.authorize("r-own", opened.token)
    done = gw.finish_rollout(AttemptEnd("r-own", opened.attempt, RolloutStatus.FAILED))
    assert done.status is RolloutStatus.FAILED and gw.rollout("r-own")[0] == done
