"""Fuzzing (SECURITY.md, case 9).

1. schemathesis against the gateway's own OpenAPI schema, in-process (ASGI),
   valid and invalid inputs, with the bearer auth the schema declares: no
   5xx, responses conform to the schema, invalid input is refused, and the
   ``ignored_auth`` check re-sends requests without / with a wrong key to
   catch a route that does not enforce it.
2. hypothesis properties at the gateway boundary: any message text renders
   (200) or is refused (400); any completion token ids come back as content
   or tool calls, never as an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import load_all_checks
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi import checks
from starlette.testclient import TestClient

from tether.engine.testing import NullEngine
from tether.gateway import Gateway, GatewayConfig, create_app
from tether.records import RolloutStatus
from tether.store import Store

from .conftest import ADMIN_KEY

RECORD_KEY = "fuzz-record-key-0123"
EXAMPLES = 25  # per operation and mode: ~15 operations x 2 modes, well under a minute
QUIET = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


class Target:
    """A gateway with one running rollout for the fuzzer to aim at."""

    def __init__(self, tokenizer: Any, path: Path):
        self.store = Store(path)
        self.gw = Gateway(
            NullEngine(token_ids=[40, 41, 42]),
            tokenizer,
            self.store,
            GatewayConfig(
                admin_key=ADMIN_KEY,
                record_keys=(RECORD_KEY,),
                allow_agent_rewards=True,
                admission_timeout_s=0.05,
            ),
        )
        self.app = create_app(self.gw)
        self.n = 0
        self.fresh()

    def fresh(self) -> None:
        self.n += 1
        self.opened = self.gw.open_rollout({}, rollout_id=f"r-fuzz-{self.n}")

    def prepare(self, case: Any) -> dict[str, str]:
        """Aim the case at the running rollout (valid ids only) and pick its key."""
        self.gw.gate.resume()  # a fuzzed /admin/pause must not hold the next call
        auth = self.store.rollout_auth(self.opened.rollout_id)
        if auth is None or auth[0] is not RolloutStatus.RUNNING:
            self.fresh()
        if case.meta.is_negative_at(ParameterLocation.HEADER):
            return {}  # the case itself drops or mangles the Authorization header
        path = case.operation.path
        params = case.path_parameters or {}
        if "rollout_id" in params and case.meta.generation.mode is GenerationMode.POSITIVE:
            params["rollout_id"] = self.opened.rollout_id
        if path.startswith("/rollouts/"):
            key = self.opened.token
        elif path.startswith("/v1/"):
            key = RECORD_KEY
        else:
            key = ADMIN_KEY
        return {"Authorization": f"Bearer {key}"}


@pytest.mark.slow
def test_schemathesis_against_the_gateway_schema(tokenizer: Any, tmp_path: Path) -> None:
    target = Target(tokenizer, tmp_path / "fuzz.sqlite")
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", target.app, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    load_all_checks()
    # Schema-valid bodies may still exceed the configured caps (max_tokens, context):
    # a 400 there is correct, so "positive data must be accepted" does not apply.
    excluded = [checks.positive_data_acceptance]
    ran: dict[str, int] = {}
    failures: list[str] = []
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {op.path for op in operations} >= {
        "/rollouts/{rollout_id}/v1/chat/completions",
        "/admin/rollouts",
        "/healthz",
    }
    assert all(op.security or op.path == "/healthz" for op in operations)  # auth is declared
    for op in operations:
        modes = [GenerationMode.POSITIVE]
        if op.path != "/healthz":  # no parameters, headers or body to make invalid
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:

            @QUIET
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case: Any) -> None:
                headers = target.prepare(case)
                ran[case.operation.label] = ran.get(case.operation.label, 0) + 1
                case.call_and_validate(headers=headers, excluded_checks=excluded)

            try:
                run()
            except Exception as exc:  # collect every operation's first failure
                failures.append(f"{op.label} ({mode.value}): {str(exc)[:1500]}")
    total = sum(ran.values())
    print(f"schemathesis: {total} examples over {len(operations)} operations, "
          f"{len(failures)} failures")  # fmt: skip
    assert failures == []
    assert total >= 10 * len(operations)
    assert target.gw.engine.num_calls > 0  # valid calls did reach the engine


# -- properties at the gateway boundary -------------------------------------------------


@pytest.fixture(scope="module")
def boundary(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory):
    store = Store(tmp_path_factory.mktemp("prop") / "p.sqlite")
    engine = NullEngine(token_ids=[40])
    gw = Gateway(engine, tokenizer, store, GatewayConfig(admin_key=ADMIN_KEY))
    with TestClient(create_app(gw)) as client:
        yield gw, engine, client
    store.close()


PROPS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
ROLES = st.sampled_from(["system", "user", "assistant", "tool", "developer"])
MESSAGE = st.fixed_dictionaries(
    {"role": ROLES, "content": st.one_of(st.text(max_size=60), st.none())},
    optional={"tool_call_id": st.text(max_size=8), "name": st.text(max_size=8)},
)


@PROPS
@given(messages=st.lists(MESSAGE, min_size=1, max_size=5))
def test_any_messages_render_or_are_400(boundary: Any, messages: list[dict]) -> None:
    gw, engine, client = boundary
    opened = gw.open_rollout({})
    before = engine.num_calls
    r = client.post(
        f"/rollouts/{opened.rollout_id}/v1/chat/completions",
        json={"model": "policy", "messages": messages, "max_tokens": 2},
        headers={"Authorization": f"Bearer {opened.token}"},
    )
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert r.json()["error"]["message"] and engine.num_calls == before
        assert gw.store.calls(opened.rollout_id) == []


@PROPS
@given(data=st.data())
def test_any_completion_ids_come_back_as_content_or_tool_calls(boundary: Any, data: Any) -> None:
    gw, engine, client = boundary
    vocab = len(gw.tokenizer)
    engine.token_ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40))
    opened = gw.open_rollout({})
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    r = client.post(
        f"/rollouts/{opened.rollout_id}/v1/chat/completions",
        json={
            "model": "policy",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": tools,
            "max_tokens": 64,
        },
        headers={"Authorization": f"Bearer {opened.token}"},
    )
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] is not None or message.get("tool_calls")
    for call in message.get("tool_calls") or []:
        assert isinstance(json.loads(call["function"]["arguments"]), dict)
    (call,) = gw.store.calls(opened.rollout_id)
    assert call.completion_ids == [t for t in engine.token_ids][: len(call.completion_ids)]
