"""The Anthropic Messages API (``POST /rollouts/{id}/v1/messages``) with the official SDK.

The ``anthropic`` client (sync and async), unchanged, against a gateway on 127.0.0.1
with a real SQLite store, through a rollout and through record mode: the starter model
where any output will do (and for forced tools, where only the grammar makes the output
a valid call), a scripted engine where the model must call a tool. Each call must be
recorded as the equivalent chat completion is: the stored prompt ids are the chat
template applied to what was sent, the stored completion ids decode to what the client
received, and a resent conversation extends the previous call's prompt + completion
token for token. Refusals: tests/test_anthropic_refusals.py; agents (the example's
training step, Claude Code, the Claude Agent SDK): tests/test_anthropic_agents.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tether.chat import render_prompt
from tether.engine import TransformersEngine
from tether.engine.testing import FaultyEngine, NullEngine, ScriptedEngine
from tether.records import CallStatus, RolloutStatus

from .anthropic_live import (
    ANSWER,
    CHAT_SENT,
    CHAT_TOOL,
    GW,
    MODES,
    ONE_CALL,
    QUESTION,
    RECORD_KEY,
    SYSTEM,
    TEXT_AND_CALL,
    TOOL,
    TWO_CALLS,
    Session,
    check_recorded,
    clients,
    text_of,
)
from .conftest import ADMIN_KEY
from .helpers import LiveGateway


@pytest.fixture(scope="module")
def starter(model: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory):
    engine = TransformersEngine(model, tokenizer, max_batch_size=4)
    # seeded: what the untrained model samples is the same every run (unseeded, the forced
    # calculator call broke its grammar's maxLength in about 1 run of 8: see the note)
    lv = LiveGateway(engine, tokenizer, tmp_path_factory.mktemp("anthropic") / "s.db", seed=0, **GW)
    yield lv
    lv.stop()


@pytest.fixture
def scripted(tokenizer: Any, tmp_path: Path):
    lives = []

    def make(*script: str) -> LiveGateway:
        engine = ScriptedEngine(list(script), tokenizer=tokenizer, cycle=True)
        lives.append(LiveGateway(engine, tokenizer, tmp_path / f"r{len(lives)}.db", **GW))
        return lives[-1]

    yield make
    for lv in lives:
        lv.stop()


# --- the anthropic client ------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_plain_message_sync_and_async(starter: LiveGateway, mode: str) -> None:
    session = Session(starter, f"r-plain-{mode}", mode)
    sync, async_ = session.sync, session.async_
    kw = {"model": "policy", "max_tokens": 16, "system": SYSTEM}
    first = sync.messages.create(messages=[{"role": "user", "content": QUESTION}], **kw)
    blocks = [{"type": "text", "text": QUESTION}]  # a list of text blocks: the same prompt
    second = asyncio.run(
        async_.messages.create(messages=[{"role": "user", "content": blocks}], **kw)
    )
    assert first.type == "message" and first.role == "assistant" and first.id.startswith("msg_")
    assert first.model == "policy" and [b.type for b in first.content] == ["text"]
    calls = session.calls()
    assert [c.seq for c in calls] == ([0, 1] if mode == "rollout" else [0, 0])
    for call, message in zip(calls, (first, second), strict=True):
        check_recorded(starter, call, message, CHAT_SENT, None)
        assert call.request["params"]["max_completion_tokens"] == 16


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("script", [ONE_CALL, TEXT_AND_CALL, TWO_CALLS])
def test_tool_result_round_trip_extends_the_previous_call(
    scripted, tokenizer: Any, script: str, mode: str
) -> None:
    """tool_use → tool_result → answer: call 2's stored prompt extends call 1's prompt +
    completion token for token, and is what a chat client sending the same
    conversation gets (the same template, the same recorded call)."""
    live = scripted(script, ANSWER)
    session = Session(live, "r-tools", mode)
    client = session.sync
    kw = {"model": "policy", "max_tokens": 128, "system": SYSTEM, "tools": [TOOL]}
    first = client.messages.create(messages=[{"role": "user", "content": QUESTION}], **kw)
    uses = [b for b in first.content if b.type == "tool_use"]
    (stored1,) = session.calls()
    ids = [c["id"] for c in stored1.response["tool_calls"]]
    assert [u.id for u in uses] == ids and first.stop_reason == "tool_use"
    assert uses[0].name == "calculator" and uses[0].input == {"expression": "12 + 30"}
    assert text_of(first) == ("Let me use the calculator." if script == TEXT_AND_CALL else "")
    check_recorded(live, stored1, first, CHAT_SENT, [CHAT_TOOL])

    results = [
        {"type": "tool_result", "tool_use_id": u.id, "content": [{"type": "text", "text": "42"}]}
        for u in uses
    ]
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": results},
    ]
    second = client.messages.create(messages=history, **kw)
    assert text_of(second) == ANSWER and second.stop_reason == "end_turn"
    stored1, stored2 = session.calls()
    n = len(stored1.prompt_ids) + len(stored1.completion_ids)
    assert stored2.prompt_ids[:n] == stored1.prompt_ids + stored1.completion_ids
    chat = [*CHAT_SENT, stored1.response]
    chat += [{"role": "tool", "tool_call_id": i, "content": "42"} for i in ids]
    assert stored2.prompt_ids == render_prompt(tokenizer, chat, [CHAT_TOOL])
    assert stored2.request["tools"] == [CHAT_TOOL]


def test_is_error_and_thinking_blocks_are_kept(scripted, tokenizer: Any) -> None:
    live = scripted(ANSWER)
    client, _ = clients(live, "r-blocks")
    assistant = [
        {"type": "thinking", "thinking": "I should compute.", "signature": "sig"},
        {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "1/0"}},
    ]
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": "division by zero",
        "is_error": True,
    }
    client.messages.create(
        model="policy",
        max_tokens=32,
        tools=[TOOL],
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "system", "content": "Use the tool."},  # mid-conversation (Claude Code)
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": [result, {"type": "text", "text": "Try again."}]},
        ],
    )
    (call,) = live.store.calls("r-blocks")
    sent = call.request["messages"]
    assert sent[1] == {"role": "system", "content": "Use the tool."}
    assert sent[2]["reasoning_content"] == "I should compute." and sent[2]["content"] is None
    assert sent[3] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "division by zero",
        "is_error": True,
    }
    assert sent[4] == {"role": "user", "content": [{"type": "text", "text": "Try again."}]}
    assert "<tool_response>\ndivision by zero\n</tool_response>" in tokenizer.decode(
        call.prompt_ids
    )


# The most tokens a forced call can take: the byte-level starter tokenizer spends up to
# 6 tokens on one character of the 24 the calculator's string holds (a \\uXXXX escape),
# and the frame around the string takes about 20. Record mode draws an unseeded rollout
# id, so its sample differs every run: a bound of 96 ran out in CI once (the call cut off,
# stop_reason "max_tokens"), though the grammar was kept.
CALL_BOUND = 24 * 6 + 64


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "calculator"}])
def test_forced_tool_is_a_valid_call(starter: LiveGateway, choice: dict, mode: str) -> None:
    """``tool_choice`` any / tool: the untrained starter model's output is a call whose
    input follows ``input_schema`` only because the grammar makes it so."""
    session = Session(starter, f"r-force-{choice['type']}-{mode}", mode)
    client = session.sync
    lookup = {
        "name": "lookup",
        "input_schema": {
            "type": "object",
            "properties": {"fruit": {"enum": ["apple", "pear"]}},
            "required": ["fruit"],
        },
    }
    message = client.messages.create(
        model="policy",
        max_tokens=CALL_BOUND,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[TOOL, lookup],
        tool_choice=choice,
    )
    assert message.stop_reason == "tool_use", message.content
    (use,) = [b for b in message.content if b.type == "tool_use"]
    if choice["type"] == "tool" or use.name == "calculator":
        assert use.name == "calculator" and isinstance(use.input["expression"], str)
        assert len(use.input["expression"]) <= 24
    else:
        assert use.input["fruit"] in ("apple", "pear")
    (call,) = session.calls()
    label = "required" if choice["type"] == "any" else "calculator"
    assert call.constraint == f"tool_choice:{label}"
    assert call.response["tool_calls"][0]["id"] == use.id


@pytest.mark.parametrize("mode", MODES)
def test_stream_follows_the_event_sequence(scripted, mode: str) -> None:
    """``stream: true``: Anthropic's events in order; the SDK's accumulated message is
    the recorded call, and the tool call's input arrives as input_json_delta."""
    live = scripted(TEXT_AND_CALL, ANSWER)
    session = Session(live, "r-sse", mode)
    client, async_ = session.sync, session.async_
    kw = {"model": "policy", "max_tokens": 128, "tools": [TOOL]}
    events = list(
        client.messages.create(messages=[{"role": "user", "content": QUESTION}], stream=True, **kw)
    )
    kinds = [e.type for e in events]  # the SDK drops the ping (test_record_mode: it is sent)
    text = kinds.count("content_block_delta") - 1  # one input_json_delta
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * text,
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert text >= 2  # token by token
    assert events[0].message.usage.input_tokens > 0
    assert events[-2].delta.stop_reason == "tool_use"
    (call,) = session.calls()
    streamed = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert streamed == call.response["content"] == "Let me use the calculator."
    (head,) = [e.content_block for e in events if e.type == "content_block_start" and e.index == 1]
    assert head.id == call.response["tool_calls"][0]["id"] and head.name == "calculator"
    assert events[-2].usage.output_tokens == len(call.completion_ids)

    async def helper() -> Any:
        history = [{"role": "user", "content": QUESTION}]
        async with async_.messages.stream(messages=history, **kw) as stream:
            pieces = [t async for t in stream.text_stream]
            return pieces, await stream.get_final_message()

    pieces, final = asyncio.run(helper())
    assert "".join(pieces) == final.content[0].text == ANSWER and len(pieces) >= 2
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(session.calls()[1].completion_ids)


def test_stream_cut_by_max_tokens_and_stop_sequences(scripted, starter: LiveGateway) -> None:
    client, _ = clients(starter, "r-cut")
    with client.messages.stream(
        model="policy", max_tokens=4, messages=[{"role": "user", "content": QUESTION}]
    ) as stream:
        final = stream.get_final_message()
    (call,) = starter.store.calls("r-cut")
    check_recorded(starter, call, final, [{"role": "user", "content": QUESTION}], None)

    client, _ = clients(scripted(ANSWER), "r-stop")
    message = client.messages.create(
        model="policy",
        max_tokens=32,
        stop_sequences=["never", "is 4"],
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "is 4"
    assert text_of(message) == "The answer "


def test_a_client_that_leaves_cancels_the_call(starter: LiveGateway) -> None:
    """The stream is the engine's token stream: a client that hangs up mid-answer stops the
    generation, and the call is recorded as cancelled (never a training sample)."""
    opened = starter.gw.open_rollout(starter.task, rollout_id="r-gone")
    body = {"model": "policy", "max_tokens": 1500, "temperature": 0, "stream": True}
    body["messages"] = [{"role": "user", "content": QUESTION}]
    headers = {"x-api-key": opened.token}
    url = f"{opened.anthropic_base_url}/v1/messages"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(12)]  # message_start, ping, a block, deltas: hang up
    assert "event: content_block_delta" in got
    deadline = time.monotonic() + 30
    while not starter.store.calls("r-gone") and time.monotonic() < deadline:
        time.sleep(0.05)
    (call,) = starter.store.calls("r-gone")
    assert call.status is CallStatus.CANCELLED and 0 < len(call.completion_ids) < 1500


def test_an_engine_fault_mid_stream_is_an_error_event(tokenizer: Any, tmp_path: Path) -> None:
    ids = tokenizer.encode("The answer is forty two, I think.", add_special_tokens=False)
    live = LiveGateway(FaultyEngine(NullEngine(ids), fault="break"), tokenizer, tmp_path / "b.db")
    try:
        client, _ = clients(live, "r-broken")
        with pytest.raises(anthropic.APIStatusError) as err:
            list(
                client.messages.create(
                    model="policy",
                    max_tokens=64,
                    stream=True,
                    messages=[{"role": "user", "content": "hi"}],
                )
            )
        assert (
            err.value.body["type"] == "error"
            and "injected fault" in err.value.body["error"]["message"]
        )
        (call,) = live.store.calls("r-broken")
        assert call.status is CallStatus.FAILED
    finally:
        live.stop()


def test_the_call_is_committed_before_the_stream_says_it_ended(scripted) -> None:
    """A client that reads up to ``message_delta`` (the stop reason) and stops there finds
    its call already in the store."""
    live = scripted(ONE_CALL)
    opened = live.gw.open_rollout(live.task, rollout_id="r-commit")
    body = {"model": "policy", "max_tokens": 64, "stream": True, "tools": [TOOL]}
    body["messages"] = [{"role": "user", "content": QUESTION}]
    url = f"{opened.anthropic_base_url}/v1/messages"
    with httpx.stream("POST", url, json=body, headers={"x-api-key": opened.token}) as r:
        for line in r.iter_lines():
            if line == "event: message_delta":
                stored = live.store.calls("r-commit")
                break
    (call,) = stored
    assert call.finish_reason == "tool_calls" and len(call.completion_ids) > 0


@pytest.mark.parametrize("mode", MODES)
def test_count_tokens_is_the_prompt_of_the_call(scripted, mode: str) -> None:
    live = scripted(ONE_CALL)
    session = Session(live, "r-count", mode)
    client, async_ = session.sync, session.async_
    kw = {"model": "policy", "system": SYSTEM, "tools": [TOOL]}
    messages = [{"role": "user", "content": QUESTION}]
    counted = client.messages.count_tokens(messages=messages, **kw)
    again = asyncio.run(async_.messages.count_tokens(messages=messages, **kw))
    assert session.calls() == []  # counting records nothing (and opens no rollout)
    message = client.messages.create(messages=messages, max_tokens=64, **kw)
    (call,) = session.calls()
    assert counted.input_tokens == again.input_tokens == len(call.prompt_ids)
    assert message.usage.input_tokens == counted.input_tokens


def test_max_tokens_is_an_upper_bound(scripted) -> None:
    """Anthropic requires max_tokens and clients send large ones (Claude Code: 32000):
    above the gateway's cap it is lowered, not refused."""
    live = scripted(ANSWER)
    client, _ = clients(live, "r-big")
    messages = [{"role": "user", "content": QUESTION}]
    with client.messages.stream(model="policy", max_tokens=32_000, messages=messages) as stream:
        message = stream.get_final_message()
    assert text_of(message) == ANSWER
    (call,) = live.store.calls("r-big")
    assert call.request["anthropic"]["max_tokens"] == 32_000 > live.gw.config.max_tokens


def test_admin_create_returns_the_anthropic_base_url(scripted) -> None:
    live = scripted(ANSWER)
    r = httpx.post(
        f"{live.server.url}/admin/rollouts",
        json={"task": {"question": QUESTION}, "rollout_id": "r-admin"},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )
    opened = r.json()
    assert opened["anthropic_base_url"] == f"{live.server.url}/rollouts/r-admin"
    client = anthropic.Anthropic(
        base_url=opened["anthropic_base_url"], api_key=opened["token"], max_retries=0
    )
    message = client.messages.create(
        model="policy", max_tokens=8, messages=[{"role": "user", "content": QUESTION}]
    )
    assert text_of(message) == "The answer is 42."[: len(text_of(message))]
    assert len(live.store.calls("r-admin")) == 1


def test_record_mode(scripted) -> None:
    live = scripted(ONE_CALL, ANSWER)
    sync = anthropic.Anthropic(base_url=live.server.url, api_key=RECORD_KEY, max_retries=0)
    async_ = anthropic.AsyncAnthropic(
        base_url=live.server.url, auth_token=RECORD_KEY, max_retries=0
    )
    kw = {"model": "policy", "max_tokens": 64, "tools": [TOOL]}
    messages = [{"role": "user", "content": QUESTION}]
    first = sync.messages.create(messages=messages, **kw)
    assert first.content[0].type == "tool_use"

    async def streamed() -> Any:
        async with async_.messages.stream(messages=messages, **kw) as stream:
            return await stream.get_final_message()

    second = asyncio.run(streamed())
    assert text_of(second) == ANSWER
    assert (
        sync.messages.count_tokens(
            messages=messages, **{k: kw[k] for k in ("model", "tools")}
        ).input_tokens
        > 0
    )
    rollouts = live.store.list_rollouts()
    assert len(rollouts) == 2 and {r.status for r in rollouts} == {RolloutStatus.SUCCEEDED}
    calls = [c for r in rollouts for c in live.store.calls(r.id)]
    assert sorted(c.request["anthropic"]["id"] for c in calls) == sorted([first.id, second.id])
    assert all(len(c.completion_ids) == len(c.logprobs) > 0 for c in calls)
    # streamed: the rollout is finished before the agent sees message_stop
    finish = live.gw.finish_rollout

    def slow_finish(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return finish(*args, **kwargs)

    live.gw.finish_rollout = slow_finish
    body = {**kw, "messages": messages, "stream": True}
    with httpx.stream(
        "POST", f"{live.server.url}/v1/messages", json=body, headers={"x-api-key": RECORD_KEY}
    ) as r:
        sent = []
        for line in r.iter_lines():
            if line.startswith("event: "):
                sent.append(line.removeprefix("event: "))
            if line == "event: message_stop":
                break
        ended = [x.status for x in live.store.list_rollouts() if x not in rollouts]
    assert RolloutStatus.SUCCEEDED in ended
    assert sent[:3] == ["message_start", "ping", "content_block_start"]
    assert sent[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    bad = anthropic.Anthropic(base_url=live.server.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        bad.messages.create(messages=messages, **kw)
    assert "record" in err.value.body["error"]["message"]
