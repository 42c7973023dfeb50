"""The Messages API's refusals: unsupported or malformed bodies and bad keys are 4xx in
Anthropic's error shape (``{"type": "error", "error": {"type", "message"}}``), the
message names the field, and nothing is stored — through a rollout and record mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tether.engine.testing import ScriptedEngine

from .anthropic_live import ANSWER, GW, MODES, TOOL, Session
from .conftest import ADMIN_KEY
from .helpers import LiveGateway


@pytest.fixture
def live(tokenizer: Any, tmp_path: Path):
    lv = LiveGateway(
        ScriptedEngine([ANSWER], tokenizer=tokenizer, cycle=True),
        tokenizer,
        tmp_path / "x.db",
        **GW,
    )
    yield lv
    lv.stop()


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "x"}}],
                    }
                ]
            },
            "'image' blocks are not supported",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tools": [{**TOOL, "input_examples": []}]}, "tools[0].input_examples"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        ({"extra_body": {"top_k": 5}}, "top_k"),
        ({"extra_body": {"temperature": 1.5}}, "temperature"),
        ({"extra_body": {"mcp_servers": []}}, "unsupported field 'mcp_servers'"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "The"},
                ]
            },
            "prefill",
        ),
        ({"messages": []}, "messages: must not be empty"),
        ({"stop_sequences": ["a"] * 5}, "stop_sequences"),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_bad_requests_are_refused_in_anthropics_shape(
    live: LiveGateway, fields: dict, words: str, mode: str
) -> None:
    session = Session(live, "r-x", mode)
    client = session.sync
    kw = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(**{**kw, **fields})
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert words in body["error"]["message"], body
    assert session.calls() == []


MALFORMED = [
    {"messages": [{"role": "user", "content": [5]}]},
    {"messages": [{"role": "user", "content": 5}]},
    {"messages": [{"role": "user", "content": "hi", "output_config": 5}]},
    {
        "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": 5}]}
        ]
    },
    {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
    {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": 1}]},
            {"role": "user", "content": "x"},
        ]
    },
    {
        "messages": [
            {"role": "assistant", "content": [{"type": "thinking"}]},
            {"role": "user", "content": "x"},
        ]
    },
    {"messages": [{"role": "tool", "content": "x"}]},
    {"system": [5]},
    {"system": 5},
    {"tools": [{"name": "x"}]},
    {"tools": [{"name": "x", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool"}},
    {
        "tools": [{"name": "x", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "y"},
    },
    {"output_config": {"format": {"type": "json_schema", "schema": 5}}},
    {"thinking": {"type": "on"}},
    {"max_tokens": 0},
]


@pytest.mark.parametrize("fields", MALFORMED)
def test_malformed_bodies_are_400_not_500(live: LiveGateway, fields: dict) -> None:
    opened = live.gw.open_rollout(live.task, rollout_id="r-bad")
    body = {"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(
        f"{opened.anthropic_base_url}/v1/messages",
        json={**body, **fields},
        headers={"x-api-key": opened.token},
    )
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert live.store.calls("r-bad") == []


def test_missing_max_tokens_and_bad_keys(live: LiveGateway) -> None:
    opened = live.gw.open_rollout(live.task, rollout_id="r-auth")
    url = f"{opened.anthropic_base_url}/v1/messages"
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(url, json=body, headers={"x-api-key": opened.token})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    for headers in ({}, {"x-api-key": "wrong"}, {"x-api-key": ADMIN_KEY}):
        r = httpx.post(url, json={**body, "max_tokens": 8}, headers=headers)
        assert r.status_code in (401, 403) and r.json()["type"] == "error", r.text
    client = anthropic.Anthropic(base_url=opened.anthropic_base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="policy", max_tokens=8, messages=body["messages"])
    assert live.store.calls("r-auth") == []
    models = anthropic.Anthropic(
        base_url=opened.anthropic_base_url, api_key=opened.token, max_retries=0
    ).models.list()
    assert [m.id for m in models.data] == ["policy"] and models.data[0].type == "model"


def test_keys_sent_as_null_are_no_request(live: LiveGateway) -> None:
    """A client that serializes its block objects whole sends unset fields as null
    (``citations``, ``defer_loading``, ``caller``): accepted, as they ask for nothing."""
    client = Session(live, "r-null").sync
    message = client.messages.create(
        model="policy",
        max_tokens=8,
        tools=[{**TOOL, "defer_loading": None, "input_examples": None}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": None},
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "citations": None, "x": None}],
            }
        ],
    )
    assert message.content[0].text == ANSWER[: len(message.content[0].text)]
    (call,) = live.store.calls("r-null")
    assert call.request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ]
